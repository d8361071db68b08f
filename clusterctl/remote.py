"""Fan-out over SSH: one process holding many paramiko connections, with a bounded sliding window.

Never raises halfway: every host ends as a HostResult in a RunReport; the caller decides. Host keys
come only from the pinned known_hosts given (RejectPolicy: an unknown or changed key is refused and
named). stdin is closed, no agent is forwarded, nothing ever prompts.

Every command runs inside a small wrapper that records the remote session id, so a timeout or Ctrl-C
kills the whole remote process tree (pkill -s), not just the channel.
"""

from __future__ import annotations

import getpass
import io
import os
import select
import shlex
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from clusterctl.hostsfile import validate_host
from clusterctl.types import HostResult, RunReport

OnLine = Callable[[str, str, str], None]  # (host label, "stdout"|"stderr", line without newline)
MAX_CAPTURE = 4 * 1024 * 1024  # per stream per host; the tail is kept beyond that


@dataclass(frozen=True)
class SshTarget:
    label: str  # what the user calls the host (hosts-file token); used in output
    hostname: str  # what is dialled
    port: int = 22
    user: str = "root"
    identity_files: tuple[str, ...] = ()
    proxy_jump: "SshTarget | None" = None


@dataclass(frozen=True)
class SshSettings:
    known_hosts: str  # the only source of trusted host keys
    connect_timeout: float = 10.0
    allow_agent: bool = False  # use a local agent for auth (never forwarded)


def user_known_hosts() -> str:
    return str(Path.home() / ".ssh" / "known_hosts")


def targets_from_hosts(
    hosts: Sequence[str],
    *,
    user: str | None = None,
    port: int | None = None,
    identity: Sequence[str] = (),
    ssh_config: str | None = None,
) -> list[SshTarget]:
    """Targets for a plain hosts file, honouring ~/.ssh/config (Host aliases, User, Port, IdentityFile,
    ProxyJump) the way `ssh HOST` would. Explicit flags win over the config."""
    import paramiko

    path = Path(ssh_config).expanduser() if ssh_config else Path.home() / ".ssh" / "config"
    cfg = paramiko.SSHConfig.from_path(str(path)) if path.is_file() else paramiko.SSHConfig()

    def resolve(spec: str, depth: int = 0) -> SshTarget:
        u, _, rest = spec.rpartition("@") if "@" in spec else (None, "", spec)
        alias, _, p = rest.partition(":")
        validate_host(alias, "host")
        opts = cfg.lookup(alias)
        jump = None
        if opts.get("proxyjump") and opts["proxyjump"].lower() != "none" and depth < 5:
            jump = resolve(opts["proxyjump"].split(",")[0].strip(), depth + 1)
        ids = tuple(identity) or tuple(os.path.expanduser(i) for i in opts.get("identityfile", []) if os.path.exists(os.path.expanduser(i)))
        return SshTarget(
            label=alias,
            hostname=opts.get("hostname", alias),
            port=int(p or (port if depth == 0 and port else None) or opts.get("port", 22)),
            user=(u or (user if depth == 0 else None) or opts.get("user") or getpass.getuser()),
            identity_files=ids,
            proxy_jump=jump,
        )

    return [resolve(h) for h in hosts]


# ---- the remote wrapper ----------------------------------------------------------------------------
_RUN_DIR = '"$HOME/.clusterctl/run"'


def wrap_command(command: str, token: str) -> str:
    """Run `command` in the login shell, recording this ssh session's id so it can be killed whole."""
    pidfile = f'"$HOME/.clusterctl/run/{token}"'
    return (
        f"mkdir -p {_RUN_DIR} && echo $$ > {pidfile}; "
        f'"${{SHELL:-/bin/sh}}" -c {shlex.quote(command)} </dev/null; '
        f"rc=$?; rm -f {pidfile}; exit $rc"
    )


def kill_command(token: str) -> str:
    pidfile = f'"$HOME/.clusterctl/run/{token}"'
    return f'if [ -f {pidfile} ]; then pkill -KILL -s "$(cat {pidfile})"; rm -f {pidfile}; fi'


