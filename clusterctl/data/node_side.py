"""The node side of `clusterctl sync`: one standalone script (standard library; boto3 only for S3).

clusterctl uploads this file to every node it syncs (and to the source, when the source is the
leader) and runs it there with arguments it quotes itself. It never receives credentials: S3 pulls
use the node's own (instance profile, or ~/.aws config). Sub-commands print one JSON object:

    manifest ROOT [--cache C]           the source's manifest (relative path, type, size, sha256); with
                                        --cache, a file whose size, mtime, ctime and inode are those of
                                        the last run keeps its sha256 (not read again)
    check --dst DST --manifest M [...]  verify DST against M; --reset removes the completion marker
                                        first; --delete removes what M does not list; --mark writes
                                        the marker, last, when everything matched; --received H takes
                                        a file whose sha256 as written (recv) matches M, and whose size
                                        and mtime are still tar's, as proved without reading it back;
                                        with --stream-digest D too, a DST that was empty and whose stream
                                        had D as its digest (recv) is whole without a lookup (below)
    fresh --dst DST                     whether DST holds nothing yet (then its marker goes; see cmd_fresh)
    check and fresh first resolve DST on the node (realpath) and refuse it (exit 2, nothing touched): a
                                        system folder, the home, clusterctl's own folders; with --src S
                                        --src-id DEV:INO --src-boot B (the source folder resolved where
                                        it is), a DST that holds SRC, lies inside it, or is SRC unless
                                        --src-may-be-dst (then only checked: no data written or deleted)
    recv --hashes H                     stdin to stdout (into tar -x) unchanged, hashing every tar
                                        member's bytes on the way: H gets a first line {stream, files,
                                        bytes}, then {path: [sha256, size, mtime]}
    relay --out FIFO [--index I]        stdin to stdout and FIFO at once (the chain's zero-copy tee)
    probe --hop SSH --remote CMD [--seconds S] -- ADDRESS...   the fan-out probe (sync --fanout auto):
                                        a stream of throwaway bytes to every ADDRESS at once, through
                                        the chain's own ssh (SSH: its argv as JSON) into CMD there (sink),
                                        for S seconds; each stream's bytes and seconds as the sink saw them
    sink                                the probe's receiver: "ready", then stdin read and thrown away,
                                        then {bytes, seconds} from its first read to its last
    s3list BUCKET PREFIX                a manifest made from the bucket's listing (size, ETag/SHA256)
    s3pull --dst DST --manifest M --bucket B --prefix P --only LIST [--record]   pull the listed objects,
                                        each checked against S3's checksum (MD5 ETag, ChecksumSHA256) or
                                        the sha256 in M; where S3 gives nothing checkable (SSE-KMS, a
                                        multipart ETag of unknown part size) --record takes the object as
                                        pulled and returns its streamed sha256 ("recorded"), else it fails

A manifest is JSON Lines (read one line at a time: 1.28M entries never become one document): a header
{"v": 2, "source": ...}, then one entry per line, a compact dict whose one-letter keys ManifestEntry
documents (the one place they are written down); its digest is the sha256 of the file's bytes. Paths
are relative, '/'-separated, never absolute, never with '.' or '..' components: a manifest that has one
is refused (exit 3) at that line, before anything is deleted. manifest and s3list write the same lines
into --out after a first line with their other results and "lines": the number of entries.

The stream's digest (stream_digest, recv) is the sha256 of one record per tar member, in stream order:
kind, path, then a file's size and sha256 or a link's target, every field NUL-ended (no path holds a
NUL: one way to read any record). The operator makes it from the manifest's entries in the order it
streamed them; when recv's is the same, the stream carried exactly the manifest, and tar, which exited 0,
wrote it all into a DST that held nothing: the copy is proved without reading the manifest on the node
or looking up 200,000 files. Any difference falls back to the entry-by-entry check.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, NamedTuple

STATE_DIR = ".clusterctl-sync"  # in DST: manifest.jsonl and the COMPLETE marker
SAVED = "manifest.jsonl"  # in STATE_DIR: the manifest the copy was last checked against
OLD_SAVED = "manifest.json"  # what versions before JSON Lines kept there (removed when seen)
MANIFEST_VERSION = 2  # the header's "v"; 1 was the one JSON document {"entries": [...]}
PARTIAL_DIR = ".clusterctl-partial"  # per directory: rsync's and the S3 pull's partial files
MARKER = "COMPLETE"
CHUNK = 1 << 20
EXIT_INPUT = 3
EXIT_FAILED = 1


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
    def from_wire(cls, e: dict) -> ManifestEntry:
        return cls(e["p"], e["t"], e.get("s"), e.get("h"), e.get("l"), e.get("etag"), e.get("sha256b64"))

    def to_wire(self) -> dict:
        wire: dict = {"p": self.path, "t": self.kind}
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


def manifest_line(e: dict) -> bytes:
    """One JSON line (a header or an entry). ASCII only: a newline in a name is written \\n, and a name's
    undecodable bytes (surrogateescape'd by os.fsdecode) are written \\udcXX, read back by json's
    surrogatepass: paths round-trip whatever bytes they hold."""
    return (json.dumps(e, ensure_ascii=True, separators=(",", ":")) + "\n").encode()


def manifest_header(source: str) -> bytes:
    return manifest_line({"v": MANIFEST_VERSION, "source": source})


def open_manifest(path: str):
    """A manifest file's JSON Lines: the operator sends them gzipped (.gz: 24 MB of 200,000 lines is 9 MB)."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


NOT_GZIP = (EOFError, gzip.BadGzipFile, zlib.error)  # a manifest cut short or damaged on the way


def not_gzip(exc: Exception) -> AgentError:
    return AgentError(f"manifest refused: not a whole gzip stream ({exc})", EXIT_INPUT)


def manifest_version(first: bytes) -> dict:
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
        self.header: dict = {}
        self.digest = ""

    def __iter__(self):
        try:
            yield from self._entries()
        except NOT_GZIP as exc:
            raise not_gzip(exc) from None

    def _entries(self):
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


def write_lines(path: str, first: dict, rows) -> None:
    """first, then every row, as JSON lines into path (atomically, as atomic_write): no whole document."""
    tmp = temp_beside(path)
    with open(tmp, "wb") as f:
        f.write(manifest_line(first))
        for e in rows:
            f.write(manifest_line(e))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# ---- making a manifest ------------------------------------------------------------------------------
def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


POOL_FROM = 1 << 20  # files this big are hashed in a thread pool; smaller ones in the calling thread


def map_by_size(fn, entries: list[dict], workers: int) -> list:
    """[fn(e) for e in entries], the big files' calls spread over `workers` threads (hashlib lets go of the
    GIL on big updates). A small file's hand-off to a pool costs more than hashing it under the GIL's
    contention: 200,000 files of 4 kB took 14 s in a pool of 2 and 2.4 s in one thread."""
    out: list = [None] * len(entries)
    big = [i for i, e in enumerate(entries) if e.get("s", 0) >= POOL_FROM]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [(i, pool.submit(fn, entries[i])) for i in big]
        taken = set(big)
        for i, e in enumerate(entries):  # the small ones meanwhile, here
            if i not in taken:
                out[i] = fn(e)
        for i, f in futures:
            out[i] = f.result()
    return out


def scan(root: str, workers: int = 4) -> list[dict]:
    """Every directory, regular file and symlink under root (symlinks not followed), sorted by path."""
    return scan_reusing(root, {}, workers)[0]


def _stat_key(st: os.stat_result) -> str:
    # ctime cannot be set back by anyone: a write or chmod since the last run changes it whatever mtime says
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {st.st_dev}"


def scan_reusing(root: str, known: dict[str, str], workers: int = 4) -> tuple[list[dict], dict[str, str], int]:
    """scan(), where a file whose stat key (size, mtime, ctime, inode, device) is the one in `known`
    (path -> "KEY SHA256", from the last run) keeps that sha256 unread. (entries, the new known, files hashed)."""
    entries, keys = walk(root)
    todo = reuse_known(entries, keys, known)
    hash_files(root, todo, workers)
    return entries, known_after(entries, keys), len(todo)


def walk(root: str) -> tuple[list[dict], dict[str, str]]:
    """root listed, nothing read: (every entry sorted by path, files without their sha256 yet; every
    file's stat key, taken before its bytes are read, so a file changed meanwhile is hashed again next time)."""
    entries: list[dict] = []
    keys: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        if rel == "":
            dirnames[:] = [d for d in dirnames if d != STATE_DIR]
        dirnames[:] = [d for d in dirnames if d != PARTIAL_DIR]
        for name in list(dirnames):
            p = f"{rel}/{name}" if rel else name
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                entries.append({"p": p, "t": "l", "l": os.readlink(full)})
                dirnames.remove(name)
            else:
                entries.append({"p": p, "t": "d"})
        for name in filenames:
            p = f"{rel}/{name}" if rel else name
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                entries.append({"p": p, "t": "l", "l": os.readlink(full)})
            elif stat.S_ISREG(st.st_mode):
                entries.append({"p": p, "t": "f", "s": st.st_size})
                keys[p] = _stat_key(st)
            # sockets, fifos and devices are not data: left out
    entries.sort(key=lambda e: e["p"].split("/"))
    return entries, keys


def reuse_known(entries: list[dict], keys: dict[str, str], known: dict[str, str]) -> list[dict]:
    """A file entry whose stat key is the one in `known` (path -> "KEY SHA256", the last run's) gets that
    sha256, in place; the file entries still to hash (the same dicts) are returned."""
    todo = []
    for e in entries:
        if e["t"] == "f":
            old = known.get(e["p"])
            if old and old[:-65] == keys[e["p"]]:  # "KEY" " " 64 hex digits
                e["h"] = old[-64:]
            else:
                todo.append(e)
    return todo


def hash_files(root: str, todo: list[dict], workers: int) -> None:
    """Every entry of todo gets its file's sha256 ("h"), in place."""
    for e, h in zip(todo, map_by_size(lambda e: sha256_file(os.path.join(root, e["p"])), todo, workers)):
        e["h"] = h


def known_after(entries: list[dict], keys: dict[str, str]) -> dict[str, str]:
    """The cache for the next run: path -> "STAT-KEY SHA256", every file of a hashed listing."""
    return {e["p"]: f"{keys[e['p']]} {e['h']}" for e in entries if e["t"] == "f"}


# One string per file, not a list: json.loads of 200,000 of them takes 0.06 s, of lists 0.5 s (in one C
# call that holds the GIL while the main thread starts the sync). Version 1's lists are not read.
SCAN_CACHE_VERSION = 2


def load_scan_cache(path: str, root: str) -> dict[str, str]:
    """The last run's {path: "STAT-KEY SHA256"} of root, or {} when missing, for another root or version, or
    not the file it was: its first line is the sha256 of the rest (checked on the bytes, before parsing)."""
    try:
        with open(path, "rb") as f:
            seal, _, body = f.read().partition(b"\n")
        if hashlib.sha256(body).hexdigest().encode() != seal:
            return {}
        data = json.loads(body.decode("utf-8", "surrogatepass"))
        ours = data.get("v") == SCAN_CACHE_VERSION and data.get("root") == root
        return data["files"] if ours and isinstance(data["files"], dict) else {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def save_scan_cache(path: str, root: str, known: dict[str, str]) -> None:
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    body = json.dumps({"v": SCAN_CACHE_VERSION, "root": root, "files": known}, ensure_ascii=True).encode()
    atomic_write(path, hashlib.sha256(body).hexdigest().encode() + b"\n" + body)


# ---- checking a copy --------------------------------------------------------------------------------
def _md5_file(path: str) -> str:
    h = hashlib.md5()
    with open(path, "rb", buffering=0) as f:
        while b := f.read(CHUNK):
            h.update(b)
    return h.hexdigest()


def _multipart_etag(path: str, part: int) -> str:
    digests = []
    with open(path, "rb", buffering=0) as f:
        while True:
            h, left = hashlib.md5(), part
            while left:
                b = f.read(min(CHUNK, left))
                if not b:
                    break
                h.update(b)
                left -= len(b)
            if left == part:
                break
            digests.append(h.digest())
            if left:
                break
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


def etag_matches(path: str, etag: str, size: int) -> bool:
    """An S3 ETag: the MD5 of a single-part object, or the MD5 of the parts' MD5s for a multipart one,
    whose part size is found among the whole-MiB sizes that give that many parts."""
    etag = etag.strip('"')
    if "-" not in etag:
        return _md5_file(path) == etag
    count = int(etag.rsplit("-", 1)[1])
    if count == 1:
        candidates = [size]
    else:
        lo, hi = -(-size // count), (size - 1) // (count - 1)
        mib = 1 << 20
        candidates = [m * mib for m in range(-(-lo // mib), hi // mib + 1)][:16] or [lo]
    return any(_multipart_etag(path, p) == etag for p in candidates)


def entry_ok(root: str, e: dict) -> bool:
    """Whether the file at e's path is exactly e (content checked, not size and time)."""
    full = os.path.join(root, e["p"])
    if "h" in e:
        return sha256_file(full) == e["h"]
    if e.get("sha256b64"):
        return base64.b64encode(bytes.fromhex(sha256_file(full))).decode() == e["sha256b64"]
    if e.get("etag"):
        return etag_matches(full, e["etag"], e["s"])
    return True


def _remove(full: str) -> None:
    st = os.lstat(full)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(full)
    else:
        os.unlink(full)


class Checked(NamedTuple):
    bad: list[str]  # paths
    bad_bytes: int
    good_bytes: int  # present and right
    reread: int  # files read back
    files: int  # in the manifest
    total: int  # the manifest's bytes


def check(root: str, entries, delete: bool, workers: int, received: dict[str, list] | None = None) -> Checked:
    """DST against the entries, walked once as they come (a ManifestReader: never a list). Entries of
    the wrong type are removed (a file where a directory belongs, a link in place of a file), so the copy
    can put the right one. A file in `received` (recv's {path: [sha256, size, mtime]}) whose sha256 as
    written is the manifest's, and whose size and mtime are still those tar wrote, is not read back: its
    hash says it is right, or wrong. Held meanwhile: the bad paths, the files still to read back, and for
    --delete the set of every path (what is not in it goes, once the whole manifest was read)."""
    received = received or {}
    bad: list[str] = []
    bad_bytes = good_bytes = files = total = 0
    to_hash: list[dict] = []
    wanted: set[str] | None = set() if delete else None
    for e in entries:
        if wanted is not None:
            wanted.add(e["p"])
        if e["t"] == "f":
            files += 1
            total += e["s"]
        full = f"{root}/{e['p']}"  # root is absolute and normalized, the path checked (ManifestReader)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            st = None
        except NotADirectoryError:
            st = None
        kind = e["t"]
        if st is not None:
            is_right = (
                (kind == "d" and stat.S_ISDIR(st.st_mode))
                or (kind == "f" and stat.S_ISREG(st.st_mode))
                or (kind == "l" and stat.S_ISLNK(st.st_mode) and os.readlink(full) == e["l"])
            )
            if not is_right:
                _remove(full)
                st = None
        if st is None:
            bad.append(e["p"])
            bad_bytes += e.get("s", 0)
        elif kind == "f":
            got = received.get(e["p"])
            if st.st_size != e["s"]:
                bad.append(e["p"])
                bad_bytes += e["s"]
            elif got and "h" in e and got[1] == st.st_size and int(got[2]) == int(st.st_mtime):
                if got[0] == e["h"]:
                    good_bytes += e["s"]
                else:  # what arrived is not the source's manifest (changed on the way, or at the source)
                    bad.append(e["p"])
                    bad_bytes += e["s"]
            else:
                to_hash.append(e)
    for e, ok in zip(to_hash, map_by_size(lambda e: entry_ok(root, e), to_hash, workers)):
        if ok:
            good_bytes += e["s"]
        else:
            bad.append(e["p"])
            bad_bytes += e["s"]
    if wanted is not None:
        delete_extras(root, wanted)
    return Checked(bad, bad_bytes, good_bytes, len(to_hash), files, total)


def delete_extras(root: str, wanted: set[str]) -> None:
    for dirpath, dirnames, filenames in os.walk(root, topdown=True, followlinks=False):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel
        for name in list(dirnames) + filenames:
            p = f"{rel}/{name}" if rel else name
            if (rel == "" and name == STATE_DIR) or name == PARTIAL_DIR:
                if name in dirnames:
                    dirnames.remove(name)
                continue
            if p not in wanted:
                _remove(os.path.join(dirpath, name))
                if name in dirnames:
                    dirnames.remove(name)


def keep_manifest(src: str, path: str) -> str:
    """The manifest's JSON Lines (unzipped) into path, atomically (as atomic_write), in pieces; its digest
    (ManifestReader's). One of another version is refused, as ManifestReader refuses it."""
    tmp = temp_beside(path)
    h = hashlib.sha256()
    try:
        with open_manifest(src) as fi, open(tmp, "wb") as fo:
            first = fi.readline()
            manifest_version(first)
            h.update(first)
            fo.write(first)
            while data := fi.read(CHUNK):
                h.update(data)
                fo.write(data)
            fo.flush()
            os.fsync(fo.fileno())
    except NOT_GZIP as exc:
        os.unlink(tmp)
        raise not_gzip(exc) from None
    except AgentError:
        os.unlink(tmp)
        raise
    os.replace(tmp, path)
    return h.hexdigest()


def atomic_write(path: str, data: bytes) -> None:
    tmp = temp_beside(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def resolve_root(dst: str) -> str:
    root = os.path.abspath(os.path.expanduser(dst)) if not dst.startswith("/") else os.path.normpath(dst)
    if root == "/":
        raise AgentError("refusing to sync into /", 2)
    return root


# Never written into (nor anything inside them), whatever the flags: the system's own trees.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/snap",
    "/sys",
    "/usr",
    "/var",
)


# clusterctl's own folders on a node: the node runtimes (runtime/spec.py ROOT) and the AWS idle watchdog
# (autostop/watchdog.py), and the login home's .clusterctl (every run's work folder, this script among
# them). Never synced into, nor held by a DST with --delete. The one exception: the runtime's own relay
# lands its pack in RUNTIME_INCOMING/<id> (runtime/install.py INCOMING).
TOOL_TREES = ("/opt/clusterctl-runtime", "/opt/clusterctl")
RUNTIME_INCOMING = "/opt/clusterctl-runtime/.incoming"
TOOL_HOME = ".clusterctl"


def _within(path: str, tree: str) -> bool:
    """path is tree or lies inside it (both absolute and normalized)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def dst_problem(real: str, home: str, delete: bool) -> str | None:
    """Why DST (already realpath'd, symlinks followed) must not be synced into, or None. The same rules
    as `clean --logs` (clean.logs_command): with --delete, or for a removal, `delete` is True."""
    if real == "/":
        return "it resolves to /"
    for tree in SYSTEM_TREES:
        if _within(real, tree):
            return f"{real} is a system folder ({tree})"
    if real == home or home.startswith(real.rstrip("/") + "/"):
        return f"{real} is the login home {home} or holds it"
    for tree in (*TOOL_TREES, os.path.join(home, TOOL_HOME)):
        if _within(real, tree) and not real.startswith(RUNTIME_INCOMING + "/"):
            return f"{real} is in clusterctl's own folder {tree}"
        if delete and tree.startswith(real + "/"):
            return f"{real} holds clusterctl's own folder {tree} (--delete would empty it)"
    if delete:
        if real.count("/") == 1:
            return f"{real} is a top-level folder (--delete would empty it)"
        for dirpath, dirnames, filenames in os.walk(real, followlinks=False):
            if ".ssh" in dirnames or ".ssh" in filenames or os.path.basename(dirpath) == ".ssh":
                return f"{real} holds an .ssh folder ({dirpath}): --delete could lock users out"
    return None


def boot_id() -> str:
    """This kernel's boot id ("" where there is none). Two views of a folder with one boot id are one
    kernel's (namespace nodes and this machine; a hosts file naming this machine), where a device and inode
    name one folder; another machine's boot id differs, so no folder there is taken for the source."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def folder_id(path: str) -> str:
    """device:inode of the folder at path (symlinks followed)."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def source_relation(real: str, src: str, src_id: str, src_boot: str) -> tuple[str, str]:
    """How DST, resolved on this node (real), stands to SRC: the source folder resolved where it is (src),
    its device:inode and its kernel's boot id. ("", "") when this node cannot see SRC (another kernel, or
    another folder at that path, as a namespace node's own /root); else "is" (DST is SRC), "holds" or
    "inside", and SRC's path as seen here. Also found when SRC is seen under another path (a bind mount):
    DST or a folder above it being SRC."""
    if not src or not src_boot or src_boot != boot_id():
        return "", ""
    try:
        here = os.path.realpath(src)
        seen = folder_id(here) == src_id
    except OSError:
        seen = False
    if seen:
        if real == here:
            return "is", here
        if _within(here, real):
            return "holds", here
        if _within(real, here):
            return "inside", here
    p = real
    while True:
        try:
            if folder_id(p) == src_id:
                return ("is" if p == real else "inside"), p
        except OSError:
            pass  # not made yet
        if p == "/":
            return "", ""
        p = os.path.dirname(p)


def safe_root(args: dict) -> tuple[str, bool]:
    """DST resolved on this node (symlinks followed) and whether it is SRC itself (--src ...), refused (exit 2)
    before anything in it is touched: a system or clusterctl folder (dst_problem), or SRC, a folder holding
    SRC or one inside it (the copy would write into its own source, and --delete remove it). DST being SRC
    is allowed with --src-may-be-dst (a leader source: that node's copy is the source, checked; no data is
    written into it or deleted from it, only its state folder kept)."""
    dst, delete = args["dst"], bool(args.get("delete"))
    home = os.path.realpath(os.path.expanduser("~"))
    real = os.path.realpath(resolve_root(dst))
    problem = dst_problem(real, home, delete)
    hint = "name a folder of its own (not a system folder, the home, nor clusterctl's)"
    relation, here = source_relation(real, args.get("src", ""), args.get("src_id", ""), args.get("src_boot", ""))
    said = {
        "holds": f"it resolves to {real}, which holds SRC {here}",
        "inside": f"it resolves to {real}, inside SRC {here}",
        "is": "" if args.get("src_may_be_dst") else f"it resolves to {real}, which is SRC {here} itself",
    }.get(relation, "")
    if said:
        problem, hint = said, "sync into a folder outside SRC that does not hold it (e.g. one beside it)"
    if problem:
        raise AgentError(f"refusing to sync into {dst}: {problem}", 2, hint)
    return real, relation == "is"


def cmd_check(args: dict) -> dict:
    root, is_src = safe_root(args)
    delete = bool(args.get("delete")) and not is_src  # the source itself: only checked
    state = os.path.join(root, STATE_DIR)
    marker = os.path.join(state, MARKER)
    saved = os.path.join(state, SAVED)
    if args.get("reset"):
        try:
            os.unlink(marker)  # from here on, this copy is not complete until verified again
        except FileNotFoundError:
            pass
    try:
        os.makedirs(state, exist_ok=True)
        if args.get("reset"):
            keep_manifest(args["manifest"], saved)
        if os.path.lexists(os.path.join(state, OLD_SAVED)):  # an older version's: its marker's digest was
            os.unlink(os.path.join(state, OLD_SAVED))  # another hash; the copy is checked anew below
    except OSError as exc:
        raise AgentError(f"cannot write {state}: {exc.strerror}") from None
    head, received = load_received(args["received"], head_only=True) if args.get("received") else ({}, {})
    if head:
        sync_fs(root)  # tar's writes on disk before its hashes count
    # --stream-digest: DST held nothing before (`fresh`) and the stream was to be the manifest, all of it;
    # when it was, tar wrote it all: nothing to look up
    mark = args.get("mark")
    by_stream = (
        bool(head) and head["stream"] == args.get("stream_digest") and mark is not None and not args.get("reset")
    )
    if by_stream:
        got, digest = Checked([], 0, int(head["bytes"]), 0, int(head["files"]), int(head["bytes"])), ""
    else:
        if head:
            received = load_received(args["received"])[1]
        manifest = ManifestReader(args["manifest"])
        got = check(root, manifest, delete, int(args.get("workers", 4)), received)
        digest = manifest.digest
    marked = False
    if not got.bad and mark is not None:
        try:
            if by_stream:  # DST was empty: its manifest is this one
                digest = keep_manifest(args["manifest"], saved)
            else:
                try:
                    same = sha256_file(saved) == digest
                except OSError:
                    same = False
                if not same:  # the manifest changed since --reset (S3: sha256s recorded by the first node)
                    keep_manifest(args["manifest"], saved)
            info = {
                "manifest_sha256": digest,  # of the manifest file's bytes (JSON Lines, version 2)
                "manifest_version": MANIFEST_VERSION,
                "files": got.files,
                "bytes": got.total,
                "source": mark,
                "verified_at": time.time(),
            }
            atomic_write(marker, (json.dumps(info, sort_keys=True) + "\n").encode())
            marked = True
        except OSError as exc:
            raise AgentError(f"cannot write the completion marker: {exc.strerror}") from None
    vfs = os.statvfs(root)
    return {
        "root": root,
        "bad": got.bad,
        "bad_bytes": got.bad_bytes,
        "good_bytes": got.good_bytes,
        "digest": digest,
        "marked": marked,
        "free": vfs.f_bavail * vfs.f_frsize,
        "reread": got.reread,
        "streamed": got.files - got.reread,
        "by_stream": by_stream,  # proved by the stream's digest alone
        "source": is_src,  # DST is SRC itself (--src-may-be-dst): its data never written nor deleted
    }


def cmd_fresh(args: dict) -> dict:
    """Whether DST holds nothing yet (missing, or only this tool's state folder): then its completion marker
    is removed and every entry of any manifest is missing there, so the node needs no manifest to say so
    (a first sync of 200,000 files skips reading them and looking each up). Else nothing is touched."""
    root, is_src = safe_root(args)
    if is_src:
        return {"root": root, "fresh": False, "source": True}
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        names = []
    except NotADirectoryError:
        return {"root": root, "fresh": False}
    if names and names != [STATE_DIR]:
        return {"root": root, "fresh": False}
    state = os.path.join(root, STATE_DIR)
    try:
        try:
            os.unlink(os.path.join(state, MARKER))
        except FileNotFoundError:
            pass
        os.makedirs(state, exist_ok=True)
    except OSError as exc:
        raise AgentError(f"cannot write {state}: {exc.strerror}") from None
    vfs = os.statvfs(root)
    return {"root": root, "fresh": True, "free": vfs.f_bavail * vfs.f_frsize}


def load_received(path: str, head_only: bool = False) -> tuple[dict, dict[str, list]]:
    """recv's first line ({stream, files, bytes}) and its hashes; ({}, {}) when there are none (the relay
    keeps them only when recv and tar both exited 0). head_only: the first line alone, the rest unread."""
    try:
        with open(path, "rb") as f:
            head = json.loads(f.readline())
            return head, ({} if head_only else json.loads(f.read().decode("utf-8", "surrogatepass")))
    except FileNotFoundError:
        return {}, {}


def sync_fs(root: str) -> None:
    """syncfs(2) of root's file system (one call for every file tar wrote), else sync(2)."""
    import ctypes

    fd = os.open(root, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syncfs(fd) != 0:
            os.sync()
    except (OSError, AttributeError):
        os.sync()
    finally:
        os.close(fd)


_ZERO_BLOCK = bytes(512)
_DESCRIBES_NEXT = (b"L", b"K", b"x")  # GNU long name, GNU long link, pax records: about the next member
_HASHED = (b"0", b"\0", b"7")  # regular files (and contiguous ones)


def _header_sum(h: bytes) -> int:
    """A tar header's checksum: the sum of its bytes, its checksum field counted as 8 spaces. zlib's adler32
    sums bytes in C: its low half is 1 + their sum mod 65521, exact for up to 256 bytes (at most 65,280),
    hence three pieces of at most 256 bytes around the field (what `sum` did at ~10x the cost)."""
    return (
        (zlib.adler32(h[:148]) & 0xFFFF)
        + (zlib.adler32(h[156:412]) & 0xFFFF)
        + (zlib.adler32(h[412:512]) & 0xFFFF)
        + 253
    )


def _tar_name(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape").rstrip("/")


def _fs(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # a name as it was on disk and in the tar header


# The stream digest's records (module docstring): one definition for recv and for the operator.
FILE_RECORD, DIR_RECORD, LINK_RECORD = (
    b"f%s\0%d\0%s\0",
    b"d%s\0",
    b"l%s\0%s\0",
)  # path, size, sha256 / path / path, target


def stream_digest(entries: Iterable[ManifestEntry]) -> str | None:
    """The digest recv makes of a tar stream of these entries, in this order (see the module's docstring);
    None when one cannot be made (a file without its sha256, a name that was never bytes)."""
    h = hashlib.sha256()
    try:
        for e in entries:
            if e.kind == "f":
                if e.sha256 is None:
                    return None
                h.update(FILE_RECORD % (_fs(e.path), e.size or 0, e.sha256.encode()))
            elif e.kind == "l":
                h.update(LINK_RECORD % (_fs(e.path), _fs(e.link or "")))
            else:
                h.update(DIR_RECORD % _fs(e.path))
    except UnicodeEncodeError:
        return None
    return h.hexdigest()


class TarFollower:
    """Follows a tar stream fed in pieces (GNU, ustar and pax headers; long names and links) and hashes
    every regular file's bytes in place (memoryview slices: no copy): {path: [sha256, size, mtime]}. Hard
    links get their target's hash. A header whose checksum is wrong stops it (TarStreamError).

    Per member, the common case costs one header copy and one hash call: where a whole member (header,
    data, padding) sits in the piece fed, feed takes it in one step (the fast path); one split across
    pieces goes through the state machine (_step). A header with no long name or pax records before it
    skips their parsing; the checksum is summed in C (_header_sum)."""

    def __init__(self):
        self.hashes: dict[str, list] = {}
        self.stream = hashlib.sha256()  # of every member's record (stream_digest's)
        self.files = self.bytes = 0
        self.done = False
        self._hdr = bytearray()
        self._left = self._pad = 0
        self._sink = None  # a sha256, a bytearray (long name, pax) or None (skipped)
        self._member: tuple | None = None
        self._long: dict[bytes, bytes] = {}  # b"L"/b"K": the next member's name/link; b"x": its pax records

    def feed(self, mv: memoryview) -> None:
        i, end = 0, len(mv)
        while i < end and not self.done:
            if self._left or self._pad or self._hdr:  # in the middle of a member: the general step
                i = self._step(mv, i, end)
            elif end - i < 512:  # a header split across pieces
                self._hdr += mv[i:end]
                i = end
            else:  # a header whole in this piece: a plain file's or folder's taken here (the fast path)
                h = mv[i : i + 512].tobytes()
                i += 512
                kind = h[156]
                if (kind == 48 or kind == 53) and not self._long:  # "0" a file, "5" a folder; no long name
                    try:  # octal as GNU tar and ustar write them, else (base-256, odd padding) the slow path
                        chk = int(h[148:156].rstrip(b"\0 "), 8)
                        size = int(h[124:136].rstrip(b"\0"), 8)
                        mtime = int(h[136:148].rstrip(b"\0"), 8)
                    except ValueError:
                        chk = -1
                    if chk >= 0:
                        if chk != _header_sum(h):
                            raise TarStreamError("a tar header's checksum is wrong")
                        pad = -size % 512
                        if kind == 53 or i + size + pad > end:  # a folder, or data beyond this piece
                            self._header(h)
                            continue
                        name = h[:100].split(b"\0", 1)[0]
                        if h[257:263] == b"ustar\0" and h[345]:
                            name = h[345:500].split(b"\0", 1)[0] + b"/" + name
                        digest = hashlib.sha256(mv[i : i + size]).hexdigest()
                        self.hashes[_tar_name(name)] = [digest, size, mtime]
                        self.stream.update(FILE_RECORD % (name.rstrip(b"/"), size, digest.encode()))
                        self.files += 1
                        self.bytes += size
                        i += size + pad
                        continue
                self._header(h)
                left = self._left
                if left and i + left + self._pad <= end:
                    self._take(mv[i : i + left])
                    i += left + self._pad
                    self._left = self._pad = 0
                    self._end()

    def _take(self, data: memoryview) -> None:
        """A member's data into its sink: hashed (a file), kept (a long name, pax records) or skipped."""
        sink = self._sink
        if isinstance(sink, bytearray):
            sink += data
        elif sink is not None:
            sink.update(data)

    def _step(self, mv: memoryview, i: int, end: int) -> int:
        """One state's worth of the piece from i (data, padding or a header's rest); the new i."""
        if self._left:
            take = min(self._left, end - i)
            self._take(mv[i : i + take])
            self._left -= take
            if not self._left:
                self._end()
            return i + take
        if self._pad:
            take = min(self._pad, end - i)
            self._pad -= take
            return i + take
        take = min(512 - len(self._hdr), end - i)
        self._hdr += mv[i : i + take]
        if len(self._hdr) == 512:
            h = bytes(self._hdr)
            self._hdr.clear()
            self._header(h)
        return i + take

    @staticmethod
    def _num(field: bytes) -> int:
        if field[0] & 0x80:  # GNU base-256 (sizes of 8 GiB and more)
            return int.from_bytes(field[1:], "big")
        text = field.split(b"\0", 1)[0]
        try:
            return int(text, 8)  # int() itself takes the spaces around the digits
        except ValueError:
            if text.strip():
                raise
            return 0

    def _header(self, h: bytes) -> None:
        if not h[0] and h == _ZERO_BLOCK:
            self.done = True  # the end-of-archive block
            return
        if self._num(h[148:156]) != _header_sum(h):
            raise TarStreamError("a tar header's checksum is wrong")
        kind, size = h[156:157], self._num(h[124:136])
        long = self._long
        pax = self._pax(long[b"x"]) if b"x" in long else {}
        if b"size" in pax:
            size = int(pax[b"size"])
        self._left, self._pad = size, -size % 512
        if kind in _DESCRIBES_NEXT:
            self._sink, self._member = bytearray(), (kind,)
        else:
            name = long.get(b"L") or h[:100].split(b"\0", 1)[0]
            if h[257:263] == b"ustar\0" and h[345] and b"L" not in long:
                name = h[345:500].split(b"\0", 1)[0] + b"/" + name
            link = b""
            if kind in (b"1", b"2"):  # a hard link (its target's hash is used) or a symlink
                link = pax.get(b"linkpath") or long.get(b"K") or h[157:257].split(b"\0", 1)[0]
            if long:
                name = pax.get(b"path", name)
                self._long = {}
            mtime = int(float(pax[b"mtime"])) if b"mtime" in pax else self._num(h[136:148])
            self._sink = hashlib.sha256() if kind in _HASHED else None
            to = _tar_name(link) if kind == b"1" else link.decode("utf-8", "surrogateescape")  # a symlink's as is
            self._member = (kind, _tar_name(name), to, size, mtime)
        if not size:
            self._end()

    @staticmethod
    def _pax(data: bytes) -> dict[bytes, bytes]:
        out, i = {}, 0
        while i < len(data):
            length = int(data[i : data.index(b" ", i)])
            key, _, value = data[data.index(b" ", i) + 1 : i + length - 1].partition(b"=")
            out[key] = value
            i += length
        return out

    def _end(self) -> None:
        m, sink = self._member, self._sink
        assert m is not None  # set by the header whose member just ended
        self._sink = None
        if m[0] in _DESCRIBES_NEXT:
            assert isinstance(sink, bytearray)  # the header gave these a bytearray
            self._long[m[0]] = bytes(sink).rstrip(b"\0") if m[0] != b"x" else bytes(sink)
            return
        kind, path = m[0], _fs(m[1])
        if sink is not None or (kind == b"1" and m[2] in self.hashes):
            digest, size = (sink.hexdigest(), m[3]) if sink is not None else self.hashes[m[2]][:2]
            self.hashes[m[1]] = [digest, size, m[4]]
            self.stream.update(FILE_RECORD % (path, size, digest.encode()))
            self.files += 1
            self.bytes += size
        elif kind == b"5":
            self.stream.update(DIR_RECORD % path)
        elif kind == b"2":
            self.stream.update(LINK_RECORD % (path, _fs(m[2])))
        else:  # a device, a fifo, a hard link to what the stream did not carry: no manifest has it
            self.stream.update(b"?%s%s\0" % (kind, path))


class TarStreamError(Exception):
    pass


def cmd_recv(args: dict) -> None:
    """stdin to stdout, and the sha256 of every regular file's bytes in the tar stream as they go by:
    {path: [sha256, size, mtime]} into --hashes. Every piece is written on before it is looked at, and
    forwarding to the next hop happened before this (the relay's tee), so hashing holds nothing up more
    than tar does. A stream it cannot follow still reaches tar whole; it keeps no hashes then (exit 1)."""
    buf = bytearray(CHUNK)
    view = memoryview(buf)
    follower, problem = TarFollower(), None
    while n := os.readv(0, [buf]):
        piece = view[:n]
        out = piece
        while out:
            out = out[os.write(1, out) :]
        if problem is None:
            try:
                follower.feed(piece)
            except (TarStreamError, ValueError) as exc:
                problem = f"cannot follow the tar stream ({exc}): no hashes as written"
    if problem is None and not follower.done:
        problem = "the tar stream ended early: no hashes as written"
    if problem:
        raise AgentError(problem)
    head = {"stream": follower.stream.hexdigest(), "files": follower.files, "bytes": follower.bytes}
    atomic_write(args["hashes"], b"%s\n%s" % (json.dumps(head).encode(), json.dumps(follower.hashes).encode()))


def cmd_manifest(args: dict) -> dict:
    root = resolve_root(args["root"]) if args["root"] != "/" else "/"
    if not os.path.isdir(root):
        raise AgentError(f"no such directory: {root}", EXIT_INPUT)
    cache = args.get("cache")
    known = load_scan_cache(cache, root) if cache else {}
    before = len(known)
    entries, known, hashed = scan_reusing(root, known, int(args.get("workers", 4)))
    if cache and (hashed or len(known) != before):  # else the kept manifest is still the one
        try:
            save_scan_cache(cache, root, known)
        except OSError:
            pass  # only the next run's speed depends on it
    return {
        "root": root,
        "real": os.path.realpath(root),
        "id": folder_id(root),  # with "boot": how every node tells whether it sees this folder (safe_root)
        "boot": boot_id(),
        "entries": entries,
        "hashed": hashed,
    }


# ---- S3 ---------------------------------------------------------------------------------------------
def _s3(args: dict):
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise AgentError("boto3 is not installed on this node (pip install boto3)", EXIT_INPUT) from None
    cfg = Config(retries={"max_attempts": 5, "mode": "standard"}, max_pool_connections=16)
    return boto3.client("s3", endpoint_url=args.get("endpoint_url") or None, config=cfg)


def _s3_error(exc: Exception) -> AgentError:
    name = exc.__class__.__name__
    if name in ("NoCredentialsError", "PartialCredentialsError"):
        return AgentError("no AWS credentials on this node: give it an instance profile (or ~/.aws config)", EXIT_INPUT)
    code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
    if code in ("NoSuchBucket", "AccessDenied", "403", "404"):
        return AgentError(f"S3: {code}: {exc}", EXIT_INPUT)
    return AgentError(f"S3: {name}: {exc}"[:300])


def cmd_s3list(args: dict) -> dict:
    s3 = _s3(args)
    bucket, prefix = args["bucket"], args["prefix"]
    entries: dict[str, dict] = {}
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                key = obj["Key"]
                rel = key[len(prefix) :]
                folder = rel.endswith("/")  # a console "folder": an empty directory on the nodes
                rel = rel.rstrip("/")
                if rel == "":
                    continue  # the prefix itself
                problem = path_problem(rel)
                if problem:
                    raise AgentError(f"S3 key {key!r} cannot be a file under DST: {problem}", EXIT_INPUT)
                if folder:
                    rel += "/_"  # only its parents (itself included) become directories
                e = {"p": rel, "t": "f", "s": int(obj["Size"]), "etag": obj["ETag"].strip('"')}
                if "SHA256" in (obj.get("ChecksumAlgorithm") or []):
                    head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
                    value = head.get("ChecksumSHA256") or ""
                    if value and "-" not in value:
                        e["sha256b64"] = value
                if not folder:
                    if rel in entries:
                        raise AgentError(f"S3 keys clash at {rel!r} (a file and a folder)", EXIT_INPUT)
                    entries[rel] = e
                parts = rel.split("/")[:-1]
                for i in range(1, len(parts) + 1):
                    d = "/".join(parts[:i])
                    if d in entries and entries[d]["t"] != "d":
                        raise AgentError(f"S3 keys {d!r} and {rel!r} clash (a file and a folder)", EXIT_INPUT)
                    entries.setdefault(d, {"p": d, "t": "d"})
    except AgentError:
        raise
    except Exception as exc:
        raise _s3_error(exc) from None
    return {"entries": sorted(entries.values(), key=lambda e: e["p"].split("/"))}


class _Progress:
    def __init__(self):
        self.done = 0
        self.lock = threading.Lock()
        self.last = 0.0

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n
            now = time.monotonic()
            if now - self.last >= 0.5:
                self.last = now
                sys.stderr.write(f"CCSYNC-BYTES {self.done}\n")
                sys.stderr.flush()


def cmd_s3pull(args: dict) -> dict:  # noqa: C901 (each object checked as S3 allows (ETag, SHA256, recorded), in one pass)
    root = safe_root({"dst": args["dst"]})[0]
    with open(args["only"], "rb") as f:
        wanted = [p for p in f.read().decode("utf-8", "surrogateescape").split("\0") if p]
    only = set(wanted)  # of the manifest, only the entries pulled are held
    entries = {e["p"]: e for e in ManifestReader(args["manifest"]) if e["p"] in only}
    missing = only.difference(entries)
    if missing:
        raise AgentError(f"--only names {min(missing)!r}, which the manifest does not", EXIT_INPUT)
    s3 = _s3(args)
    bucket, prefix = args["bucket"], args["prefix"]
    progress = _Progress()
    for p in wanted:
        if entries[p]["t"] == "d":
            os.makedirs(os.path.join(root, p), exist_ok=True)

    record = bool(args.get("record"))
    recorded: dict[str, str] = {}

    def one(p: str) -> str | None:
        e = entries[p]
        if e["t"] != "f":
            return None
        full = os.path.join(root, p)
        pdir = os.path.join(os.path.dirname(full), PARTIAL_DIR)
        part = os.path.join(pdir, os.path.basename(full))
        try:
            os.makedirs(pdir, exist_ok=True)
            have = os.path.getsize(part) if os.path.exists(part) else 0
            if have > e["s"]:
                os.unlink(part)
                have = 0
            sha, md5, kms = hashlib.sha256(), hashlib.md5(), False  # streamed: the data is read once
            if have:
                with open(part, "rb", buffering=0) as f:
                    while b := f.read(CHUNK):
                        sha.update(b)
                        md5.update(b)
            if have < e["s"] or e["s"] == 0:
                kw = {"Bucket": bucket, "Key": prefix + p, "IfMatch": '"' + e["etag"] + '"'}
                if have:
                    kw["Range"] = f"bytes={have}-"
                resp = s3.get_object(**kw)
                # SSE-KMS (and SSE-C): the ETag is not the MD5 of the data, S3 vouches for nothing we can check
                kms = resp.get("ServerSideEncryption") in ("aws:kms", "aws:kms:dsse") or bool(
                    resp.get("SSECustomerAlgorithm")
                )
                body = resp["Body"]
                with open(part, "ab" if have else "wb") as f:
                    for chunk in iter(lambda: body.read(CHUNK), b""):
                        f.write(chunk)
                        sha.update(chunk)
                        md5.update(chunk)
                        progress.add(len(chunk))
            problem = None
            if os.path.getsize(part) != e["s"]:
                problem = "content does not match S3's checksum"
            elif "h" in e or e.get("sha256b64"):  # S3's SHA256, or the one the first node recorded
                if not (
                    sha.hexdigest() == e["h"] if "h" in e else base64.b64encode(sha.digest()).decode() == e["sha256b64"]
                ):
                    problem = "content does not match " + (
                        "the sha256 recorded by the first node" if "h" in e else "S3's checksum"
                    )
            elif not kms and "-" not in e["etag"]:
                if md5.hexdigest() != e["etag"]:
                    problem = "content does not match S3's checksum"
            elif kms or not etag_matches(part, e["etag"], e["s"]):  # a multipart ETag of unknown part size
                if record:
                    with recorded_lock:
                        recorded[p] = sha.hexdigest()
                else:
                    problem = (
                        "S3 gives no checksum for it (SSE-KMS or a multipart ETag) and no node recorded one "
                        "to check it against"
                    )
            if problem:
                os.unlink(part)
                return f"{p}: {problem}"
            if os.path.lexists(full) and os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            os.replace(part, full)
            return None
        except OSError as exc:
            return f"{p}: {exc.strerror or exc}"
        except Exception as exc:
            return f"{p}: {_s3_error(exc)}"

    recorded_lock = threading.Lock()
    with ThreadPoolExecutor(max_workers=int(args.get("workers", 8))) as pool:
        errors = [r for r in pool.map(one, wanted) if r]
    for pdir in {os.path.join(os.path.dirname(os.path.join(root, p)), PARTIAL_DIR) for p in wanted}:
        try:
            os.rmdir(pdir)  # only once every pull is over: the threads share these folders
        except OSError:
            pass
    sys.stderr.write(f"CCSYNC-BYTES {progress.done}\n")
    if errors:
        raise AgentError(f"{len(errors)} object(s) failed, first: {errors[0]}")
    return {"root": root, "bytes": progress.done, "recorded": recorded}


# ---- relay ------------------------------------------------------------------------------------------
def cmd_relay(args: dict) -> dict | None:  # noqa: C901 (tee/splice with a read/write fallback and the stall reporter: one copy loop)
    """stdin to stdout and to the fifo --out at once, like `tee -p`, but with no copy in between: tee(2)
    duplicates the pipe's pages into the fifo, splice(2) moves them to stdout. An output whose reader is
    gone (a dead hop, a tar that stopped on a full disk) is dropped and the other goes on. Anything but
    pipes: a plain read/write loop.

    With --index I, a thread says every second on stderr what the copy waits for, when it has waited a
    second or more: `CCSYNC-HOP I in|hop|ext SECONDS` (input from upstream, the next hop, this node's tar).
    The operator's stall timeout reads these to name the node that stopped taking data."""
    import ctypes
    import fcntl
    import select

    state: dict = {"what": "run", "since": time.monotonic()}

    def waiting(what: str) -> None:
        if state["what"] != what:
            state["what"], state["since"] = what, time.monotonic()

    def beat(index: str) -> None:
        while True:
            time.sleep(1.0)
            held = time.monotonic() - state["since"]
            if state["what"] != "run" and held >= 1.0:
                try:
                    os.write(2, f"CCSYNC-HOP {index} {state['what']} {int(held)}\n".encode())
                except OSError:
                    return

    if args.get("index") is not None:
        threading.Thread(target=beat, args=(str(int(args["index"])),), daemon=True).start()
    stdin_ready = select.poll()
    stdin_ready.register(0, select.POLLIN | select.POLLHUP)

    out = os.open(args["out"], os.O_WRONLY)
    for fd in (0, 1, out):
        try:
            fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer, larger reads and writes downstream
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    libc.tee.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_uint]
    libc.tee.restype = ctypes.c_ssize_t
    outs = [out, 1]  # the fifo (next hop), stdout (tar)
    zero_copy = True
    while outs:
        waiting("in")
        stdin_ready.poll()  # data (or EOF) upstream: from here on a wait is the outputs'
        if zero_copy and len(outs) == 2:
            waiting("hop")
            n = libc.tee(0, outs[0], 1 << 20, 0)
            if n < 0:
                err = ctypes.get_errno()
                if err == 32:  # EPIPE: the next hop is gone
                    outs.pop(0)
                    continue
                zero_copy = False  # EINVAL: not pipes
                continue
            if n == 0:
                break
            left = n
            waiting("ext")
            while left:
                try:
                    left -= os.splice(0, outs[1], left)
                except BrokenPipeError:  # tar is gone: drop the bytes the hop already has, go on
                    outs.pop(1)
                    while left:
                        left -= len(os.read(0, left))
            continue
        if zero_copy and len(outs) == 1:
            waiting("hop" if outs[0] != 1 else "ext")
            try:
                n = os.splice(0, outs[0], 1 << 20)
            except BrokenPipeError:
                outs.pop()
                break
            except OSError:
                zero_copy = False
                continue
            if n == 0:
                break
            continue
        data = os.read(0, 1 << 20)
        if not data:
            break
        for fd in list(outs):
            waiting("ext" if fd == 1 else "hop")
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            except BrokenPipeError:
                outs.remove(fd)
    waiting("run")
    while os.read(0, 1 << 20):  # both outputs gone: drain, so the sender upstream is not blocked
        pass
    return None


# ---- fan-out probe ----------------------------------------------------------------------------------
def cmd_sink(args: dict) -> None:
    """Throwaway bytes on stdin, timed from the first read's end (its bytes not counted) to the last's."""
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    buf, count, first, last = bytearray(CHUNK), 0, 0.0, 0.0
    while True:
        got = os.readv(0, [buf])
        if not got:
            break
        last = time.monotonic()
        if first:
            count += got
        else:
            first = last
    sys.stdout.write(json.dumps({"bytes": count, "seconds": last - first}) + "\n")


def cmd_probe(args: dict) -> dict:
    """One stream to every address at once, started together once every sink said it is ready: what the
    addresses took at once is what this node's uplink gives that many chains. Bounded: writes never block
    past the end, and a sink that does not answer in time fails the probe (a stalled node is not waited for).
    """
    import fcntl
    import select
    import subprocess

    hop, remote, seconds = json.loads(args["hop"]), args["remote"], float(args.get("seconds") or 1.0)
    addresses = args["addresses"]
    procs = [
        subprocess.Popen([*hop, "--", a, remote], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for a in addresses
    ]

    def said(p, a: str, what: str, wait: float) -> bytes:
        if select.select([p.stdout], [], [], wait)[0]:
            line = p.stdout.readline()
            if line:
                return line
        p.kill()
        err = p.stderr.read().decode(errors="replace").strip()[-200:]
        raise AgentError(f"{a}: the probe's sink {what}: {err or f'no answer in {wait:g}s'}")

    try:
        for p, a in zip(procs, addresses):
            said(p, a, "did not start", 20)
        block = os.urandom(1 << 16)  # random: nothing on the way can shrink it
        stdins = [p.stdin for p in procs if p.stdin is not None]  # all of them: PIPE
        fds = [f.fileno() for f in stdins]
        for fd in fds:
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for fd in select.select([], fds, [], left)[1]:
                try:
                    os.write(fd, block)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    raise AgentError(f"a probe stream broke: {exc}") from None
        for f in stdins:
            f.close()
        counts = [said(p, a, "gave no count", 15 + seconds) for p, a in zip(procs, addresses)]
        return {"streams": [dict(json.loads(c), address=a) for c, a in zip(counts, addresses)], "seconds": seconds}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


# ---- main -------------------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one JSON error and exit 2 (main's), not argparse's usage text and exit
        raise AgentError(message, 2)


SRC_OPTIONS = ("--src", "--src-id", "--src-boot")  # check, fresh: the source folder DST is judged against


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="agent.py", add_help=False)
    sub = parser.add_subparsers(dest="cmd", parser_class=_Parser)
    sub.required = True
    commands: dict[str, tuple[list[tuple[str, ...]], list[str], list[str]]] = {  # positional (name, nargs?)
        "manifest": ([("root",)], ["--workers", "--cache", "--out"], []),
        "check": (
            [],
            ["--dst", "--manifest", "--mark", "--workers", "--received", "--stream-digest", "--out", *SRC_OPTIONS],
            ["--reset", "--delete", "--src-may-be-dst"],
        ),
        "fresh": ([], ["--dst", "--out", *SRC_OPTIONS], ["--delete", "--src-may-be-dst"]),
        "s3list": ([("bucket",), ("prefix",)], ["--endpoint-url", "--out"], []),
        "s3pull": (
            [],
            ["--dst", "--manifest", "--bucket", "--prefix", "--only", "--endpoint-url", "--workers", "--out"],
            ["--record"],
        ),
        "relay": ([], ["--out", "--index"], []),
        "recv": ([], ["--hashes"], []),
        "probe": ([("addresses", "+")], ["--hop", "--remote", "--seconds", "--out"], []),
        "sink": ([], [], []),
    }
    for name, (positional, options, flags) in commands.items():
        p = sub.add_parser(name, add_help=False)
        for dest, *nargs in positional:
            p.add_argument(dest, nargs=nargs[0] if nargs else None)
        for opt in options:
            p.add_argument(
                opt,
                required=opt in ("--dst", "--manifest", "--hashes", "--hop", "--remote")
                or (name == "relay" and opt == "--out")
                or (name == "s3pull" and opt in ("--bucket", "--prefix", "--only")),
            )
        for flag in flags:
            p.add_argument(flag, action="store_true")
    return parser


def parse(argv: list[str]) -> tuple[str, dict]:
    """(command, its arguments). Values are taken whole, even when they start with '-' (a DST such as
    `-data`): every value option is joined to its value (`--dst=-data`) before argparse sees it, and
    positional values follow `--`."""
    if not argv:
        raise AgentError("no command", 2)
    takes_value = {
        "--workers",
        "--cache",
        "--out",
        "--dst",
        "--manifest",
        "--mark",
        "--received",
        "--stream-digest",
        "--endpoint-url",
        "--bucket",
        "--prefix",
        "--only",
        "--index",
        "--hashes",
        "--hop",
        "--remote",
        "--seconds",
        *SRC_OPTIONS,
    }
    joined, i = [], 0
    while i < len(argv):
        if argv[i] == "--":
            joined += argv[i:]
            break
        if argv[i] in takes_value and i + 1 < len(argv):
            joined.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
            continue
        joined.append(argv[i])
        i += 1
    ns = vars(_parser().parse_args(joined))
    cmd = ns.pop("cmd")
    return cmd, {k: v for k, v in ns.items() if v is not None and v is not False}


def main(argv: list[str]) -> int:
    args: dict = {}
    try:
        cmd, args = parse(argv)
        if cmd in ("relay", "recv", "sink"):
            return _stream({"relay": cmd_relay, "recv": cmd_recv, "sink": cmd_sink}[cmd], args)
        result = {
            "check": cmd_check,
            "fresh": cmd_fresh,
            "manifest": cmd_manifest,
            "s3list": cmd_s3list,
            "s3pull": cmd_s3pull,
            "probe": cmd_probe,
        }[cmd](args)
        _emit(result, args.get("out"))
        return 0
    except AgentError as exc:
        _emit({"error": str(exc), **({"hint": exc.hint} if exc.hint else {})}, args.get("out"))
        return exc.code
    except OSError as exc:
        _emit({"error": f"{exc.strerror or exc}: {exc.filename or ''}".strip()}, args.get("out"))
        return EXIT_FAILED


def _stream(fn, args: dict) -> int:
    """relay, recv and sink: stdout is the data (and relay's --out a fifo; sink's the probe's lines), so a
    failure is said on stderr."""
    try:
        fn(args)
        return 0
    except (AgentError, OSError) as exc:
        sys.stderr.write(f"clusterctl sync {fn.__name__[4:]}: {exc}\n")
        return getattr(exc, "code", EXIT_FAILED)


def _emit(result: dict, out: str | None) -> None:
    """The result as one JSON line on stdout, or, with --out, into that file (fetched by SFTP: no cap on
    its size, where the ssh output of a command keeps only its last MiBs) and a short line on stdout.
    Into --out, a result's "entries" (manifest, s3list) go one per line after the first line, which
    says how many ("lines"): the operator reads them one at a time too."""
    if out:
        entries = result.get("entries")
        if entries is None:
            write_lines(out, result, ())
        else:
            head = {k: v for k, v in result.items() if k != "entries"}
            write_lines(out, {**head, "lines": len(entries)}, entries)
        result = {"out": out, **{k: result[k] for k in ("error", "hint") if k in result}}
    sys.stdout.write(json.dumps(result, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
