"""The built-in cluster, for real: namespace nodes with sshd, pinned keys, isolation, clean teardown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from clusterctl.proc import alive
from clusterctl.providers.local import netns
from conftest import node_ssh, require_root

pytestmark = pytest.mark.integration


def ssh_argv(cluster, host: str, *cmd: str) -> list[str]:
    return [*node_ssh(cluster), f"root@{host}", *cmd]


def test_three_nodes_up_isolated_reachable_and_gone(local_cluster_factory):
    before_ns = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()
    c = local_cluster_factory(3, 2)
    cli = c.cli

    # hosts file: leader first, strict format, and the state record agrees
    assert (cli.cwd / "hosts").read_text() == "".join(f"{h} slots=2\n" for h in c.hosts)
    assert len(set(c.hosts)) == 3
    ls = cli("ls")
    assert ls.returncode == 0 and c.name in ls.stdout and "up" in ls.stdout
    status = cli("status")
    assert status.returncode == 0, status.stderr  # every node answers its ssh probe: nothing lost
    assert f"{c.name}-leader" in status.stdout and f"{c.name}-member-2" in status.stdout

    # plain OpenSSH with StrictHostKeyChecking=yes against the pinned known_hosts reaches every node
    for i, host in enumerate(c.hosts):
        out = subprocess.run(ssh_argv(c, host, "hostname"), capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == (f"{c.name}-leader" if i == 0 else f"{c.name}-member-{i}")

    # homes are per node: a file written on node 2 is not on node 3
    assert cli("run", "hosts", "true").returncode == 0
    one = subprocess.run(ssh_argv(c, c.hosts[1], "echo secret > ~/only-here"), capture_output=True, timeout=30)
    assert one.returncode == 0
    check = cli("run", "--json", "test -e ~/only-here && echo yes || echo no")
    seen = {json.loads(line)["host"]: json.loads(line)["stdout"].strip() for line in check.stdout.splitlines()}
    assert seen == {c.hosts[0]: "no", c.hosts[1]: "yes", c.hosts[2]: "no"}

    # /tmp is per node too, and each node's hostname resolves inside it (gloo needs that)
    res = cli("run", "--json", 'touch /tmp/mine; ls /tmp | wc -l; getent hosts "$(hostname)" | cut -d" " -f1')
    for line in res.stdout.splitlines():
        r = json.loads(line)
        count, resolved = r["stdout"].split()
        assert count == "1" and resolved == r["host"], r

    # the leader reaches every member by the hosts file's addresses, host keys checked, no prompts
    members = " ".join(c.hosts[1:])
    leader = subprocess.run(
        ssh_argv(
            c,
            c.hosts[0],
            f"for h in {members}; do ssh -o BatchMode=yes "
            f"-o StrictHostKeyChecking=yes $h hostname || exit 9; done; cat ~/hosts",
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert leader.returncode == 0, leader.stderr
    assert leader.stdout.splitlines()[:2] == [f"{c.name}-member-1", f"{c.name}-member-2"]
    assert leader.stdout.splitlines()[2:] == [f"{h} slots=2" for h in c.hosts]

    # nodes have no route out: only their own subnet
    routes = c.node_exec(0, "ip", "-4", "route").stdout
    assert "default" not in routes

    # down removes every namespace, link and process, and proves it
    pids = [p for ns in netns.cluster_netns(c.name) for p in netns.netns_pids(ns)]
    assert len(pids) >= 3
    down = cli("down", c.name, "--yes")
    assert down.returncode == 0, down.stderr
    assert "nothing tagged for it is left" in down.stderr
    assert netns.leftovers(c.name).empty
    assert not [ns for ns in os.listdir("/run/netns") if c.name in ns and ns not in before_ns]
    assert not [p for p in pids if alive(p)]
    assert c.name not in subprocess.run(["ip", "link"], capture_output=True, text=True).stdout
    assert not (cli.home / "clusters" / c.name).exists()
    assert cli("ls").stdout.count(c.name) == 0


def test_changed_host_key_is_refused(local_cluster_factory):
    c = local_cluster_factory(2, 1)
    kh = c.cli.home / "clusters" / c.name / "known_hosts"
    lines = kh.read_text().splitlines()
    # pin a different key for the member: the real one must now be refused, naming the host
    from clusterctl.remote.sshkeys import generate_ed25519

    _, other = generate_ed25519("impostor")
    lines[1] = f"{c.hosts[1]} {' '.join(other.split()[:2])}"
    kh.write_text("\n".join(lines) + "\n")
    proc = c.cli("run", "hosts", "echo reached")
    assert proc.returncode == 5
    assert f"{c.hosts[0]}: reached" in proc.stdout and f"{c.hosts[1]}: reached" not in proc.stdout
    assert f"host key for {c.hosts[1]}:22 has CHANGED" in proc.stderr


def test_two_ups_of_one_cluster_cannot_interleave(cli):
    require_root()
    name = "tlock" + str(os.getpid() % 1000)
    from clusterctl.state import StateStore

    store = StateStore(cli.home)
    with store.lock(name):
        proc = cli("up", "--provider", "local", "--name", name, "--nodes", "1", "--yes", "--runtime", "none")
    assert proc.returncode == 3
    assert f"cluster '{name}' is busy: another clusterctl (pid {os.getpid()})" in proc.stderr
    assert not netns.cluster_netns(name)


def test_needs_root(cli):
    require_root()
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            *cli_argv(),
            "up",
            "--provider",
            "local",
            "--name",
            "noroot",
            "--nodes",
            "1",
            "--yes",
            "--runtime",
            "none",
        ],
        cwd="/",
        env=cli.env({"CLUSTERCTL_HOME": "/tmp/clusterctl-noroot-home"}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr
    assert "Error: the local provider needs root" in proc.stderr
    assert not netns.cluster_netns("noroot")


def cli_argv() -> list[str]:
    import sys

    return [sys.executable, "-m", "clusterctl"]


def test_interrupted_up_leaves_nothing(cli):
    require_root()
    name = "tint" + str(os.getpid() % 1000)
    proc = cli.popen("up", "--provider", "local", "--name", name, "--nodes", "6", "--yes", "--runtime", "none")
    deadline = time.monotonic() + 30
    while not netns.cluster_netns(name) and time.monotonic() < deadline:  # interrupt mid-creation
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Error: interrupted" in err
    assert netns.leftovers(name).empty, netns.leftovers(name).describe()
    assert not (cli.home / "clusters" / name / "cluster.json").exists()
