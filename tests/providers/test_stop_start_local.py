"""`stop` and `start` on a local cluster, end to end: the namespaces end and the homes stay, the record and
`status` say so (and what it costs: nothing), and `start` brings back the same hosts with the same pinned host
keys, the files of the homes, and autostop's supervisor."""

from __future__ import annotations

import json
import time

import pytest

from clusterctl.cluster.reach import paths
from clusterctl.providers.local import netns, supervisor
from clusterctl.state import StateStore

pytestmark = pytest.mark.integration


def test_stop_keeps_the_homes_and_start_brings_back_the_same_hosts_and_keys(local_cluster_factory):
    c = local_cluster_factory(2, 1)
    cli, name = c.cli, c.name
    known_hosts = paths(StateStore(cli.home), name).known_hosts
    pinned = known_hosts.read_text()
    proc = cli("ssh", "-c", name, "member-1", "--", "echo kept > /root/kept.txt")
    assert proc.returncode == 0, proc.stderr
    assert cli("run", "--cluster", name, "--detach", "hold", "sleep 600").returncode == 0

    # a running job: named, and stop refuses without --yes
    refused = cli("stop", "-c", name)
    assert refused.returncode == 2, refused.stderr
    assert "running: job " in refused.stderr and " hold (run, on " in refused.stderr, refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"Error: 1 job(s) run on cluster {name}, and stopping it ends them: let them finish "
        f"(`clusterctl jobs -c {name}`), or pass --yes to stop it anyway"
    )
    assert netns.cluster_netns(name)

    proc = cli("stop", name, "--yes")
    assert proc.returncode == 0, proc.stderr
    assert f"cluster {name} is stopped; while stopped: $0.00 (its homes are folders on this machine)" in proc.stderr
    assert not netns.cluster_netns(name) and netns.leftovers(name).empty
    assert not supervisor.supervisors(name)
    home = cli.home / "clusters" / name / "nodes" / "1" / "home"
    assert (home / "kept.txt").read_text() == "kept\n"
    rec = json.loads((cli.home / "clusters" / name / "cluster.json").read_text())
    assert rec["status"] == "stopped" and rec["note"].startswith("stopped by ") and "`clusterctl stop`" in rec["note"]

    status = cli("status", "-c", name)
    assert status.returncode == 0, status.stderr  # a stopped cluster's nodes are not lost
    assert f"stopped: {rec['note']}" in status.stdout and "while stopped: $0.00" in status.stdout, status.stdout
    doc = json.loads(cli("status", "-c", name, "--json").stdout)
    assert doc["stopped"] == {"note": rec["note"], "disks_monthly_usd": 0.0} and doc["lost"] == []
    (row,) = json.loads(cli("ls", "--json").stdout)["clusters"]
    assert (row["state"], row["stopped_monthly_usd"]) == ("stopped", 0.0) and "while stopped: $0.00" in row["note"]
    again = cli("stop", name)
    assert again.returncode == 0 and f"cluster {name} is already stopped (stopped by " in again.stderr

    proc = cli("start", "-c", name, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"cluster {name} is up again: 2 node(s) in " in proc.stderr
    assert f"hosts: {', '.join(c.hosts)}" in proc.stderr
    assert known_hosts.read_text() == pinned  # the same addresses, the same host keys
    assert supervisor.supervisors(name), "autostop's supervisor is not back"
    deadline = time.monotonic() + 20  # it starts the watchdog in the leader once it sees the leader's sshd
    while not supervisor.watchdog_running(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert supervisor.watchdog_running(name), "autostop's watchdog is not back in the leader"
    assert "autostop: " in cli("status", name).stdout
    run = cli("run", "--cluster", name, "hostname; cat /root/kept.txt 2>/dev/null || true")
    assert run.returncode == 0, run.stderr
    assert f"{name}-leader" in run.stdout and f"{name}-member-1" in run.stdout and "kept" in run.stdout, run.stdout
    assert json.loads((cli.home / "clusters" / name / "cluster.json").read_text())["status"] == "up"
    again = cli("start", name)
    assert again.returncode == 0 and f"cluster {name} is already running; nothing to do" in again.stderr

    assert cli("down", name, "--yes", timeout=120).returncode == 0
    assert not netns.cluster_netns(name) and not (cli.home / "clusters" / name).exists()
