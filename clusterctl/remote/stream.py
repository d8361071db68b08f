"""Reading one ssh channel: its output captured (the tail, within MAX_CAPTURE) and handed out line by line
as it comes, the session-id marker line stripped, the deadline and Ctrl-C checked on every turn.
"""

from __future__ import annotations

import select
import threading
import time
from typing import TYPE_CHECKING, Callable

from clusterctl.remote.session import SID_MARK

if TYPE_CHECKING:
    import paramiko

OnLine = Callable[[str, str, str], None]  # (host label, "stdout"|"stderr", line without newline)
MAX_CAPTURE = 4 * 1024 * 1024  # per stream per host; the tail is kept beyond that
MAX_LINE = 64 * 1024  # an unfinished line is cut (delivered in pieces) beyond this
EOF_GRACE = 5.0  # after the exit status, how long a silent channel may keep us waiting for its EOF


def pump(  # noqa: C901 (one select loop over stdout, stderr, timeout, cancel and exit status)
    chan: paramiko.Channel,
    label: str,
    on_line: OnLine | None,
    timeout: float | None,
    start: float,
    cancel: threading.Event,
    sid: list[int] | None = None,
) -> tuple[str, str, bool]:
    """Read one channel to its end (or `timeout` seconds after `start`, or `cancel`): (stdout, stderr,
    timed out). Each finished line goes to `on_line` as it comes; a `sid` list receives the session id
    from the wrapper's marker line (remote/session.py), which is stripped from stderr."""
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    partial = {"stdout": b"", "stderr": b""}
    mark = SID_MARK.encode()
    head = bytearray() if sid is not None else None  # stderr held back until the marker line is seen

    def feed(stream: str, data: bytes) -> None:
        nonlocal head
        if stream == "stderr" and head is not None:
            head += data
            while head is not None and b"\n" in head:
                line, _, rest = bytes(head).partition(b"\n")
                if sid is not None and line.startswith(mark):  # head is held back only when sid is given
                    try:
                        sid.append(int(line[len(mark) :]))
                    except ValueError:
                        pass
                    data, head = rest, None
                else:  # something printed before our marker (a login script): pass it through
                    head = bytearray(rest)
                    _deliver(stream, line + b"\n")
            if head is not None:
                if len(head) > 65536:  # no marker is coming
                    data, head = bytes(head), None
                else:
                    return
        _deliver(stream, data)

    def _deliver(stream: str, data: bytes) -> None:
        buf = bufs[stream]
        buf += data
        if len(buf) > MAX_CAPTURE:
            del buf[: len(buf) - MAX_CAPTURE]
        if on_line is not None:
            text = partial[stream] + data
            *lines, rest = text.split(b"\n")
            while len(rest) > MAX_LINE:  # a line without end: delivered in pieces, never held whole
                lines.append(rest[:MAX_LINE])
                rest = rest[MAX_LINE:]
            partial[stream] = rest
            for line in lines:
                on_line(label, stream, line.decode(errors="replace"))

    def finish(timed_out: bool) -> tuple[str, str, bool]:
        if head:
            _deliver("stderr", bytes(head))
        return _flush(bufs, partial, on_line, label) + (timed_out,)

    quiet_since = None  # exit status seen, no data since: OpenSSH may send the status before the last output
    while True:
        # deadline and Ctrl-C first, on every turn: a command that never stops printing still stops
        if timeout is not None and time.monotonic() - start > timeout:
            return finish(True)
        if cancel.is_set():
            return finish(False)
        if chan.recv_ready():
            feed("stdout", chan.recv(65536))
            quiet_since = None
            continue
        if chan.recv_stderr_ready():
            feed("stderr", chan.recv_stderr(65536))
            quiet_since = None
            continue
        if chan.closed or chan.eof_received and chan.exit_status_ready():
            break
        if chan.eof_received and chan.get_transport() is not None and not chan.get_transport().is_active():
            break
        if chan.exit_status_ready():  # wait for EOF too; a silent background holder of stdout ends the wait
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since > EOF_GRACE:
                break
        select.select([chan], [], [], 0.1)
    return finish(False)


def _flush(
    bufs: dict[str, bytearray], partial: dict[str, bytes], on_line: OnLine | None, label: str
) -> tuple[str, str]:
    if on_line is not None:
        for stream in ("stdout", "stderr"):
            if partial[stream]:
                on_line(label, stream, partial[stream].decode(errors="replace"))
    return bufs["stdout"].decode(errors="replace"), bufs["stderr"].decode(errors="replace")
