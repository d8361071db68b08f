"""Connections kept across invocations: a small per-user background agent.

`clusterctl run` is a short-lived process; opening 64 ssh connections costs far more than running
`true` on them. So the first `run` starts an agent (remote/agent_server.py, this module's server) that holds the
paramiko connections (remote.SshPool) and serves fan-out requests over a Unix socket in
CLUSTERCTL_HOME; later runs within the idle timeout reuse its connections and skip every handshake.

  * The socket lives in CLUSTERCTL_HOME (mode 0700), is itself 0600, and the agent serves only
    clients of its own uid (SO_PEERCRED).
  * The agent exits after CLUSTERCTL_AGENT_IDLE seconds (default 600) without a request, and
    `clusterctl down` stops it, so nothing is left running after a cluster is gone.
  * Host keys are re-read from the pinned known_hosts on every request; a cached connection whose
    server key is no longer the pinned one is dropped (and the reconnect is refused, naming the host).
  * Ctrl-C in the client sends `cancel`; the agent kills the remote process trees and answers with
    the results. If the client dies instead, the agent sees EOF and does the same.
  * CLUSTERCTL_AGENT=0 runs everything in-process (no background process, no reuse). If the agent
    cannot be started the client says so once and runs in-process.

Protocol: JSON lines. Client -> agent: one request ({"op": "run"|"ping"|"stop", "build": ...}),
then optionally {"op": "cancel"}. Agent -> client: events {"event": "started"}, {"event": "line",
"host", "stream": "stdout"|"stderr", "text"}, {"event": "result", "result": HostResult.to_dict()},
{"event": "done"}, or {"event": "error", "message", "stale": true when the builds differ}; a ping is
answered {"event": "pong", ...}, a stop {"event": "stopping", "pid"}. An agent of another build (older
ones spoke one-letter keys: {"t": "error", "stale": true}) is told by `stale` alone, and replaced.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence, cast

from clusterctl.proc import alive
from clusterctl.remote.ssh import SshPool
from clusterctl.remote.stream import OnLine
from clusterctl.remote.targets import SshSettings, SshTarget
from clusterctl.types import HostResult, RunReport

DEFAULT_IDLE = 600.0
_PKG = Path(__file__).resolve().parent.parent  # the clusterctl package


def build_id() -> str:
    """Changes whenever the code the agent runs changes, so a stale agent is replaced, not spoken to."""
    from clusterctl import __version__

    stamps = []
    code = ("agent", "agent_server", "ssh", "connect", "session", "stream", "targets", "sshconfig")
    for name in [*(f"remote/{m}.py" for m in code), "types.py"]:
        try:
            stamps.append(str((_PKG / name).stat().st_mtime_ns))
        except OSError:
            stamps.append("0")
    return f"{__version__}:{':'.join(stamps)}"


def enabled() -> bool:
    return os.environ.get("CLUSTERCTL_AGENT", "1").strip().lower() not in ("0", "off", "no", "false")


def idle_timeout() -> float:
    try:
        return max(1.0, float(os.environ.get("CLUSTERCTL_AGENT_IDLE", DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def home() -> Path:
    from clusterctl.state import home as state_home

    return state_home()


def socket_path(root: Path | None = None) -> Path:
    root = Path(root) if root else home()
    path = root / "agent.sock"
    if len(str(path)) < 100:
        return path
    # AF_UNIX paths are limited to 108 bytes: a long CLUSTERCTL_HOME gets a short private directory.
    import hashlib
    import tempfile

    short = Path(tempfile.gettempdir()) / f"clusterctl-{os.getuid()}"
    short.mkdir(mode=0o700, exist_ok=True)
    st = short.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise OSError(f"{short} is not a private directory of this user")
    return short / (hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:16] + ".sock")


# ---- (de)serialising the fan-out's inputs -----------------------------------------------------------
def target_to_dict(t: SshTarget) -> dict[str, Any]:
    return {
        "label": t.label,
        "hostname": t.hostname,
        "port": t.port,
        "user": t.user,
        "identity_files": [os.path.abspath(os.path.expanduser(i)) for i in t.identity_files],
        "proxy_jump": target_to_dict(t.proxy_jump) if t.proxy_jump is not None else None,
        # per host: its trusted key files and alias, and the ssh-agent of the command that asks (the
        # agent process outlives shells: it never uses its own SSH_AUTH_SOCK)
        "known_hosts": [os.path.abspath(os.path.expanduser(k)) for k in t.known_hosts],
        "host_key_alias": t.host_key_alias,
        "identity_agent": t.identity_agent,
        "identities_only": t.identities_only,
        "connect_timeout": t.connect_timeout,
        "ssh_config": t.ssh_config,
        "certificate_files": [os.path.abspath(os.path.expanduser(c)) for c in t.certificate_files],
    }


def target_from_dict(d: dict[str, Any]) -> SshTarget:
    return SshTarget(
        d["label"],
        d["hostname"],
        int(d["port"]),
        d["user"],
        tuple(d["identity_files"]),
        target_from_dict(d["proxy_jump"]) if d.get("proxy_jump") else None,
        tuple(d.get("known_hosts") or ()),
        d.get("host_key_alias"),
        d.get("identity_agent"),
        bool(d.get("identities_only")),
        d.get("connect_timeout"),
        d.get("ssh_config"),
        tuple(d.get("certificate_files") or ()),
    )


def settings_to_dict(s: SshSettings) -> dict[str, Any]:
    d = asdict(s)
    d["known_hosts"] = os.path.abspath(os.path.expanduser(s.known_hosts))
    return d


# ---- the client ------------------------------------------------------------------------------------
class AgentUnavailable(Exception):
    pass


def _connect(path: Path, timeout: float = 2.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        # the server must be of our own uid: a socket planted by another user would see every command
        _pid, uid, _gid = struct.unpack(
            "3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        if uid != os.getuid():
            raise OSError(f"the agent socket {path} is served by uid {uid}, not this user")
    except OSError:
        s.close()
        raise
    s.settimeout(None)
    return s


def _request(path: Path, req: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    s = _connect(path, timeout)
    try:
        s.settimeout(timeout)
        s.sendall((json.dumps(req) + "\n").encode())
        line = s.makefile("rb").readline()
        if not line:
            raise OSError("agent closed the connection")
        return cast(dict[str, Any], json.loads(line))
    finally:
        s.close()


def ping(root: Path | None = None) -> dict[str, Any] | None:
    """The running agent's facts (pid, connections, idle timeout), or None when none answers."""
    try:
        return _request(socket_path(root), {"op": "ping", "build": build_id()})
    except (OSError, ValueError):
        return None


