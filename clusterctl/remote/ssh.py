"""Fan-out over SSH: one process holding many paramiko connections, with a bounded sliding window.

Never raises halfway: every host ends as a HostResult in a RunReport; the caller decides. stdin is closed,
no agent is forwarded, nothing ever prompts. The parts, one job each:
    targets.py   SshTarget / SshSettings, and the targets of a hosts file through the user's ssh config
    connect.py   dialling one host: TCP or a jump host, the pinned host key, public-key auth, one-line errors
    session.py   the remote wrapper that reports the session id, and the kill of a session's process tree
    stream.py    reading one channel: captured output, lines as they come, deadline and Ctrl-C
    ssh.py       SshPool: connections kept and reused, one command or one file put per host, the fan-out
A timeout or Ctrl-C kills the whole remote process tree (the session and every descendant of it), not just
the channel.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from clusterctl.remote.connect import connect, describe_connect_error, host_keys, still_pinned
from clusterctl.remote.session import kill_command, wrap_command
from clusterctl.remote.stream import OnLine, pump
from clusterctl.remote.targets import SshSettings, SshTarget
from clusterctl.types import HostResult, RunReport

if TYPE_CHECKING:
    import paramiko  # imported when the first connection is made

# A failed connect is a HostResult here; paramiko's transport thread would also print its traceback on
# stderr (logging's last resort) before the one-line error.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a fan-out, after the remote commands were stopped: what became of each host."""

    def __init__(self, report: RunReport):
        super().__init__()
        self.report = report

    def summary(self) -> str:
        left = [r.host for r in self.report if r.error and "may remain" in r.error]
        if left:
            return f"remote processes may remain on {', '.join(left)}"
        return f"the command was stopped on every host ({len(self.report)})"


