"""One writer per DST: a sync's lease on the folder, a kernel lock held by one process for the whole run.

`lease` judges DST (guard.safe_root) and says so in one JSON line; only when the operator answers `take` (every
node judged it: a refusal on one leaves nothing made on the others) does it take flock(LOCK_EX) on
DST/.clusterctl-sync/lease, write who holds it into that file (the run's id, the operator's user, host and pid,
this process's pid and the node's boot id, since when), print a second line and then hold the lock while the
operator keeps its ssh channel open, reading a heartbeat line every few seconds. EOF (the operator exited, was
killed, or hit Ctrl-C: sshd closes the pipe) or HEARTBEAT_TIMEOUT seconds of silence (the operator's machine
vanished) ends the process, and the kernel drops the lock with it.

Why a kernel lock rather than a lock file with a heartbeat someone must judge: nothing is ever stale by
guesswork. A holder that died (kill -9, a reboot, a lost connection) holds nothing, whatever the file still
says; the file's text only names the holder for the refusal. A second run is refused (exit 4) with that text.

`check --mark --lease ID` writes COMPLETE only while the lease is still held and held by run ID: the marker
vouches for a manifest checked against DST with no other writer in it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import select
import socket
import sys
import time
from typing import IO, Optional

from clusterctl.node.sync.guard import boot_id, safe_root
from clusterctl.node.sync.manifest import STATE_DIR, AgentError, Args, Wire

LEASE = "lease"  # in STATE_DIR
EXIT_BUSY = 4  # another run holds DST
HEARTBEAT_TIMEOUT = 60.0  # seconds without a line from the operator: the lease is let go


def _open(root: str) -> int:
    state = os.path.join(root, STATE_DIR)
    try:
        os.makedirs(state, exist_ok=True)
        return os.open(os.path.join(state, LEASE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise AgentError(f"cannot write {state}: {exc.strerror}") from None


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _holder(fd: int) -> Wire:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = json.loads(os.read(fd, 65536) or b"{}")
    except ValueError:
        data = {}
    return data if isinstance(data, dict) else {}


def describe(holder: Wire) -> str:
    """The holder as the refusal names it: `sync ID from USER@HOST (pid PID) since HH:MM:SS UTC`."""
    since = holder.get("since")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(since)) if isinstance(since, (int, float)) else "?"
    return (
        f"sync {holder.get('id', '?')} from {holder.get('user', '?')}@{holder.get('host', '?')} "
        f"(pid {holder.get('pid', '?')}) since {when}"
    )


def take(root: str, me: Wire) -> "tuple[Optional[int], Wire]":
    """(the locked fd, or None when another process of this same run holds it: a folder the nodes share),
    and the result line. Refused (exit 4) when another run holds DST."""
    fd = _open(root)
    if not _try_lock(fd):
        other = _holder(fd)
        os.close(fd)
        if other.get("id") and other.get("id") == me.get("id"):
            return None, {"held": root, "shared": True}
        raise AgentError(
            f"{root} is being written by another {describe(other)}",
            EXIT_BUSY,
            "wait for it to end and run this sync again (or stop that one first: Ctrl-C where it runs)",
        )
    stale = _holder(fd)  # a holder that no longer holds the lock: it died, its run ended
    info = {**me, "node_pid": os.getpid(), "boot": boot_id(), "node": socket.gethostname(), "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(info, sort_keys=True) + "\n").encode(), 0)
    os.fsync(fd)
    return fd, {"held": root, **({"stale": describe(stale)} if stale.get("id") else {})}


def _line(stdin: IO[bytes], timeout: float) -> "Optional[bytes]":
    """The next line of stdin; None at its end or after `timeout` seconds without one."""
    ready, _, _ = select.select([stdin], [], [], timeout)
    return stdin.readline() or None if ready else None


def _say(result: Wire) -> None:
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


def cmd_lease(args: Args) -> None:
    """DST judged (safe_root) and said ({"judged"}), nothing made in it until the operator answers `take`
    (every node judged it first: a refusal on one leaves nothing on the others); then the lease taken and
    said ({"held"}, or a refusal naming the holder), held while the operator is there, let go."""
    timeout = float(args.get("heartbeat_timeout") or HEARTBEAT_TIMEOUT)
    stdin = os.fdopen(sys.stdin.fileno(), "rb", buffering=0, closefd=False)  # select sees every byte not read yet
    try:
        root, _ = safe_root(args)
        try:
            me = json.loads(args.get("holder") or "{}")
        except ValueError:
            raise AgentError("--holder is not JSON", 2) from None
        _say({"judged": root})
        if _line(stdin, timeout) != b"take\n":
            return
        fd, result = take(root, me)
    except AgentError as exc:
        _say({"error": str(exc), "hint": exc.hint})
        raise
    _say(result)
    try:
        while _line(stdin, timeout) is not None:  # a heartbeat
            pass
    finally:
        if fd is not None:
            os.ftruncate(fd, 0)  # released: the next holder finds no name in it
            os.close(fd)


def still_held(root: str, lease_id: str) -> None:
    """Refuse (exit 1) unless DST's lease is held right now, by run `lease_id` (before COMPLETE is written)."""
    fd = _open(root)
    try:
        if _try_lock(fd):  # nobody holds it: the run's own lease ended (its process or connection died)
            fcntl.flock(fd, fcntl.LOCK_UN)
            raise AgentError(f"the lease on {root} was lost during the run: not marked complete")
        holder = _holder(fd)
        if holder.get("id") != lease_id:
            raise AgentError(f"{root} is held by another {describe(holder)}: not marked complete")
    finally:
        os.close(fd)
