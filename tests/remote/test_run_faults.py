"""Faults and bad input against a real 4-node local cluster (real sshd): a node whose sshd is gone, a node
that silently drops packets, an empty authorized_keys, a changed host key, and hostile hosts files.
Every fault is undone by the test that makes it, so the module shares one cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.providers.local import netns
from clusterctl.remote.sshkeys import generate_ed25519
from conftest import node_pid

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(4, 1)


def state(c) -> Path:
    return c.cli.home / "clusters" / c.name


def one_host_file(c, index: int) -> str:
    path = c.cli.cwd / f"host-{index}"
    path.write_text(f"{c.hosts[index]} slots=1\n")
    return path.name


def timed(c, *args, **kw):
    start = time.monotonic()
    proc = c.cli(*args, **kw)
    return proc, time.monotonic() - start


def assert_others_fine(c, proc, bad: int, text: str = "alive") -> None:
    for i, host in enumerate(c.hosts):
        assert (f"{host}: {text}" in proc.stdout) == (i != bad), (host, proc.stdout, proc.stderr)


def test_sshd_stopped_on_one_node_then_rebooted(c):
    assert c.cli("run", "hosts", "true").returncode == 0  # connections kept by the agent
    pid = node_pid(c.name, 1)
    os.kill(pid, signal.SIGKILL)  # the node's PID 1 is its sshd: the whole node stops
    deadline = time.monotonic() + 10
    while netns.netns_pids(netns.netns_name(c.name, 1)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc, took = timed(c, "run", "hosts", "echo alive")
    assert proc.returncode == 5, proc.stderr
    assert_others_fine(c, proc, bad=1)
    assert "4 host(s): 3 ok, 1 unreachable" in proc.stderr
    assert f"  {c.hosts[1]}: unreachable: connection to {c.hosts[1]}:22 refused (is sshd running?)" in proc.stderr
    assert took < 10, took

    reboot = c.cli("clean", "--reboot", "--yes", one_host_file(c, 1))
    assert reboot.returncode == 0, reboot.stderr
    assert "1 node(s) rebooted and answering ssh" in reboot.stderr
    assert c.cli("run", "hosts", "true").returncode == 0


def silence(ns: str, on: bool) -> None:
    """The node drops every packet, both ways, without a word (no RST, no ICMP)."""
    for chain in ("INPUT", "OUTPUT"):
        subprocess.run(["ip", "netns", "exec", ns, "iptables", "-I" if on else "-D", chain, "-j", "DROP"], check=True)


def test_node_silently_dropping_packets_costs_at_most_the_bounds(c):
    ns = netns.netns_name(c.name, 2)
    assert c.cli("run", "hosts", "true").returncode == 0  # a kept connection to the node that goes silent
    silence(ns, True)
    try:
        # over the kept connection: opening a channel waits at most the connect timeout
        proc, took = timed(c, "run", "--connect-timeout", "2", "hosts", "echo alive")
        assert proc.returncode == 5, proc.stderr
        assert_others_fine(c, proc, bad=2)
        assert f"  {c.hosts[2]}: unreachable: " in proc.stderr
        assert took < 8, took
        # a fresh connection: the TCP connect itself times out
        assert c.cli("agent", "stop").returncode == 0
        proc, took = timed(c, "run", "--connect-timeout", "2", "hosts", "echo alive")
        assert proc.returncode == 5, proc.stderr
        assert_others_fine(c, proc, bad=2)
        assert f"  {c.hosts[2]}: unreachable: connect to {c.hosts[2]}:22 timed out" in proc.stderr
        assert took < 8, took
    finally:
        silence(ns, False)

    # going silent in the middle of a command: --timeout bounds it, the others finish and are reported
    assert c.cli("run", "hosts", "true").returncode == 0
    proc = c.cli.popen("run", "--timeout", "5", "--connect-timeout", "2", "hosts", "sleep 2.71; echo alive")
    try:
        deadline = time.monotonic() + 20
        while c.node_exec(2, "pgrep", "-f", "^sleep 2.71$", check=False).returncode != 0:
            assert time.monotonic() < deadline, "the command never started on node 2"
            time.sleep(0.05)
        start = time.monotonic()
        silence(ns, True)
        try:
            out, err = proc.communicate(timeout=60)
        finally:
            silence(ns, False)
        took = time.monotonic() - start
    finally:
        proc.kill()
    assert proc.returncode == 124, err
    assert all(f"{h}: alive" in out for i, h in enumerate(c.hosts) if i != 2) and f"{c.hosts[2]}: alive" not in out
    assert "4 host(s): 3 ok, 1 timed out" in err
    assert f"  {c.hosts[2]}: timed out: timed out after 5s" in err
    assert took < 5 + 2 + 3, took  # --timeout, then at most the connect timeout trying to kill it
    assert c.cli("run", "hosts", "true").returncode == 0


def test_empty_authorized_keys_on_one_node(c):
    keys = state(c) / "nodes" / "3" / "home" / ".ssh" / "authorized_keys"  # the node's /root, seen from the host
    saved = keys.read_text()
    assert "clusterctl-" in saved
    keys.write_text("")
    try:
        assert c.cli("agent", "stop").returncode == 0  # kept connections authenticated earlier; dial anew
        proc = c.cli("run", "hosts", "echo alive")
        assert proc.returncode == 5, proc.stderr
        assert_others_fine(c, proc, bad=3)
        assert (
            f"  {c.hosts[3]}: unreachable: authentication failed for root@{c.hosts[3]}:22 "
            "(is the key in authorized_keys?)"
        ) in proc.stderr
    finally:
        keys.write_text(saved)
    assert c.cli("run", "hosts", "true").returncode == 0


def test_changed_host_key_is_refused_naming_the_host(c):
    kh = state(c) / "known_hosts"
    pinned = kh.read_text()
    _, impostor = generate_ed25519("impostor")
    # 1. the pin changes while the agent holds a connection made under the old pin: it must not be reused
    assert c.cli("run", "hosts", "true").returncode == 0
    kh.write_text(
        "".join(
            f"{c.hosts[1]} {' '.join(impostor.split()[:2])}\n" if line.startswith(c.hosts[1] + " ") else line + "\n"
            for line in pinned.splitlines()
        )
    )
    try:
        proc = c.cli("run", "hosts", "echo alive")
        assert proc.returncode == 5, proc.stderr
        assert_others_fine(c, proc, bad=1)
        assert f"  {c.hosts[1]}: unreachable: host key for {c.hosts[1]}:22 has CHANGED" in proc.stderr
    finally:
        kh.write_text(pinned)
    assert c.cli("run", "hosts", "true").returncode == 0

    # 2. the node itself comes back with another key (rebuilt): refused, named, even by clean --reboot
    key = state(c) / "nodes" / "1" / "etc-ssh" / "ssh_host_ed25519_key"
    original = key.read_text()
    new_private, _ = generate_ed25519("rebuilt")
    key.write_text(new_private)
    try:
        reboot, took = timed(c, "clean", "--reboot", "--yes", one_host_file(c, 1))
        assert reboot.returncode == 5, reboot.stderr
        assert f"{c.hosts[1]}: host key for {c.hosts[1]}:22 has CHANGED" in reboot.stderr
        assert took < 30, took  # refused at once, not waited out
        proc = c.cli("run", "hosts", "echo alive")
        assert proc.returncode == 5
        assert_others_fine(c, proc, bad=1)
        assert f"  {c.hosts[1]}: unreachable: host key for {c.hosts[1]}:22 has CHANGED" in proc.stderr
        assert kh.read_text() == pinned  # nothing was learned or replaced
    finally:
        key.write_text(original)
    assert c.cli("clean", "--reboot", "--yes", one_host_file(c, 1)).returncode == 0
    assert c.cli("run", "hosts", "true").returncode == 0


CANARY = "/tmp/clusterctl-canary-{pid}"
HOSTILE = [
    "-oProxyCommand=touch${{IFS}}{canary}",
    "-oProxyCommand=sh${{IFS}}-c${{IFS}}'touch${{IFS}}{canary}'",
    "a;touch${{IFS}}{canary}",
    "$(touch${{IFS}}{canary})",
    "`touch${{IFS}}{canary}`",
    "a|touch${{IFS}}{canary}",
    "a&&touch${{IFS}}{canary}",
    "node\x0b-oProxyCommand=touch${{IFS}}{canary}",  # a vertical tab is no line break here
    "node\r-oProxyCommand=touch${{IFS}}{canary}",
    "x\n-oProxyCommand=touch${{IFS}}{canary}",  # a newline makes a second, hostile line
]


@pytest.mark.parametrize("entry", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_hosts_file_is_rejected_before_any_connection(c, entry):
    canary = CANARY.format(pid=os.getpid())
    entry = entry.format(canary=canary)
    hosts = c.cli.cwd / "hostile"
    hosts.write_text(f"{c.hosts[0]} slots=1\n{entry} slots=1\n")
    remote_canary = "/tmp/remote-canary"
    commands = [("run", "hostile", f"touch {remote_canary}")]
    if entry == HOSTILE[0].format(canary=canary):  # every command that connects validates the same way
        commands += [
            ("clean", "hostile"),
            ("logs", "job", "hostile"),
            ("kill", "job", "hostile"),
            ("run", "--detach", "job", "hostile", f"touch {remote_canary}"),
        ]
    for args in commands:
        proc = c.cli(*args)
        assert proc.returncode == 3, (args, proc.stderr)
        assert proc.stderr.startswith("Error: hostile:"), proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert proc.stdout == ""
    assert not os.path.exists(canary)
    assert c.node_exec(0, "test", "-e", remote_canary, check=False).returncode == 1  # nothing ran on the good host