class SshPool:
    """Connections kept open for the life of the pool, reused by every call through it.

    Thread-safe: one connect at a time per target (others to the same target wait and share it),
    any number of targets at once. A cached connection is reused only while its server key is still
    the one pinned in known_hosts (re-read by `recheck_host_keys`), so a changed pin is never bypassed.
    """

    def __init__(self, settings: SshSettings):
        self.settings = settings
        self._clients: dict[tuple[SshTarget], paramiko.SSHClient] = {}
        self._locks: dict[tuple[SshTarget], threading.Lock] = {}
        # a failed dial, shared by the callers of one fan-out (a dead jump host is dialled once), forgotten after
        # a connect timeout so that a later call re-dials (a leader that rebooted is reached again)
        self._failed: dict[tuple[SshTarget], tuple[BaseException, float]] = {}
        self._lock = threading.Lock()
        self.cancel = threading.Event()

    def __enter__(self) -> "SshPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                c.close()
            except Exception:
                pass

    def __len__(self) -> int:
        with self._lock:
            return len(self._clients)

    @staticmethod
    def _key(target: SshTarget) -> tuple[SshTarget]:
        return (replace(target, label=""),)  # everything but the label decides the connection

    def client(self, target: SshTarget) -> paramiko.SSHClient:
        key = self._key(target)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                c = self._clients.get(key)
                failed = self._failed.get(key)
            if c is not None and c.get_transport() is not None and c.get_transport().is_active():
                return c
            if failed is not None and time.monotonic() - failed[1] < self.settings.connect_timeout:
                raise failed[0]
            try:
                c = self._connect(target)
            except Exception as exc:
                with self._lock:
                    self._failed[key] = (exc, time.monotonic())
                raise
            with self._lock:
                self._clients[key] = c
            return c

    def _drop(self, target: SshTarget, client: paramiko.SSHClient) -> None:
        with self._lock:
            if self._clients.get(self._key(target)) is client:
                del self._clients[self._key(target)]
        try:
            client.close()
        except Exception:
            pass

    def recheck_host_keys(self) -> int:
        """Drop cached connections whose server key is no longer the one pinned in known_hosts (or whose
        transport died). Returns how many were dropped. Cheap: one read of the file."""
        files: dict[tuple[str, ...], paramiko.HostKeys] = {}
        dropped = []
        with self._lock:
            for key, c in list(self._clients.items()):
                target = key[0]
                kh = target.known_hosts or (self.settings.known_hosts,)
                if kh not in files:
                    files[kh] = host_keys(kh)
                if not still_pinned(c, target, files[kh]):
                    dropped.append(self._clients.pop(key))
        for c in dropped:
            try:
                c.close()
            except Exception:
                pass
        return len(dropped)

    def _connect(self, target: SshTarget) -> paramiko.SSHClient:
        return connect(target, self.settings, self.client)  # a jump host's connection is kept here too

    # ---- one host ----------------------------------------------------------------------------------
    def run_one(
        self,
        target: SshTarget,
        command: str,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        stdin: bytes | None = None,
        cancel: threading.Event | None = None,
    ) -> HostResult:
        cancel = cancel if cancel is not None else self.cancel
        start = time.monotonic()
        try:
            client = self.client(target)
        except Exception as exc:  # every failure to connect is a value, never an exception
            return HostResult(
                target.label, None, error=describe_connect_error(target, exc), duration_s=time.monotonic() - start
            )
        if cancel.is_set():
            return HostResult(
                target.label, None, error="interrupted before it started", duration_s=time.monotonic() - start
            )
        sid: list[int] = []
        try:
            try:
                chan = client.get_transport().open_session(timeout=self.settings.connect_timeout)
            except Exception as first:  # a kept connection whose host went away (or rebooted) since: dial once more
                transport = client.get_transport()
                self._drop(target, client)
                if transport is not None and transport.is_active():  # alive but silent: no second wait
                    return HostResult(
                        target.label,
                        None,
                        error=f"connection lost: {describe_connect_error(target, first)}",
                        duration_s=time.monotonic() - start,
                    )
                try:
                    client = self.client(target)
                    chan = client.get_transport().open_session(timeout=self.settings.connect_timeout)
                except Exception as exc:
                    return HostResult(
                        target.label,
                        None,
                        error=describe_connect_error(target, exc),
                        duration_s=time.monotonic() - start,
                    )
            chan.exec_command(wrap_command(command) if stdin is None else command)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, timed_out = pump(
                chan, target.label, on_line, timeout, start, cancel, sid if stdin is None else None
            )
            if timed_out or cancel.is_set():
                chan.close()
                left = self._kill(client, sid[0]) if sid else "its session id never arrived"
                why = (f"timed out after {timeout:g}s" if timed_out else "interrupted") + (
                    f"; remote processes may remain: {left}" if left else "; remote processes killed"
                )
                return HostResult(
                    target.label, None, out, err, error=why, timed_out=timed_out, duration_s=time.monotonic() - start
                )
            code = chan.recv_exit_status()
            chan.close()
            if code == -1:  # the channel closed without an exit status: the connection died
                return HostResult(
                    target.label,
                    None,
                    out,
                    err,
                    error="connection lost before the command finished",
                    duration_s=time.monotonic() - start,
                )
            return HostResult(target.label, code, out, err, duration_s=time.monotonic() - start)
        except Exception as exc:
            return HostResult(
                target.label, None, error=f"connection lost: {exc}"[:300], duration_s=time.monotonic() - start
            )

    def _kill(self, client: paramiko.SSHClient, sid: int) -> str:
        """Kill the remote session and its descendants; '' when verified gone, else why not."""
        try:
            # bounded like a connect: a host that went silent must not hold the whole run much longer
            chan = client.get_transport().open_session(timeout=min(5.0, self.settings.connect_timeout))
            chan.settimeout(max(10.0, self.settings.connect_timeout))
            chan.exec_command(kill_command(sid))
            chan.shutdown_write()
            err = b""
            while not chan.exit_status_ready() or chan.recv_stderr_ready():
                data = chan.recv_stderr(4096)
                if not data and chan.exit_status_ready():
                    break
                err += data
            code = chan.recv_exit_status()
            chan.close()
            return "" if code == 0 else (err.decode(errors="replace").strip() or f"kill exited {code}")
        except Exception as exc:
            return f"could not run the kill ({exc.__class__.__name__})"

    def put_one(self, target: SshTarget, files: Mapping[str, tuple[bytes, int]]) -> HostResult:
        """Write files (path relative to the login home, or absolute) atomically: temp name, then rename."""
        start = time.monotonic()
        try:
            client = self.client(target)
            sftp = client.open_sftp()
            try:
                for path, (data, mode) in files.items():
                    parent = os.path.dirname(path)
                    if parent:
                        _sftp_makedirs(sftp, parent)
                    tmp = f"{path}.clusterctl-tmp"
                    _sftp_write_new(sftp, tmp, data, mode)
                    sftp.chmod(tmp, mode)  # a server umask may have taken bits the mode asks for
                    sftp.posix_rename(tmp, path)
            finally:
                sftp.close()
            return HostResult(target.label, 0, duration_s=time.monotonic() - start)
        except Exception as exc:
            return HostResult(
                target.label, None, error=describe_connect_error(target, exc), duration_s=time.monotonic() - start
            )

    # ---- many hosts --------------------------------------------------------------------------------
    def run(
        self,
        targets: Sequence[SshTarget],
        command: str | Callable[[SshTarget], str],
        *,
        parallel: int = 64,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        cancel: threading.Event | None = None,
    ) -> RunReport:
        def one(t: SshTarget) -> HostResult:
            return self.run_one(t, command(t) if callable(command) else command, timeout, on_line, cancel=cancel)

        return self.fan_out(targets, one, parallel, cancel=cancel)

    def put(
        self,
        targets: Sequence[SshTarget],
        files: Mapping[str, tuple[bytes, int]] | Callable[[SshTarget], Mapping[str, tuple[bytes, int]]],
        parallel: int = 64,
    ) -> RunReport:
        return self.fan_out(targets, lambda t: self.put_one(t, files(t) if callable(files) else files), parallel)

    def fan_out(
        self,
        targets: Sequence[SshTarget],
        fn: Callable[[SshTarget], HostResult],
        parallel: int,
        cancel: threading.Event | None = None,
    ) -> RunReport:
        """Bounded window over hosts; Ctrl-C cancels every host (killing remote commands) and re-raises."""
        with self._lock:
            self._failed.clear()
        results: dict[str, HostResult] = {}
        pool = ThreadPoolExecutor(max_workers=max(1, min(parallel, len(targets) or 1)))
        futures = {pool.submit(fn, t): t for t in targets}
        try:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.2)
                for f in done:
                    results[futures[f].label] = f.result()
        except KeyboardInterrupt:
            self.cancel.set()
            if cancel is not None:
                cancel.set()
            wait(futures, timeout=30)  # workers see the event, kill their remote commands, return
            pool.shutdown(wait=False, cancel_futures=True)
            for f, t in futures.items():
                if t.label not in results:
                    results[t.label] = (
                        f.result()
                        if f.done() and not f.cancelled()
                        else HostResult(t.label, None, error="interrupted; remote processes may remain")
                    )
            raise Interrupted(RunReport(tuple(results[t.label] for t in targets))) from None
        pool.shutdown(wait=True)
        return RunReport(tuple(results[t.label] for t in targets))


