"""`clusterctl repair` on a local cluster: a member's namespace processes killed, then the node replaced (or dropped)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest

from conftest import node_pid, wait_for

pytestmark = pytest.mark.integration


def ok(proc):
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def kill_node(c, index: int) -> None:
    """Every process of the node gone (sshd is its PID 1: killing it ends the node's PID namespace)."""
    os.kill(node_pid(c.name, index), signal.SIGKILL)
    from clusterctl.providers.local import netns

    ns = netns.netns_name(c.name, index)
    assert netns.kill_netns(ns, 10.0) == []


def runs(c, command: str) -> list[dict]:
    """`run --json` on the whole cluster: one object per host."""
    out = ok(c.cli("run", "--cluster", c.name, "--json", command)).stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def record(c) -> dict:
    return json.loads((c.cli.home / "clusters" / c.name / "cluster.json").read_text())["cluster"]


@pytest.fixture(scope="module")
def shared(module_cluster_factory):
    return module_cluster_factory(3, 1)


@pytest.fixture
def stopped_sshd(shared):
    """member-1's sshd stopped (kill -STOP: a node too busy to answer); continued again whatever the test does."""
    pid = node_pid(shared.name, 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_running_node_that_does_not_answer_is_reported_and_kept_with_its_files(shared, stopped_sshd):
    """The reproduction: a file under a member's home, its sshd stopped, `repair --yes`: nothing replaced."""
    c = shared
    c.node_exec(1, "sh", "-c", "echo precious > /root/keep.txt")
    start = time.monotonic()
    proc = c.cli("repair", c.name, "--yes", "--unreachable-for", "8s")
    assert proc.returncode == 5, proc.stderr
    assert f"{c.name}-member-1 ({c.hosts[1]}): runs, but answered no ssh probe over 8s" in proc.stderr, proc.stderr
    assert f"`clusterctl repair {c.name} --node {c.name}-member-1` replaces it" in proc.stderr
    assert "probe 4 of 4" in proc.stderr and time.monotonic() - start >= 8
    assert "launching" not in proc.stderr and "removed" not in proc.stderr
    # --watch: the same rule, round after round
    watching = c.cli.popen("repair", c.name, "--watch", "1", "--yes", "--unreachable-for", "4s")
    time.sleep(12)
    os.kill(stopped_sshd, signal.SIGCONT)  # Ctrl-C then ends it at once (a probe of a stopped sshd waits its timeouts)
    watching.send_signal(signal.SIGINT)
    _, err = watching.communicate(timeout=60)
    os.kill(stopped_sshd, signal.SIGSTOP)
    assert "runs, but answered no ssh probe over 4s" in err and "launching" not in err, err
    assert c.node_exec(1, "cat", "/root/keep.txt").stdout == "precious\n"
    # a node stopped only a moment (continued once the first probe failed) answers a later one: nothing to repair
    again = c.cli.popen("repair", c.name, "--yes", "--unreachable-for", "12s")
    seen = ""
    while "probe 2 of 4" not in seen:
        line = again.stderr.readline()
        assert line, f"repair ended before its second probe: {seen}"
        seen += line
    os.kill(stopped_sshd, signal.SIGCONT)
    _, err = again.communicate(timeout=120)
    assert again.returncode == 0 and "all 3 node(s) answer; nothing to repair" in err, seen + err
    assert c.node_exec(1, "cat", "/root/keep.txt").stdout == "precious\n"
    assert c.cli("repair", c.name, "--node", "nope").stderr.startswith(f"Error: --node nope: cluster {c.name} has no")


def test_repair_replaces_a_lost_member_with_its_dataset_and_run_reaches_all(local_cluster_factory, tmp_path, request):
    c = local_cluster_factory(3, 1)
    src = tmp_path / "ds"
    src.mkdir()
    for i in range(5):
        (src / f"f{i}.bin").write_bytes(os.urandom(2000 + i))
    ok(c.cli("sync", "--cluster", c.name, str(src), "/root/data"))
    assert record(c)["extra"]["datasets"] == "/root/data"  # what repair copies: the cluster's own record
    first_marker = json.loads(c.node_exec(0, "cat", "/root/data/.clusterctl-sync/COMPLETE").stdout)
    old_key = (c.cli.home / "clusters" / c.name / "known_hosts").read_text()
    # another user's dataset under /srv, which local nodes share with this machine: never repair's to copy
    decoy = Path(f"/srv/cc-decoy-{uuid.uuid4().hex[:8]}")
    (decoy / ".clusterctl-sync").mkdir(parents=True)
    (decoy / ".clusterctl-sync" / "COMPLETE").write_text("theirs\n")
    request.addfinalizer(lambda: shutil.rmtree(decoy, ignore_errors=True))
    c.node_exec(2, "sh", "-c", "echo old > /root/old.txt")
    kill_node(c, 2)

    st = c.cli("status", c.name)
    assert st.returncode == 5, st.stderr  # a lost node: status says so in its exit status too
    assert f"lost: {c.name}-member-2 ({c.hosts[2]})" in st.stderr + st.stdout
    proc = c.cli("repair", c.name)  # no terminal, no --yes: nothing is done
    assert proc.returncode == 2 and "needs confirmation" in proc.stderr
    assert f"{c.name}-member-2 ({c.hosts[2]}): no process left" in proc.stderr

    # --data of a dataset the peer does not hold complete, or one local nodes share with this machine: refused
    # before anything is launched
    for data, why in (("/root/no-such-data", "has no completion marker"), (str(decoy), "outside the nodes' own")):
        proc = c.cli("repair", c.name, "--yes", "--data", data)
        assert proc.returncode in (2, 4) and why in proc.stderr and "launching" not in proc.stderr, proc.stderr
    # a replacement that fails a check (here: a dataset whose manifest is gone from the peer) is removed; nothing
    # names it
    c.node_exec(
        0, "sh", "-c", "mkdir -p /root/broken/.clusterctl-sync && echo {} > /root/broken/.clusterctl-sync/COMPLETE"
    )
    hosts_before = (c.cli.cwd / "hosts").read_text()
    kept = (c.cli.home / "clusters" / c.name / "cluster.json").read_text()
    proc = c.cli("repair", c.name, "--yes", "--data", "/root/broken")
    assert proc.returncode != 0 and "removing the replacement node(s)" in proc.stderr, proc.stderr
    assert (c.cli.home / "clusters" / c.name / "cluster.json").read_text() == kept
    assert (c.cli.cwd / "hosts").read_text() == hosts_before
    assert (c.cli.home / "clusters" / c.name / "known_hosts").read_text() == old_key
    # the lost node's home was kept aside while its replacement ran, and is back in its place
    homes = c.cli.home / "clusters" / c.name / "nodes"
    assert (homes / "2" / "home" / "old.txt").read_text() == "old\n" and not list(homes.glob("2.replaced-*"))
    from clusterctl.providers.local import netns

    assert netns.netns_name(c.name, 2) not in netns.cluster_netns(c.name)
    # a running elastic job's discovery (it reads the leader's live-hosts) was never offered the replacement:
    # the lost node left the list before its replacement booted, and stays out until a repair completes
    assert c.node_exec(0, "cat", "/root/.clusterctl/live-hosts").stdout.split() == [f"{h}:1" for h in c.hosts[:2]]

    proc = ok(c.cli("repair", c.name, "--yes"))
    assert "cost: +$0.00/hour" in proc.stderr
    assert "dataset /root/data verified on 1 new node(s)" in proc.stderr, proc.stderr
    assert str(decoy) not in proc.stderr and (decoy / ".clusterctl-sync" / "COMPLETE").read_text() == "theirs\n"
    assert f"removed the lost node home {homes}/2.replaced-" in proc.stderr and not list(homes.glob("2.replaced-*"))
    # the new node has a new host key, pinned; the others' are kept
    new_key = (c.cli.home / "clusters" / c.name / "known_hosts").read_text()
    assert new_key != old_key and new_key.splitlines()[:2] == old_key.splitlines()[:2]
    assert [n["private_ip"] for n in record(c)["nodes"]] == c.hosts
    assert (c.cli.cwd / "hosts").read_text().split() == [x for h in c.hosts for x in (h, "slots=1")]
    # the dataset on the new node: verified and marked complete, the same bytes
    marker = json.loads(c.node_exec(2, "cat", "/root/data/.clusterctl-sync/COMPLETE").stdout)
    markers = [json.loads(c.node_exec(i, "cat", "/root/data/.clusterctl-sync/COMPLETE").stdout) for i in (0, 1)]
    assert markers[0] == first_marker  # the peer's own marker as it was (the relay from it only read its data)
    assert marker["files"] == 5 and marker["source"] == markers[0]["source"] == str(src)
    assert marker["manifest_sha256"] == markers[0]["manifest_sha256"] == markers[1]["manifest_sha256"]
    assert (
        c.node_exec(2, "sha256sum", "/root/data/f3.bin").stdout.split()[0]
        == __import__("hashlib").sha256((src / "f3.bin").read_bytes()).hexdigest()
    )
    # every node's hosts file names all three; the leader's live-hosts too
    res = runs(c, "cat ~/hosts | wc -l")
    assert sorted(r["stdout"].strip() for r in res) == ["3", "3", "3"] and all(r["exit_code"] == 0 for r in res), res
    assert c.node_exec(0, "cat", "/root/.clusterctl/live-hosts").stdout.split() == [f"{h}:1" for h in c.hosts]
    # the leader reaches the new member with its key checked
    ok(c.cli("run", "--cluster", c.name, f"ssh -o BatchMode=yes -o StrictHostKeyChecking=yes {c.hosts[2]} true"))
    assert "nothing to repair" in ok(c.cli("repair", c.name)).stderr


def test_repair_drop_removes_a_lost_leader_and_the_next_node_leads(local_cluster_factory):
    c = local_cluster_factory(3, 1)
    assert c.node_exec(0, "cat", "/root/.clusterctl/live-hosts").stdout.split() == [f"{h}:1" for h in c.hosts]  # up's
    kill_node(c, 0)
    proc = ok(c.cli("repair", c.name, "--drop", "--yes"))
    assert f"{c.name}-member-1 ({c.hosts[1]}) becomes the leader" in proc.stderr
    nodes = record(c)["nodes"]
    assert [(n["name"], n["role"]) for n in nodes] == [
        (f"{c.name}-member-1", "leader"),
        (f"{c.name}-member-2", "member"),
    ]
    assert (c.cli.cwd / "hosts").read_text().split() == [c.hosts[1], "slots=1", c.hosts[2], "slots=1"]
    res = runs(c, "cat ~/hosts | wc -l")
    assert [r["stdout"].strip() for r in res] == ["2", "2"]
    assert c.node_exec(1, "cat", "/root/.clusterctl/live-hosts").stdout.split() == [
        f"{c.hosts[1]}:1",
        f"{c.hosts[2]}:1",
    ]
    from clusterctl.providers.local import netns

    assert netns.netns_name(c.name, 0) not in netns.cluster_netns(c.name)  # the lost node's namespace is gone


def test_repair_watch_replaces_a_node_lost_while_it_runs(local_cluster_factory):
    c = local_cluster_factory(2, 1)
    bad = c.cli("repair", c.name, "--watch", "0.5", "--yes")
    assert bad.returncode == 2 and "Error: --watch 0.5 is too short" in bad.stderr
    assert "pass --yes with it" in c.cli("repair", c.name, "--watch", "2").stderr
    path = c.cli.home / "clusters" / c.name / "cluster.json"
    saved = json.loads(path.read_text())["updated_at"]
    p = c.cli.popen("repair", c.name, "--watch", "1", "--yes")
    try:
        kill_node(c, 1)
        from clusterctl.providers.local import netns

        wait_for(
            lambda: netns.node_alive(c.name, 1) is None and json.loads(path.read_text())["updated_at"] > saved,
            180,
            "the watch to repair the lost member",
        )
        assert [r["exit_code"] for r in runs(c, "true")] == [0, 0]
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    assert f"{c.name}-member-1 ({c.hosts[1]}): " in err and "repaired 1 node(s)" in err, err


def test_a_replaced_leader_gets_its_watchdog_and_supervisor_back(local_cluster_factory):
    """Autostop on a local cluster is the leader's watchdog plus a supervisor on this machine: a new leader
    gets both, as `up` gave them (its home is new, and the old supervisor's leader is gone)."""
    from clusterctl.providers.local import supervisor

    c = local_cluster_factory(2, 1, ("--idle-stop", "30m"))
    wait_for(lambda: supervisor.watchdog_running(c.name), 60, "the watchdog")
    before = supervisor.supervisors(c.name)
    assert len(before) == 1
    kill_node(c, 0)
    wait_for(lambda: not supervisor.watchdog_running(c.name), 30, "the lost leader's watchdog gone")
    ok(c.cli("repair", c.name, "--yes"))
    assert c.node_exec(0, "test", "-f", "/root/.clusterctl/autostop/config.json", check=False).returncode == 0
    wait_for(lambda: supervisor.watchdog_running(c.name), 60, "the new leader's watchdog")
    after = supervisor.supervisors(c.name)
    assert len(after) == 1 and after != before, (before, after)
    st = ok(c.cli("status", c.name))
    said = st.stdout + st.stderr
    # idle at the watchdog's last check, or busy then (repair's own ssh sessions may still be open): 30m either way
    assert "idle-stop 30m" in said or "it stops 30m after the last of them ends" in said, said
