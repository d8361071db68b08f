"""Dialling one host: TCP (or a channel through its jump host), the server's key checked against the pinned
known_hosts (RejectPolicy: an unknown or changed key is refused and named), then public-key auth in OpenSSH's
order. A failure is an exception here; describe_connect_error makes it the one line a HostResult carries.

Connections are kept and reused by remote/ssh.py's SshPool, which passes its own cached client for a jump host.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Callable, Sequence

from clusterctl.remote.targets import SshSettings, SshTarget

if TYPE_CHECKING:
    import paramiko  # imported when the first connection is made


def connect(
    target: SshTarget, settings: SshSettings, jump_client: Callable[[SshTarget], paramiko.SSHClient]
) -> paramiko.SSHClient:
    """An authenticated connection to `target`; through `jump_client(target.proxy_jump)` when it has one."""
    ct = target.connect_timeout or settings.connect_timeout  # ConnectTimeout, unless --connect-timeout
    sock: socket.socket | paramiko.Channel
    if target.proxy_jump is not None:
        try:
            jump = jump_client(target.proxy_jump)
        except Exception as exc:
            raise JumpHostError(target.proxy_jump, exc) from exc
        sock = jump.get_transport().open_channel(
            "direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=ct
        )
    else:
        sock = tcp(target.hostname, target.port, ct)
    try:
        return handshake(target, settings, sock, ct)
    except BaseException:
        sock.close()
        raise


def handshake(
    target: SshTarget, settings: SshSettings, sock: socket.socket | paramiko.Channel, ct: float
) -> paramiko.SSHClient:
    """Transport, host key against the target's pinned files (under its HostKeyAlias, if any), then
    public keys in OpenSSH's order: agent keys only when the settings allow an agent."""
    import paramiko

    from clusterctl.remote import sshidentities

    transport = paramiko.Transport(sock)
    client = paramiko.SSHClient()
    client._transport = transport
    try:
        transport.banner_timeout = ct
        transport.auth_timeout = ct
        transport.handshake_timeout = ct
        transport.start_client(timeout=ct)
        server = transport.get_remote_server_key()
        pinned = host_keys(target.known_hosts or (settings.known_hosts,))
        name = pinned_name(target)
        want = pinned.lookup(name)
        if want is None:
            raise paramiko.SSHException(f"Server {name!r} not found in known_hosts")
        if want.get(server.get_name()) != server:
            raise paramiko.BadHostKeyException(name, server, next(iter(want.values())))
        agent = target.identity_agent if settings.allow_agent else None
        keys, locked, conn = sshidentities.candidate_keys(
            target.identity_files,
            target.identities_only or not settings.allow_agent,
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
                raise sshidentities.PassphraseKey(locked[0])
            raise last or paramiko.AuthenticationException("no key to offer")
        finally:
            if conn is not None:
                conn._close()
    except BaseException:
        client.close()
        raise


def still_pinned(client: paramiko.SSHClient, target: SshTarget, pinned: paramiko.HostKeys) -> bool:
    """True while the connection is alive and its server key is the one `pinned` holds for the target."""
    t = client.get_transport()
    if t is None or not t.is_active():
        return False
    server = t.get_remote_server_key()
    want = pinned.lookup(pinned_name(target))
    return bool(want is not None and want.get(server.get_name()) == server)


def tcp(host: str, port: int, timeout: float) -> socket.socket:
    """A TCP connection with keepalives (a host that stops answering mid-command drops the connection
    in about 30 s instead of hanging forever) and no Nagle delay."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, value in (("TCP_KEEPIDLE", 15), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 30000)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    return sock


def pinned_name(target: SshTarget) -> str:
    """The known_hosts name OpenSSH looks a host's key up by: its HostKeyAlias as is, else [host]:port."""
    if target.host_key_alias:
        return target.host_key_alias
    return target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"


def host_keys(files: Sequence[str]) -> paramiko.HostKeys:
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

    from clusterctl.remote.sshidentities import PassphraseKey

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