def _sftp_write_new(sftp: paramiko.SFTPClient, path: str, data: bytes, mode: int) -> None:
    """Write `data` to a new file created with `mode` (within the server's umask) from its first byte: SFTP's
    OPEN carries the permissions (OpenSSH's sftp-server creates the file with them), where paramiko's open()
    sends none (the server's default, 0666 less its umask, until a chmod after). A file left at the path by
    an earlier attempt is removed first, since O_EXCL then refuses it rather than keep its mode."""
    from paramiko.sftp import CMD_HANDLE, CMD_OPEN, SFTP_FLAG_CREATE, SFTP_FLAG_EXCL, SFTP_FLAG_WRITE, SFTPError
    from paramiko.sftp_attr import SFTPAttributes
    from paramiko.sftp_file import SFTPFile

    try:
        sftp.remove(path)
    except IOError:
        pass
    attrs = SFTPAttributes()
    attrs.st_mode = mode
    # paramiko has no public call that sends the attributes with OPEN: its open(), with them filled in
    kind, msg = sftp._request(CMD_OPEN, path, SFTP_FLAG_WRITE | SFTP_FLAG_CREATE | SFTP_FLAG_EXCL, attrs)
    if kind != CMD_HANDLE:
        raise SFTPError("Expected handle")
    with SFTPFile(sftp, msg.get_binary(), "wb") as f:
        f.set_pipelined(True)
        f.write(data)


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = [p for p in path.split("/") if p]
    current = "/" if path.startswith("/") else ""
    for part in parts:
        current = f"{current}{part}" if current in ("", "/") else f"{current}/{part}"
        try:
            sftp.stat(current)
        except IOError:
            sftp.mkdir(current, mode=0o700)
