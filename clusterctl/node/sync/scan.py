"""A folder's manifest: walked (symlinks not followed), every file hashed, the big ones in a thread pool; a
file whose stat key is the last run's keeps its sha256 unread (the scan cache). `sync manifest`."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, TypeVar

from clusterctl.node.sync.guard import boot_id, folder_id, resolve_root
from clusterctl.node.sync.manifest import (
    CHUNK,
    EXIT_INPUT,
    PARTIAL_DIR,
    STATE_DIR,
    AgentError,
    Args,
    Wire,
    atomic_write,
)


# ---- making a manifest ------------------------------------------------------------------------------
def sha256_file(path: str) -> str:
    return file_digest(path, "sha256")


def file_digest(path: str, algorithm: str) -> str:
    h = hashlib.new(algorithm)
    with open(path, "rb", buffering=0) as f:
        while b := f.read(CHUNK):
            h.update(b)
    return h.hexdigest()


T = TypeVar("T")
POOL_FROM = 1 << 20  # files this big are hashed in a thread pool; smaller ones in the calling thread


def map_by_size(fn: Callable[[Wire], T], entries: list[Wire], workers: int) -> list[T]:
    """[fn(e) for e in entries], the big files' calls spread over `workers` threads (hashlib lets go of the
    GIL on big updates). A small file's hand-off to a pool costs more than hashing it under the GIL's
    contention: 200,000 files of 4 kB took 14 s in a pool of 2 and 2.4 s in one thread."""
    out: list[Any] = [None] * len(entries)
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


def scan(root: str, workers: int = 4) -> list[Wire]:
    """Every directory, regular file and symlink under root (symlinks not followed), sorted by path."""
    return scan_reusing(root, {}, workers)[0]


def _stat_key(st: os.stat_result) -> str:
    # ctime cannot be set back by anyone: a write or chmod since the last run changes it whatever mtime says
    return f"{st.st_size} {st.st_mtime_ns} {st.st_ctime_ns} {st.st_ino} {st.st_dev}"


def scan_reusing(root: str, known: dict[str, str], workers: int = 4) -> tuple[list[Wire], dict[str, str], int]:
    """scan(), where a file whose stat key (size, mtime, ctime, inode, device) is the one in `known`
    (path -> "KEY SHA256", from the last run) keeps that sha256 unread. (entries, the new known, files hashed)."""
    entries, keys = walk(root)
    todo = reuse_known(entries, keys, known)
    hash_files(root, todo, workers)
    return entries, known_after(entries, keys), len(todo)


def walk(root: str) -> tuple[list[Wire], dict[str, str]]:
    """root listed, nothing read: (every entry sorted by path, files without their sha256 yet; every
    file's stat key, taken before its bytes are read, so a file changed meanwhile is hashed again next time)."""
    entries: list[Wire] = []
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


def reuse_known(entries: list[Wire], keys: dict[str, str], known: dict[str, str]) -> list[Wire]:
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


def hash_files(root: str, todo: list[Wire], workers: int) -> None:
    """Every entry of todo gets its file's sha256 ("h"), in place."""
    for e, h in zip(todo, map_by_size(lambda e: sha256_file(os.path.join(root, e["p"])), todo, workers)):
        e["h"] = h


def known_after(entries: list[Wire], keys: dict[str, str]) -> dict[str, str]:
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


def cmd_manifest(args: Args) -> Wire:
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
