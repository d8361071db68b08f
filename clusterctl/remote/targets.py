"""Who to dial and how: SshTarget (one host), SshSettings (the pool's), and the targets of a plain hosts file
resolved through the user's ssh config the way `ssh HOST` would (remote/sshconfig.py asks OpenSSH itself).

Pure values: nothing here opens a connection (remote/connect.py does, remote/ssh.py keeps them).
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from clusterctl.hostsfile import validate_host


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
