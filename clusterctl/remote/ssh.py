"""Fan-out over SSH: one process holding many paramiko connections, with a bounded sliding window.

Never raises halfway: every host ends as a HostResult in a RunReport; the caller decides. Host keys
come only from the pinned known_hosts given (RejectPolicy: an unknown or changed key is refused and
named). stdin is closed, no agent is forwarded, nothing ever prompts.

Every command runs inside a small wrapper that reports the remote session id (one marker line on
stderr, stripped here, no extra process or file), so a timeout or Ctrl-C kills the whole remote process
tree (the session and every descendant of it), not just the channel.
"""

from __future__ import annotations

import getpass
import io
import logging
import os
import select
import shlex
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from clusterctl.hostsfile import validate_host
from clusterctl.types import HostResult, RunReport

if TYPE_CHECKING:
    import paramiko  # imported when the first connection is made

OnLine = Callable[[str, str, str], None]  # (host label, "stdout"|"stderr", line without newline)
MAX_CAPTURE = 4 * 1024 * 1024  # per stream per host; the tail is kept beyond that
MAX_LINE = 64 * 1024  # an unfinished line is cut (delivered in pieces) beyond this
EOF_GRACE = 5.0  # after the exit status, how long a silent channel may keep us waiting for its EOF
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


@dataclass(frozen=True)
class SshTarget:
    label: str  # what the user calls the host (hosts-file token); used in output
    hostname: str  # what is dialled
    port: int = 22
    user: str = "root"
    identity_files: tuple[str, ...] = ()
    proxy_jump: "SshTarget | None" = None
    # per host, from the user's ssh config (a plain hosts file); a cluster's targets leave them empty
    known_hosts: tuple[str, ...] = ()  # the files trusted for this host (empty: SshSettings.known_hosts)
    host_key_alias: str | None = None  # the name its key is pinned under
    identity_agent: str | None = None  # the ssh-agent socket to ask (the caller's SSH_AUTH_SOCK or IdentityAgent)
    identities_only: bool = False
    connect_timeout: float | None = None  # ConnectTimeout from the config (the flag wins)
    ssh_config: str | None = None  # the --ssh-config it was read from, for OpenSSH calls (-F)
    certificate_files: tuple[str, ...] = ()  # CertificateFile: offered on the private key each certifies


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
    known_hosts: str | None = None,
    warnings: list[str] | None = None,
) -> list[SshTarget]:
    """Targets for a plain hosts file, resolved the way `ssh HOST` would (OpenSSH's own `ssh -G`: Include,
    Match, HostName, User, Port, IdentityFile, IdentitiesOnly, IdentityAgent, CertificateFile,
    UserKnownHostsFile, GlobalKnownHostsFile, HostKeyAlias, ProxyJump, ConnectTimeout). Explicit flags win
    over the config.
    A config that would lower host key checking is noted in `warnings` (it does not lower ours)."""
    from clusterctl.errors import ConfigError
    from clusterctl.remote import sshconfig

    def split(spec: str) -> tuple[str | None, str, int | None]:
        u, _, rest = spec.rpartition("@") if "@" in spec else (None, "", spec)
        if rest.startswith("["):
            alias, _, p = rest[1:].partition("]")
            p = p[1:] if p.startswith(":") else ""
        else:
            alias, _, p = rest.partition(":") if rest.count(":") == 1 else (rest, "", "")
        return u or None, alias, int(p) if p.isdigit() else None

    lax: dict[str, list[str]] = {}
    jumps: dict[tuple[str, str | None, int | None], sshconfig.HostConfig] = {}

    def build(alias: str, hc: sshconfig.HostConfig, depth: int, u: str | None, p: int | None) -> SshTarget:
        if hc.proxy_command and not hc.proxy_jump:
            raise ConfigError(
                f"the ssh config of {alias} uses ProxyCommand, which clusterctl does not run "
                "(it would dial the host directly instead)",
                "use ProxyJump, or a hosts file without it",
            )
        if hc.strict_host_key_checking in ("no", "accept-new", "off"):
            lax.setdefault(hc.strict_host_key_checking, []).append(alias)
        jump = None
        if hc.proxy_jump and depth < 5:
            # ProxyJump a,b: reach a (as its own config says), from a reach b, from b the host
            for hop in (h.strip() for h in hc.proxy_jump.split(",")):
                hu, halias, hp = split(hop)
                validate_host(halias, "ProxyJump host")
                if (halias, hu, hp) not in jumps:  # one look-up per bastion, not one per host behind it
                    (jumps[(halias, hu, hp)],) = sshconfig.lookup([(halias, hu, hp)], ssh_config)
                hhc = jumps[(halias, hu, hp)]
                t = build(halias, hhc, depth + 1, hu, hp)
                jump = t if jump is None else replace(t, proxy_jump=jump)
        if identity:
            ids = tuple(os.path.abspath(os.path.expanduser(i)) for i in identity)
        else:  # what OpenSSH would offer: the files that exist (a .pub alone names an agent key)
            ids = tuple(i for i in hc.identity_files if os.path.exists(i) or os.path.exists(i + ".pub"))
        agent = os.environ.get("SSH_AUTH_SOCK") if hc.identity_agent == "SSH_AUTH_SOCK" else hc.identity_agent
        kh = (
            (os.path.abspath(os.path.expanduser(known_hosts)),)
            if known_hosts
            else tuple(f for f in hc.user_known_hosts + hc.global_known_hosts)
        )
        return SshTarget(
            label=alias,
            hostname=hc.hostname or alias,
            port=int(p or (port if depth == 0 and port else None) or hc.port),
            user=(u or (user if depth == 0 else None) or hc.user or getpass.getuser()),
            identity_files=ids,
            proxy_jump=jump,
            known_hosts=kh,
            host_key_alias=hc.host_key_alias,
            identity_agent=agent or None,
            identities_only=hc.identities_only,
            connect_timeout=hc.connect_timeout,
            ssh_config=os.path.abspath(os.path.expanduser(ssh_config)) if ssh_config else None,
            certificate_files=tuple(f for f in hc.certificate_files if os.path.isfile(f)),
        )

    parsed = [split(h) for h in hosts]
    for _, alias, _ in parsed:
        validate_host(alias, "host")
    configs = sshconfig.lookup([(alias, u if u else user, p or port) for u, alias, p in parsed], ssh_config)
    # labelled as written, so `host:2222` and `[fd00::5]:2222` match their hosts-file entries
    targets = [replace(build(alias, hc, 0, u, p), label=h) for h, (u, alias, p), hc in zip(hosts, parsed, configs)]
    if warnings is not None:
        for value, names in lax.items():
            shown = ", ".join(dict.fromkeys(names[:3])) + (" ..." if len(set(names)) > 3 else "")
            warnings.append(
                f"the ssh config sets StrictHostKeyChecking {value} for {shown}: clusterctl still "
                "refuses unknown and changed host keys"
            )
    return targets