# ---- connections -----------------------------------------------------------------------------------
class SshPool:
    """Connections kept open for the life of the pool, reused by every call through it."""

    def __init__(self, settings: SshSettings):
        self.settings = settings
        self._clients: dict[SshTarget, object] = {}
        self._lock = threading.Lock()
        self.cancel = threading.Event()

    def __enter__(self) -> "SshPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            try:
                c.close()
            except Exception:
                pass

    def client(self, target: SshTarget):
        with self._lock:
            c = self._clients.get(target)
        if c is not None and c.get_transport() is not None and c.get_transport().is_active():
            return c
        c = self._connect(target)
        with self._lock:
            self._clients[target] = c
        return c

    def _connect(self, target: SshTarget):
        import paramiko

        ct = self.settings.connect_timeout
        sock = None
        if target.proxy_jump is not None:
            jump = self.client(target.proxy_jump)
            sock = jump.get_transport().open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=ct
            )
        client = paramiko.SSHClient()
        if os.path.exists(self.settings.known_hosts):
            client.load_host_keys(self.settings.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=list(target.identity_files) or None,
            timeout=ct,
            banner_timeout=ct,
            auth_timeout=ct,
            channel_timeout=ct,
            allow_agent=self.settings.allow_agent,
            look_for_keys=not target.identity_files,
            sock=sock,
        )
        return client

    # ---- one host ----------------------------------------------------------------------------------
    def run_one(self, target: SshTarget, command: str, timeout: float | None = None,
                on_line: OnLine | None = None, stdin: bytes | None = None) -> HostResult:
        start = time.monotonic()
        try:
            client = self.client(target)
        except Exception as exc:  # every failure to connect is a value, never an exception
            return HostResult(target.label, None, error=describe_connect_error(target, exc),
                              duration_s=time.monotonic() - start)
        token = uuid.uuid4().hex[:16]
        try:
            chan = client.get_transport().open_session(timeout=self.settings.connect_timeout)
            chan.exec_command(wrap_command(command, token) if stdin is None else command)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err, timed_out = _pump(chan, target.label, on_line, timeout, start, self.cancel)
            if timed_out or self.cancel.is_set():
                chan.close()
                self._kill(client, token)
                return HostResult(target.label, None, out, err, error="timed out" if timed_out else "interrupted",
                                  timed_out=timed_out, duration_s=time.monotonic() - start)
            code = chan.recv_exit_status()
            chan.close()
            return HostResult(target.label, code, out, err, duration_s=time.monotonic() - start)
        except Exception as exc:
            return HostResult(target.label, None, error=f"connection lost: {exc}"[:300],
                              duration_s=time.monotonic() - start)

    def _kill(self, client, token: str) -> None:
        try:
            chan = client.get_transport().open_session(timeout=5)
            chan.exec_command(kill_command(token))
            chan.settimeout(5)
            chan.recv_exit_status()
            chan.close()
        except Exception:
            pass

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
                    sftp.putfo(io.BytesIO(data), tmp)
                    sftp.chmod(tmp, mode)
                    sftp.posix_rename(tmp, path)
            finally:
                sftp.close()
            return HostResult(target.label, 0, duration_s=time.monotonic() - start)
        except Exception as exc:
            return HostResult(target.label, None, error=describe_connect_error(target, exc),
                              duration_s=time.monotonic() - start)

    # ---- many hosts --------------------------------------------------------------------------------
    def run(self, targets: Sequence[SshTarget], command: str | Callable[[SshTarget], str], *,
            parallel: int = 64, timeout: float | None = None, on_line: OnLine | None = None) -> RunReport:
        def one(t: SshTarget) -> HostResult:
            return self.run_one(t, command(t) if callable(command) else command, timeout, on_line)

        return self.fan_out(targets, one, parallel)

    def put(self, targets: Sequence[SshTarget], files: Mapping[str, tuple[bytes, int]] | Callable[[SshTarget], Mapping[str, tuple[bytes, int]]],
            parallel: int = 64) -> RunReport:
        return self.fan_out(targets, lambda t: self.put_one(t, files(t) if callable(files) else files), parallel)

    def fan_out(self, targets: Sequence[SshTarget], fn: Callable[[SshTarget], HostResult], parallel: int) -> RunReport:
        """Bounded window over hosts; Ctrl-C cancels every host (killing remote commands) and re-raises."""
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
            wait(futures, timeout=10)  # workers see the event, kill their remote commands, return
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
        return RunReport(tuple(results[t.label] for t in targets))


def _pump(chan, label: str, on_line: OnLine | None, timeout: float | None, start: float,
          cancel: threading.Event) -> tuple[str, str, bool]:
    bufs = {"stdout": bytearray(), "stderr": bytearray()}
    partial = {"stdout": b"", "stderr": b""}

    def feed(stream: str, data: bytes) -> None:
        buf = bufs[stream]
        buf += data
        if len(buf) > MAX_CAPTURE:
            del buf[: len(buf) - MAX_CAPTURE]
        if on_line is not None:
            text = partial[stream] + data
            *lines, partial[stream] = text.split(b"\n")
            for line in lines:
                on_line(label, stream, line.decode(errors="replace"))

    while True:
        if chan.recv_ready():
            feed("stdout", chan.recv(65536))
            continue
        if chan.recv_stderr_ready():
            feed("stderr", chan.recv_stderr(65536))
            continue
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed or chan.eof_received and chan.exit_status_ready():
            break
        if timeout is not None and time.monotonic() - start > timeout:
            return _flush(bufs, partial, on_line, label) + (True,)
        if cancel.is_set():
            return _flush(bufs, partial, on_line, label) + (False,)
        select.select([chan], [], [], 0.1)
    return _flush(bufs, partial, on_line, label) + (False,)


def _flush(bufs, partial, on_line, label) -> tuple[str, str]:
    if on_line is not None:
        for stream in ("stdout", "stderr"):
            if partial[stream]:
                on_line(label, stream, partial[stream].decode(errors="replace"))
    return bufs["stdout"].decode(errors="replace"), bufs["stderr"].decode(errors="replace")


def _sftp_makedirs(sftp, path: str) -> None:
    parts = [p for p in path.split("/") if p]
    current = "/" if path.startswith("/") else ""
    for part in parts:
        current = f"{current}{part}" if current in ("", "/") else f"{current}/{part}"
        try:
            sftp.stat(current)
        except IOError:
            sftp.mkdir(current, mode=0o700)


def describe_connect_error(target: SshTarget, exc: BaseException) -> str:
    """One line saying why a host could not be reached, and what to do about host keys."""
    import paramiko

    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return (f"host key for {where} has CHANGED (got {exc.key.get_name()} {exc.key.get_fingerprint().hex()[:16]}...): "
                "refusing to connect; if the node was really rebuilt, remove its old key from known_hosts")
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return f"host key for {where} is not pinned in known_hosts: refusing to connect (add it, or use --known-hosts)"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed for {target.user}@{where} (is the key in authorized_keys?)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"connect to {where} timed out"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection to {where} refused (is sshd running?)"
    if isinstance(exc, OSError) and exc.strerror:
        return f"cannot reach {where}: {exc.strerror}"
    text = str(exc).strip() or exc.__class__.__name__
    return f"cannot reach {where}: {text}"[:300]
