"""The chain's pipes on a node: `sync relay` (stdin to stdout and the next hop at once, zero-copy), and the
fan-out probe (`sync probe` streams throwaway bytes to many `sync sink`s at once and reads their counts)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from clusterctl.node.sync.manifest import CHUNK, AgentError, Args, Wire


# ---- relay ------------------------------------------------------------------------------------------
def cmd_relay(args: Args) -> Wire | None:  # noqa: C901 (tee/splice with a read/write fallback and the stall reporter: one copy loop)
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

    state: dict[str, Any] = {"what": "run", "since": time.monotonic()}

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
def cmd_sink(args: Args) -> None:
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


def cmd_probe(args: Args) -> Wire:
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

    def said(p: subprocess.Popen[bytes], a: str, what: str, wait: float) -> bytes:
        assert p.stdout is not None and p.stderr is not None  # both PIPE
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
