"""OpenSSH command lines to the nodes: from this machine (sync, the checkpoint copy) and from one node to
another (the chain's hops). Data never goes through paramiko (too slow); host keys are pinned in both.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from clusterctl.remote.targets import SshTarget

CIPHERS = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr"  # AES-NI first; no compression
HOP_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "StrictHostKeyChecking=yes",
    "-o",
    "Compression=no",
    "-c",
    CIPHERS,
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "LogLevel=ERROR",
    "-o",
    "ForwardAgent=no",  # whatever a user's config says: a node never gets the caller's agent (docs/security.md)
)


def bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def operator_ssh(target: SshTarget, known_hosts: str, managed: bool) -> list[str]:
    """OpenSSH argv from this machine to a node (data does not go through paramiko: too slow)."""
    argv = ["ssh"]
    if managed and target.proxy_jump is not None:
        # -J runs a second ssh for the jump host that inherits -F but none of the -o/-i given here: one config
        # file carries the key, the pinned known_hosts and StrictHostKeyChecking=yes to both hops.
        argv += ["-F", jump_ssh_config(target, known_hosts)]
    elif managed:  # a cluster clusterctl made: its key and pinned known_hosts only, no user config
        argv += ["-F", "/dev/null", "-o", "IdentitiesOnly=yes"]
        for key in target.identity_files:
            argv += ["-i", key]
    else:  # a plain hosts file: the user's config (-F when --ssh-config named one), the files it pins keys in
        if target.ssh_config:
            argv += ["-F", target.ssh_config]
        argv += [f"-i{k}" for k in target.identity_files]
        if target.host_key_alias:
            argv += ["-o", f"HostKeyAlias={target.host_key_alias}"]
    pinned = known_hosts
    if not managed and target.known_hosts:  # OpenSSH takes a list here; the first -o wins over the config
        pinned = " ".join(shlex.quote(k) if " " in k else k for k in target.known_hosts)
    argv += [
        "-o",
        f"UserKnownHostsFile={pinned}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        *HOP_OPTIONS,
        "-p",
        str(target.port),
        "-l",
        target.user,
    ]
    if target.proxy_jump is not None and managed:
        j = target.proxy_jump
        argv += ["-J", f"{j.user}@{bracketed(j.hostname)}:{j.port}"]
    elif target.proxy_jump is not None:
        # -J would start the jump's ssh with -F alone: none of its pinned files, strict checking or keys.
        # The jump gets this function's own argv as ProxyCommand instead (% is a token mark there).
        j = target.proxy_jump
        hop = operator_ssh(j, known_hosts, managed) + ["-W", f"[{target.hostname}]:{target.port}", "--", j.hostname]
        argv += ["-o", "ProxyCommand=" + shlex.join(hop).replace("%", "%%")]
    return argv


def jump_ssh_config(target: SshTarget, known_hosts: str) -> str:
    """The ssh_config (beside the cluster's known_hosts) that both hops of a managed ProxyJump read."""

    def q(value: str) -> str:
        return '"' + value.replace('"', "") + '"'

    jump_keys = target.proxy_jump.identity_files if target.proxy_jump is not None else ()
    keys = tuple(dict.fromkeys(target.identity_files + jump_keys))
    lines = [
        "# written by clusterctl for ProxyJump through the leader: both hops use these settings",
        "Host *",
        "  IdentitiesOnly yes",
        *(f"  IdentityFile {q(k)}" for k in keys),
        f"  UserKnownHostsFile {q(known_hosts)}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  ForwardAgent no",
        "  BatchMode yes",
        "  ConnectTimeout 10",
        "",
    ]
    path = os.path.join(os.path.dirname(os.path.abspath(known_hosts)), "ssh_config")
    text = "\n".join(lines)
    try:
        current = open(path).read()
    except OSError:
        current = None
    if current != text:
        from clusterctl.state import atomic_write

        atomic_write(Path(path), text, mode=0o600)
    return path


def node_ssh(user: str, port: int, managed: bool) -> list[str]:
    """OpenSSH argv from one node to another: the node's cluster key and its pinned known_hosts."""
    argv = ["ssh", *HOP_OPTIONS, "-p", str(port), "-l", user]
    if managed:
        argv[1:1] = [
            "-o",
            "IdentitiesOnly=yes",
            "-i",
            "~/.ssh/id_ed25519",
            "-o",
            "UserKnownHostsFile=~/.ssh/known_hosts",
        ]
    return argv
