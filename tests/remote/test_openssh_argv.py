"""The OpenSSH command lines clusterctl runs (remote/openssh.py), read back by OpenSSH itself (`ssh -G`): the
caller's agent is never forwarded, whatever the user's ssh config says."""

from __future__ import annotations

import subprocess
from pathlib import Path

from clusterctl.remote.openssh import jump_ssh_config, node_ssh, operator_ssh
from clusterctl.remote.targets import SshTarget


def _effective(argv: list[str], host: str) -> dict[str, str]:
    """OpenSSH's effective settings for argv (ssh -G: resolved, nothing dialled)."""
    proc = subprocess.run([argv[0], "-G", *argv[1:], host], capture_output=True, text=True, check=True, timeout=30)
    return dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)


def test_a_users_forward_agent_yes_is_not_followed_on_any_path(tmp_path: Path):
    config = tmp_path / "config"
    config.write_text("Host *\n  ForwardAgent yes\n")
    known = tmp_path / "known_hosts"
    known.write_text("")
    plain = SshTarget("n1", "10.1.2.3", 2222, "ana", ssh_config=str(config))
    assert _effective(["ssh", "-F", str(config)], "10.1.2.3")["forwardagent"] == "yes"  # the config is read
    jumped = SshTarget("n2", "10.1.2.4", proxy_jump=plain, ssh_config=str(config))
    for argv in (
        operator_ssh(plain, str(known), managed=False),  # a plain hosts file: the user's config is read
        operator_ssh(jumped, str(known), managed=False),
        operator_ssh(plain, str(known), managed=True),
        operator_ssh(jumped, str(known), managed=True),  # -F the ProxyJump config both hops read
        node_ssh("root", 22, managed=True),
        node_ssh("root", 22, managed=False),
    ):
        assert _effective(argv, "10.1.2.3")["forwardagent"] == "no", argv
    managed_jump = jump_ssh_config(jumped, str(known))
    assert _effective(["ssh", "-F", managed_jump], "10.1.2.3")["forwardagent"] == "no"