# ---- the remote wrapper ----------------------------------------------------------------------------
SID_MARK = "\x1eclusterctl-sid "  # starts the one line of stderr that carries the remote session id


def wrap_command(command: str, token: str = "") -> str:
    """Run `command` in the login shell with stdin closed, first reporting this ssh session's id on
    stderr (sshd makes every exec session a new session whose leader is this shell: $$ is the id).
    The command is eval'd by that same shell, as `ssh host CMD` would run it: no second shell starts."""
    return f"printf '\\036clusterctl-sid %s\\n' \"$$\" >&2; exec </dev/null; eval {shlex.quote(command)}"


# The pids of session $1 and of every descendant of its processes (descendants may have left the session
# with setsid, as horovodrun's launcher does), this shell and its children excepted. One ps, no loop of
# forks. $1 empty or 0 means: the roots are every process of the login user whose name matches $2.
TREE_FN = r"""cc_tree() {
  ps -e -o pid= -o ppid= -o sid= -o uid= -o stat= -o comm= | awk -v s="${1:-0}" -v re="${2:-^$}" -v me="$$" -v u="$(id -u)" '
    { pid[NR]=$1; pp[NR]=$2; sid[NR]=$3; uid[NR]=$4; st[NR]=$5; c[NR]=$6; n=NR }
    END {
      for (i=1;i<=n;i++) if ((s!=0 && sid[i]==s) || (s==0 && uid[i]==u && c[i] ~ re)) t[pid[i]]=1
      do { more=0; for (i=1;i<=n;i++) if (!(pid[i] in t) && (pp[i] in t)) { t[pid[i]]=1; more=1 } } while (more)
      for (i=1;i<=n;i++) if ((pid[i] in t) && pid[i]!=me && pp[i]!=me && st[i] !~ /^Z/) printf "%s ", pid[i]
    }'
}"""


def kill_command(sid: int, grace: float = 0.0) -> str:
    """SIGKILL (after SIGTERM and `grace` seconds, if given) session `sid` and every descendant, then
    verify: exits 0 when nothing of it is left, 1 (listing the survivors) otherwise."""
    sid = int(sid)
    term = (
        f'p=$(cc_tree {sid}); [ -n "$p" ] && kill -TERM $p 2>/dev/null; '
        f'i=0; while [ -n "$(cc_tree {sid})" ] && [ $i -lt {int(grace * 10)} ]; do sleep 0.1; i=$((i+1)); done; '
        if grace > 0
        else ""
    )
    return (
        f"{TREE_FN}\n{term}"
        f'i=0; while p=$(cc_tree {sid}); [ -n "$p" ] && [ $i -lt 50 ]; do kill -STOP $p 2>/dev/null; '
        f"kill -KILL $(cc_tree {sid}) 2>/dev/null; sleep 0.05; i=$((i+1)); done; "
        f'p=$(cc_tree {sid}); [ -z "$p" ] || {{ echo "still running: $p" >&2; exit 1; }}'
    )


