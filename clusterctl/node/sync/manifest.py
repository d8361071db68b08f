"""The sync manifest, the one wire format both sides speak: JSON Lines, a header {"v": 2, "source": ...}
then one compact entry a line (ManifestEntry writes its keys down), read a line at a time (1.28M entries never
become one document). The operator builds and reads it with these same functions; every path is checked as
it is read (path_problem): a manifest with an absolute, '.' or '..' path is refused (exit 3) at that line."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import zlib
from typing import Any, Dict, Iterable, Iterator, NamedTuple

STATE_DIR = ".clusterctl-sync"  # in DST: manifest.jsonl and the COMPLETE marker
SAVED = "manifest.jsonl"  # in STATE_DIR: the manifest the copy was last checked against
OLD_SAVED = "manifest.json"  # what versions before JSON Lines kept there (removed when seen)
MANIFEST_VERSION = 2  # the header's "v"; 1 was the one JSON document {"entries": [...]}
PARTIAL_DIR = ".clusterctl-partial"  # per directory: rsync's and the S3 pull's partial files
MARKER = "COMPLETE"
CHUNK = 1 << 20
EXIT_INPUT = 3
EXIT_FAILED = 1

# typing's Dict, not dict[...]: these are values at run time, and a node's system python3 may predate 3.9
Wire = Dict[str, Any]  # a JSON object as it crosses the wire: a manifest line, a subcommand's result
Args = Dict[str, Any]  # a subcommand's arguments, as main.parse gives them


class AgentError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED, hint: str = ""):
        super().__init__(message)
        self.code = code
        self.hint = hint  # what to do, for a refusal the operator shows as one line


class ManifestEntry(NamedTuple):
    """One manifest entry, typed: what the operator reads. On the wire (manifest.jsonl, the manifest cache,
    the agent's output) an entry stays a compact dict, as 1.28M of them must stay small; its keys:

        "p"  path       relative, '/'-separated
        "t"  kind       "f" a regular file, "d" a directory, "l" a symlink
        "s"  size       bytes (files only)
        "h"  sha256     hex digest of the content (absent for an S3 object until a node records it)
        "l"  link       a symlink's target
        "etag"          S3's ETag (s3list)
        "sha256b64"     S3's ChecksumSHA256, base64 (s3list, when the object has one)

    An absent key is None here, so from_wire and to_wire give back the same dict, key order included."""

    path: str
    kind: str  # "f" | "d" | "l"
    size: int | None = None
    sha256: str | None = None
    link: str | None = None
    etag: str | None = None
    sha256b64: str | None = None

    @classmethod
    def from_wire(cls, e: Wire) -> ManifestEntry:
        return cls(e["p"], e["t"], e.get("s"), e.get("h"), e.get("l"), e.get("etag"), e.get("sha256b64"))

    def to_wire(self) -> Wire:
        wire: Wire = {"p": self.path, "t": self.kind}
        # the order scan and s3list write them in ("h" last: the S3 round adds it to a listed object)
        for key, value in (("l", self.link), ("s", self.size), ("etag", self.etag), ("sha256b64", self.sha256b64)):
            if value is not None:
                wire[key] = value
        if self.sha256 is not None:
            wire["h"] = self.sha256
        return wire

    def line(self) -> bytes:
        """manifest_line(self.to_wire()), the same bytes; a plain file's or folder's without building the
        dict and json.dumps (0.43 s of 200,000 lines' 0.5 s: the encoding json.dumps itself uses, in C)."""
        if self.link is None and self.etag is None and self.sha256b64 is None:
            if self.kind == "f" and type(self.size) is int and self.sha256 is not None:
                return b'{"p":%s,"t":"f","s":%d,"h":%s}\n' % (_quote(self.path), self.size, _quote(self.sha256))
            if self.kind == "d" and self.size is None and self.sha256 is None:
                return b'{"p":%s,"t":"d"}\n' % _quote(self.path)
        return manifest_line(self.to_wire())

    @property
    def is_file(self) -> bool:
        return self.kind == "f"

    @property
    def nbytes(self) -> int:  # 0 for a directory or a symlink
        return self.size or 0


# Any of path_problem's findings (an empty, '.', '..' or partial-dir component, a NUL, the state folder first):
# one search per entry when a manifest of 1.28M entries is read; the message is then path_problem's.
_SUSPECT = re.compile(
    r"(?:^|/)(?:|\.|\.\.|" + re.escape(PARTIAL_DIR) + r")(?:/|$)|\0|^" + re.escape(STATE_DIR) + r"(?:/|$)"
)


def path_problem(p: str) -> str | None:
    if not p or p.startswith("/") or "\0" in p:
        return f"bad path {p!r}"
    parts = p.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"path {p!r} has an empty, '.' or '..' component"
    if parts[0] == STATE_DIR or PARTIAL_DIR in parts:
        return f"path {p!r} is reserved for clusterctl"
    return None


def _quote(text: str) -> bytes:
    return json.encoder.encode_basestring_ascii(text).encode()  # json.dumps(text, ensure_ascii=True)


def manifest_line(e: Wire) -> bytes:
    """One JSON line (a header or an entry). ASCII only: a newline in a name is written \\n, and a name's
    undecodable bytes (surrogateescape'd by os.fsdecode) are written \\udcXX, read back by json's
    surrogatepass: paths round-trip whatever bytes they hold."""
    return (json.dumps(e, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


def manifest_header(source: str) -> bytes:
    return manifest_line({"v": MANIFEST_VERSION, "source": source})


def open_manifest(path: str) -> gzip.GzipFile | io.BufferedReader:
    """A manifest file's JSON Lines: the operator sends them gzipped (.gz: 24 MB of 200,000 lines is 9 MB)."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


NOT_GZIP = (EOFError, gzip.BadGzipFile, zlib.error)  # a manifest cut short or damaged on the way


def not_gzip(exc: Exception) -> AgentError:
    return AgentError(f"manifest refused: not a whole gzip stream ({exc})", EXIT_INPUT)


def manifest_version(first: bytes) -> Wire:
    """A manifest's first line, its header; AgentError (exit 3) when it is not one of this version's."""
    try:
        header = json.loads(first)
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("v") != MANIFEST_VERSION:
        raise AgentError(f"manifest refused: not a version {MANIFEST_VERSION} manifest", EXIT_INPUT)
    return header


class ManifestReader:
    """A manifest file read one line at a time: iterating yields its entries (wire dicts), every path
    checked as it comes (AgentError, exit 3, at the first bad one). Once read through, .digest is the
    sha256 of the file's bytes, computed on the way. A manifest of an older version is refused."""

    def __init__(self, path: str):
        self.path = path
        self.header: Wire = {}
        self.digest = ""

    def __iter__(self) -> Iterator[Wire]:
        try:
            yield from self._entries()
        except NOT_GZIP as exc:
            raise not_gzip(exc) from None

    def _entries(self) -> Iterator[Wire]:
        h = hashlib.sha256()
        with open_manifest(self.path) as f:
            first = f.readline()
            h.update(first)
            self.header = manifest_version(first)
            for n, line in enumerate(f, 2):
                h.update(line)
                try:  # str, not bytes: json.loads(bytes) guesses the encoding of every line first
                    e = json.loads(line.decode("ascii"))
                    p = e["p"]
                    problem = path_problem(p) if _SUSPECT.search(p) else None
                except (ValueError, KeyError, TypeError, AttributeError):
                    problem = f"line {n} is not a manifest entry"
                if problem:
                    raise AgentError(f"manifest refused: {problem}", EXIT_INPUT)
                yield e
        self.digest = h.hexdigest()


def temp_beside(path: str) -> str:
    """A new file's name next to path, for an atomic write: the pid alone is not enough, as nodes that share
    a file system (NFS, EFS; local nodes' /) run in PID namespaces of their own and can have the same pid."""
    return f"{path}.tmp{os.getpid()}.{os.urandom(6).hex()}"


def write_lines(path: str, first: Wire, rows: Iterable[Wire]) -> None:
    """first, then every row, as JSON lines into path (atomically, as atomic_write): no whole document."""
    tmp = temp_beside(path)
    with open(tmp, "wb") as f:
        f.write(manifest_line(first))
        for e in rows:
            f.write(manifest_line(e))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_write(path: str, data: bytes) -> None:
    tmp = temp_beside(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