def stop(root: Path | None = None, timeout: float = 5.0) -> bool:
    """Stop the agent of this CLUSTERCTL_HOME (closing its connections). True if one was running."""
    try:
        path = socket_path(root)
        info = _request(path, {"op": "stop", "build": build_id()}, timeout)
    except (OSError, ValueError):
        return False
    pid = int(info.get("pid", 0))
    deadline = time.monotonic() + timeout
    while pid and alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    if pid and alive(pid):
        try:
            os.kill(pid, signal.SIGKILL)  # the agent this clusterctl started, by its pid
        except ProcessLookupError:
            pass
    return True


def _ensure(root: Path) -> socket.socket:
    """A connection to a running agent of the current build, starting one if needed."""
    import fcntl

    path = socket_path(root)
    try:
        s = _connect(path)
        return s
    except OSError:
        pass
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(root / "agent.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:  # someone else may have started it while we waited for the lock
            return _connect(path)
        except OSError:
            pass
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        log = os.open(root / "agent.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clusterctl.remote.agent_server",
                    "--socket",
                    str(path),
                    "--idle",
                    str(idle_timeout()),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                start_new_session=True,
                close_fds=True,
                env={
                    **{k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"},  # asked per request
                    "PYTHONPATH": os.pathsep.join(p for p in (str(_PKG.parent), os.environ.get("PYTHONPATH", "")) if p),
                },
            )
        finally:
            os.close(log)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            try:
                return _connect(path)
            except OSError:
                if proc.poll() is not None:
                    detail = (root / "agent.log").read_text()[-300:].strip()
                    raise AgentUnavailable(
                        f"the connection agent exited at start: {detail or proc.returncode}"
                    ) from None
                time.sleep(0.005)
        raise AgentUnavailable("the connection agent did not start within 10s")
    finally:
        os.close(fd)


def run(
    targets: Sequence[SshTarget],
    settings: SshSettings,
    command: str,
    *,
    parallel: int = 64,
    timeout: float | None = None,
    on_line: OnLine | None = None,
    root: Path | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunReport:
    """Run `command` on every target through the agent (starting it if needed), or in-process when the
    agent is disabled or cannot start. Ctrl-C: the remote commands are killed, then KeyboardInterrupt."""
    if enabled() and targets:
        root = Path(root) if root else home()
        try:
            return _run_via_agent(root, targets, settings, command, parallel, timeout, on_line)
        except AgentUnavailable as exc:
            if warn is not None:
                warn(f"{exc}; running without connection reuse")

    with SshPool(settings) as pool:
        return pool.run(targets, command, parallel=parallel, timeout=timeout, on_line=on_line)


def _run_via_agent(
    root: Path,
    targets: Sequence[SshTarget],
    settings: SshSettings,
    command: str,
    parallel: int,
    timeout: float | None,
    on_line: OnLine | None,
) -> RunReport:
    req = {
        "op": "run",
        "build": build_id(),
        "targets": [target_to_dict(t) for t in targets],
        "settings": settings_to_dict(settings),
        "command": command,
        "parallel": parallel,
        "timeout": timeout,
    }
    interrupted = False
    for attempt in range(2):
        try:
            s = _ensure(root)
        except OSError as exc:
            raise AgentUnavailable(f"cannot reach the connection agent ({exc})") from None
        reader = _Lines(s)
        try:
            s.sendall((json.dumps(req) + "\n").encode())
            first = reader.readline()  # the agent acknowledges at once ("started"), or refuses
        except OSError:
            first = b""
        except KeyboardInterrupt:  # before the acknowledgement: cancel all the same, then wait for `done`
            interrupted = True
            try:
                s.sendall(b'{"op": "cancel"}\n')
            except OSError:
                s.close()
                raise KeyboardInterrupt from None
            s.settimeout(30.0)
            first = b'{"event": "started"}\n'
        event = (
            json.loads(first) if first else {"event": "error", "stale": True, "message": "agent closed the connection"}
        )
        if event.get("stale") and attempt == 0:  # this key alone: an old agent names its events "t"
            s.close()
            stop(root)  # an agent of another build (an upgrade): replace it
            continue
        break
    if event.get("event") != "started":  # refused, or an old agent's reply in keys this client does not read
        s.close()
        raise AgentUnavailable(f"the connection agent refused the request: {event.get('message')}")
    results: dict[str, HostResult] = {}
    try:
        while True:
            try:
                if event.get("event") == "done":
                    break
                _handle(event, results, on_line)
                line = reader.readline()
                if not line:
                    break
                event = json.loads(line)
            except KeyboardInterrupt:
                if interrupted:
                    raise  # a second Ctrl-C: leave now; the agent sees EOF and kills the rest itself
                interrupted = True
                try:
                    s.sendall(b'{"op": "cancel"}\n')
                except OSError:
                    raise KeyboardInterrupt from None
                s.settimeout(30.0)  # the agent kills the remote trees, then answers
                event = {}
            except (OSError, ValueError):
                break
    finally:
        s.close()
    missing = [t.label for t in targets if t.label not in results]
    for label in missing:
        results[label] = HostResult(
            label,
            None,
            error=(
                "interrupted; remote processes may remain"
                if interrupted
                else f"the connection agent stopped before this host finished (see {root / 'agent.log'})"
            ),
        )
    report = RunReport(tuple(results[t.label] for t in targets))
    if interrupted:
        from clusterctl.remote.ssh import Interrupted

        raise Interrupted(report)
    return report


class _Lines:
    """readline() straight over recv(): a Ctrl-C inside recv() loses no byte (a buffered file object
    interrupted mid-read may), so after `cancel` the client still reads every result to `done`."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buf = b""

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            data = self.sock.recv(65536)
            if not data:
                line, self.buf = self.buf, b""
                return line
            self.buf += data
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"


def _handle(event: dict[str, Any], results: dict[str, HostResult], on_line: OnLine | None) -> None:
    kind = event.get("event")
    if kind == "line" and on_line is not None:
        on_line(event["host"], event["stream"], event["text"])
    elif kind == "result":
        r = event["result"]
        results[r["host"]] = HostResult(
            r["host"], r["exit_code"], r["stdout"], r["stderr"], r["error"], r["timed_out"], r["duration_s"]
        )
