"""A copy checked against its manifest (`sync check`, `sync fresh`): entries of the wrong kind removed,
files read back unless their hash as written (recv) proves them, extras deleted with --delete, and the
completion marker written last, only when everything matched."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import time
from typing import Any, Iterable, NamedTuple

from clusterctl.node.sync.guard import safe_root
from clusterctl.node.sync.lease import still_held
from clusterctl.node.sync.manifest import (
    CHUNK,
    MANIFEST_VERSION,
    MARKER,
    NOT_GZIP,
    OLD_SAVED,
    PARTIAL_DIR,
    SAVED,
    STATE_DIR,
    AgentError,
    Args,
    ManifestReader,
    Wire,
    atomic_write,
    manifest_version,
    not_gzip,
    open_manifest,
    temp_beside,
)
from clusterctl.node.sync.scan import file_digest, map_by_size, sha256_file


# ---- checking a copy --------------------------------------------------------------------------------
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
        return file_digest(path, "md5") == etag
    count = int(etag.rsplit("-", 1)[1])
    if count == 1:
        candidates = [size]
    else:
        lo, hi = -(-size // count), (size - 1) // (count - 1)
        mib = 1 << 20
        candidates = [m * mib for m in range(-(-lo // mib), hi // mib + 1)][:16] or [lo]
    return any(_multipart_etag(path, p) == etag for p in candidates)


def entry_ok(root: str, e: Wire) -> bool:
    """Whether the file at e's path is exactly e (content checked, not size and time)."""
    full = os.path.join(root, e["p"])
    if "h" in e:
        return bool(sha256_file(full) == e["h"])
    if e.get("sha256b64"):
        return bool(base64.b64encode(bytes.fromhex(sha256_file(full))).decode() == e["sha256b64"])
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


def check(
    root: str, entries: Iterable[Wire], delete: bool, workers: int, received: dict[str, list[Any]] | None = None
) -> Checked:
    """DST against the entries, walked once as they come (a ManifestReader: never a list). Entries of
    the wrong type are removed (a file where a directory belongs, a link in place of a file), so the copy
    can put the right one. A file in `received` (recv's {path: [sha256, size, mtime]}) whose sha256 as
    written is the manifest's, and whose size and mtime are still those tar wrote, is not read back: its
    hash says it is right, or wrong. Held meanwhile: the bad paths, the files still to read back, and for
    --delete the set of every path (what is not in it goes, once the whole manifest was read)."""
    received = received or {}
    bad: list[str] = []
    bad_bytes = good_bytes = files = total = 0
    to_hash: list[Wire] = []
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


def cmd_check(args: Args) -> Wire:
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
        if args.get("lease"):  # no other writer was in DST while it was checked, nor is now
            still_held(root, args["lease"])
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


def cmd_fresh(args: Args) -> Wire:
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


def load_received(path: str, head_only: bool = False) -> tuple[Wire, dict[str, list[Any]]]:
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
