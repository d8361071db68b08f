"""The local processes of a sync (tar | ssh pipelines, rsync with its progress), so Ctrl-C or an error
stops exactly those."""

from __future__ import annotations

import io
import re
import subprocess
import threading
from typing import Any, Callable

_PROGRESS = re.compile(r"^\s*([\d,]+)\s+\d+%")


def rsync_bytes(line: str) -> int | None:
    m = _PROGRESS.match(line)
    return int(m.group(1).replace(",", "")) if m else None


class Children:
    """The local processes a sync started, so Ctrl-C (or an error) stops exactly those."""

    def __init__(self) -> None:
        self._procs: set[subprocess.Popen[Any]] = set()
        self._lock = threading.Lock()

    def popen(self, argv: list[str], **kw: Any) -> subprocess.Popen[Any]:
        p = subprocess.Popen(argv, **kw)
        with self._lock:
            self._procs.add(p)
        return p

    def done(self, *procs: subprocess.Popen[Any]) -> None:
        with self._lock:
            for p in procs:
                self._procs.discard(p)

    def kill_all(self) -> None:
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                p.kill()


def run_pipeline(
    children: Children,
    producer: list[str],
    consumer: list[str],
    on_stderr: Callable[[str], None],
    timeout: float | None,
) -> int:
    """producer | consumer on this machine; the consumer's stderr lines go to on_stderr."""
    a = children.popen(producer, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    b = children.popen(consumer, stdin=a.stdout, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert a.stdout is not None and a.stderr is not None and b.stderr is not None  # PIPE: asked for above
    a_err = a.stderr
    a.stdout.close()
    errs: list[bytes] = []
    t = threading.Thread(target=lambda: errs.append(a_err.read()), daemon=True)
    t.start()
    try:
        for raw in iter(b.stderr.readline, b""):
            on_stderr(raw.decode(errors="replace").rstrip("\n"))
        rc = b.wait(timeout=timeout)
        a.wait(timeout=30)
        return rc
    except BaseException:
        for p in (a, b):
            p.kill()
        raise
    finally:
        children.done(a, b)


def run_rsync(
    children: Children, argv: list[str], progress: Callable[[int], None], timeout: float | None
) -> tuple[int, str]:
    """rsync on this machine, its --info=progress2 bytes to `progress`; (exit status, stderr)."""
    proc = children.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.stdout, proc.stderr
    assert isinstance(out, io.BufferedReader) and err is not None  # PIPE, buffered: asked for above
    errs: list[bytes] = []
    t = threading.Thread(target=lambda: errs.append(err.read()), daemon=True)
    t.start()
    try:
        buf = b""
        while chunk := out.read1(65536):
            buf += chunk
            *parts, buf = re.split(rb"[\r\n]", buf)
            for part in parts:
                done = rsync_bytes(part.decode(errors="replace"))
                if done is not None:
                    progress(done)
        rc = proc.wait(timeout=timeout)
        t.join(timeout=10)
        return rc, b"".join(errs).decode(errors="replace")
    except BaseException:
        proc.kill()
        raise
    finally:
        children.done(proc)
