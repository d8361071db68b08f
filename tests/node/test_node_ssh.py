"""The node side's one ssh: host keys pinned, never a prompt, and the sweep scheduler's and the watchdog's is it."""

from __future__ import annotations

from clusterctl.node import ssh as node_ssh
from clusterctl.node.watchdog import peers
from clusterctl.workloads.sweep import leader as sweep


def _options(argv: list[str]) -> dict[str, str]:
    return dict(argv[i + 1].split("=", 1) for i in range(1, len(argv), 2) if argv[i] == "-o")


def test_every_node_ssh_pins_host_keys_and_never_prompts():
    for argv in (node_ssh.argv(3), node_ssh.argv(20, alive=(5, 2), quiet=True)):
        assert argv[0] == "ssh" and len(argv) % 2 == 1  # options only: the host and command follow
        o = _options(argv)
        assert o["BatchMode"] == "yes" and o["StrictHostKeyChecking"] == "yes"
        assert o["PasswordAuthentication"] == "no" and o["ForwardAgent"] == "no"
    plain = _options(node_ssh.argv(3))
    assert plain["ConnectTimeout"] == "3" and "ServerAliveInterval" not in plain and "LogLevel" not in plain
    o = _options(node_ssh.argv(20, alive=(5, 2), quiet=True))
    assert (o["ConnectTimeout"], o["ServerAliveInterval"], o["ServerAliveCountMax"], o["LogLevel"]) == (
        "20",
        "5",
        "2",
        "ERROR",
    )


def test_the_sweep_scheduler_gets_the_node_ssh():
    assert list(sweep.SSH) == node_ssh.argv(5, alive=(5, 2), quiet=True)


def test_the_watchdog_asks_its_members_over_the_node_ssh(monkeypatch):
    ran = []
    monkeypatch.setattr(
        peers.subprocess,
        "run",
        lambda argv, **kw: ran.append(argv) or peers.subprocess.CompletedProcess(argv, 0, "{}\n", ""),
    )
    cfg = {"user": "root", "python": "/usr/bin/python3", "script": "/opt/clusterctl/autostop"}
    assert peers.probe_members(cfg, ["10.0.0.2"]) == {"10.0.0.2": {}}
    assert ran == [
        [*node_ssh.argv(5, alive=(5, 2)), "10.0.0.2", "/usr/bin/python3 /opt/clusterctl/autostop watchdog probe"]
    ]
