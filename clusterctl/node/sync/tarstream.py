"""The hashed tar stream (`sync recv`): a tar stream passed on unchanged while every member is hashed as it
goes by, and the stream's digest (stream_digest: one record per member, in stream order) that proves a
fresh copy without reading it back."""

from __future__ import annotations

import hashlib
import json
import os
import zlib
from typing import Any, Iterable

from clusterctl.node.sync.manifest import CHUNK, AgentError, Args, ManifestEntry, atomic_write

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

    def __init__(self) -> None:
        self.hashes: dict[str, list[Any]] = {}  # path -> [sha256, size, mtime]
        self.stream = hashlib.sha256()  # of every member's record (stream_digest's)
        self.files = self.bytes = 0
        self.done = False
        self._hdr = bytearray()
        self._left = self._pad = 0
        self._sink: hashlib._Hash | bytearray | None = None  # long name or pax: bytearray; skipped: None
        self._member: tuple[Any, ...] | None = None
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
        assert not isinstance(sink, bytearray)  # a member's own sink: a sha256, or None
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


def cmd_recv(args: Args) -> None:
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