# ---- connections -----------------------------------------------------------------------------------
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
                    files[kh] = _host_keys(kh)
                t = c.get_transport()
                ok = False
                if t is not None and t.is_active():
                    server = t.get_remote_server_key()
                    want = files[kh].lookup(_pinned_name(target))
                    ok = want is not None and want.get(server.get_name()) == server
                if not ok:
                    dropped.append(self._clients.pop(key))
        for c in dropped:
            try:
                c.close()
            except Exception:
                pass
        return len(dropped)

    def _connect(self, target: SshTarget) -> paramiko.SSHClient:
        ct = target.connect_timeout or self.settings.connect_timeout  # ConnectTimeout, unless --connect-timeout
        if target.proxy_jump is not None:
            try:
                jump = self.client(target.proxy_jump)
            except Exception as exc:
                raise JumpHostError(target.proxy_jump, exc) from exc
            sock = jump.get_transport().open_channel(
                "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=ct
            )
        else:
            sock = _dial(target.hostname, target.port, ct)
        try:
            return self._handshake(target, sock, ct)
        except BaseException:
            sock.close()
            raise

    def _handshake(self, target: SshTarget, sock: socket.socket | paramiko.Channel, ct: float) -> paramiko.SSHClient:
        """Transport, host key against the target's pinned files (under its HostKeyAlias, if any), then
        public keys in OpenSSH's order: agent keys only when this pool may use an agent."""
        import paramiko

        from clusterctl.remote import sshconfig

        transport = paramiko.Transport(sock)
        client = paramiko.SSHClient()
        client._transport = transport
        try:
            transport.banner_timeout = ct
            transport.auth_timeout = ct
            transport.handshake_timeout = ct
            transport.start_client(timeout=ct)
            server = transport.get_remote_server_key()
            pinned = _host_keys(target.known_hosts or (self.settings.known_hosts,))
            name = _pinned_name(target)
            want = pinned.lookup(name)
            if want is None:
                raise paramiko.SSHException(f"Server {name!r} not found in known_hosts")
            if want.get(server.get_name()) != server:
                raise paramiko.BadHostKeyException(name, server, next(iter(want.values())))
            agent = target.identity_agent if self.settings.allow_agent else None
            keys, locked, conn = sshconfig.candidate_keys(
                target.identity_files,
                target.identities_only or not self.settings.allow_agent,
                agent,
                target.certificate_files,
            )
            try:
                last: Exception | None = None
                for key in keys:
                    try:
                        transport.auth_publickey(target.user, key)
                        if transport.is_authenticated():
                            return client
                    except paramiko.AuthenticationException as exc:
                        last = exc
                if locked:
                    raise sshconfig.PassphraseKey(locked[0])
                raise last or paramiko.AuthenticationException("no key to offer")
            finally:
                if conn is not None:
                    conn._close()
        except BaseException:
            client.close()
            raise

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
            out, err, timed_out = _pump(
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
                    sftp.putfo(io.BytesIO(data), tmp)
                    sftp.chmod(tmp, mode)
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


def _pump(
    chan: paramiko.Channel,
    label: str,
    on_line: OnLine | None,
    timeout: float | None,
    start: float,
    cancel: threading.Event,
    sid: list[int] | None = None,
) -> tuple[str, str, bool]:
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


def _dial(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection with keepalives (a host that stops answering mid-command drops the connection
    in about 30 s instead of hanging forever) and no Nagle delay."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 30000)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    return sock


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = [p for p in path.split("/") if p]
    current = "/" if path.startswith("/") else ""
    for part in parts:
        current = f"{current}{part}" if current in ("", "/") else f"{current}/{part}"
        try:
            sftp.stat(current)
        except IOError:
            sftp.mkdir(current, mode=0o700)


def _pinned_name(target: SshTarget) -> str:
    """The known_hosts name OpenSSH looks a host's key up by: its HostKeyAlias as is, else [host]:port."""
    if target.host_key_alias:
        return target.host_key_alias
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


def _host_keys(files: Sequence[str]) -> paramiko.HostKeys:
    import paramiko

    keys = paramiko.HostKeys()
    for f in files:
        try:
            keys.load(os.path.expanduser(f))
        except (OSError, IOError):
            pass
    return keys


class JumpHostError(Exception):
    """The ProxyJump host of a target could not be reached."""

    def __init__(self, jump: SshTarget, cause: BaseException):
        super().__init__(str(cause))
        self.jump, self.cause = jump, cause


def describe_connect_error(target: SshTarget, exc: BaseException) -> str:
    """One line saying why a host could not be reached, and what to do about host keys."""
    import paramiko

    from clusterctl.remote.sshconfig import PassphraseKey

    if isinstance(exc, PassphraseKey):
        return f"authentication failed for {target.user}@{target.hostname}:{target.port}: {exc}"
    if isinstance(exc, JumpHostError):
        return f"through jump host {exc.jump.label}: {describe_connect_error(exc.jump, exc.cause)}"
    where = f"{target.hostname}:{target.port}"
    if isinstance(exc, paramiko.BadHostKeyException):
        return (
            f"host key for {where} has CHANGED (got {exc.key.get_name()} {exc.key.get_fingerprint().hex()[:16]}...): "
            "refusing to connect; if the node was really rebuilt, remove its old key from known_hosts"
        )
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
