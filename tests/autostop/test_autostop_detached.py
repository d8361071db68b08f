"""The issue's try on a local cluster: `run --detach prep 'sleep N'` on a cluster with a short --idle-stop.
The cluster must be up well past its idle window while the job runs, say that the job holds it, and stop
once the job ended; stop keeps the nodes' homes (what the job wrote), and `up` starts the cluster again."""

from __future__ import annotations

import json
import time

import pytest

from clusterctl.providers.local import netns

pytestmark = pytest.mark.integration

IDLE = 10  # seconds: short, and still five checks of the watchdog (it polls every tenth, at least every 1 s)
JOB = 40  # seconds the detached job runs: four idle windows


def _record(cli, name: str) -> dict:
    return json.loads((cli.home / "clusters" / name / "cluster.json").read_text())


def test_a_detached_job_keeps_the_cluster_up_and_its_end_lets_it_stop_with_its_homes_kept(local_cluster_factory):
    c = local_cluster_factory(2, 1, ("--idle-stop", f"{IDLE}s"))
    cli = c.cli
    # a loaded machine may take longer than the idle window between `up` and the job: held off until it runs
    assert cli("autostop", c.name, "--off").returncode == 0
    proc = cli("run", "--cluster", c.name, "--detach", "prep", f"sleep {JOB}; echo done > /root/prep.out")
    assert proc.returncode == 0, proc.stderr
    started = time.monotonic()
    proc = cli("autostop", c.name, "--on", "--idle-stop", f"{IDLE}s")
    assert proc.returncode == 0, proc.stderr

    # three idle windows later the job still runs, and the cluster is up because of it
    time.sleep(3 * IDLE)
    assert netns.cluster_netns(c.name) and _record(cli, c.name)["status"] == "up", "stopped while a job ran"
    out = cli("autostop", c.name).stdout
    leader, member = c.hosts
    assert f"autostop: busy: {leader} (leader): detached job prep (tmux session prep, pid " in out, out
    assert f"autostop: busy: {member}: detached job prep (tmux session prep, pid " in out, out
    assert (
        f"sleep {JOB}; echo done > /root/prep.out)" in out and f"it stops {IDLE}s after the last of them ends" in out
    ), out
    assert "if nothing runs" not in out
    assert "autostop: when it fires: stop: the nodes power off, their disks are kept" in out

    # the job ends; about --idle-stop later the cluster stops itself
    deadline = time.monotonic() + JOB + 120
    while netns.cluster_netns(c.name) and time.monotonic() < deadline:
        time.sleep(0.25)
    gone = time.monotonic()
    assert not netns.cluster_netns(c.name), f"still up: {cli('status', c.name).stdout}"
    assert gone - started >= JOB + IDLE - 2, f"stopped {gone - started:.0f}s after the job started (it ran {JOB}s)"
    while _record(cli, c.name)["status"] != "stopped" and time.monotonic() < deadline:
        time.sleep(0.25)
    rec = _record(cli, c.name)
    assert rec["status"] == "stopped" and rec["note"].startswith("stopped by autostop at "), rec
    assert f"(the nodes' homes kept: `clusterctl start {c.name}` starts it again)" in rec["note"]
    assert "idle-stop: nothing busy" in rec["note"]
    assert "detached job prep" in rec["note"], rec["note"]  # the last activity it saw
    # the job's output, on the stopped nodes' disks
    homes = [cli.home / "clusters" / c.name / "nodes" / str(i) / "home" for i in range(2)]
    for home in homes:
        assert (home / "prep.out").read_text() == "done\n"
        assert (home / ".clusterctl" / "jobs" / "prep.exit").read_text().strip() == "0"

    # `up` of the same name starts it again, with what its homes held
    proc = cli(
        "up", "--provider", "local", "--name", c.name, "--nodes", "2", "--slots", "1", "--yes",
        "--runtime", "none", "--idle-stop", "off", timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _record(cli, c.name)["status"] == "up"
    proc = cli("run", "--cluster", c.name, "cat /root/prep.out")
    assert proc.returncode == 0 and proc.stdout.count("done") == 2, proc.stdout + proc.stderr


def test_the_plan_says_what_idle_does(cli):
    proc = cli("up", "--provider", "local", "--name", "plan1", "--idle-stop", "30m", "--dry-run")
    assert "plan: autostop: stops itself after 30m with nothing busy" in proc.stderr, proc.stderr
    assert "idle action stop: the nodes power off, their disks are kept" in proc.stderr
    proc = cli("up", "--provider", "local", "--idle-action", "terminate", "--dry-run")
    assert "plan: autostop: terminates itself after 60m" in proc.stderr, proc.stderr
    assert "idle action terminate: the nodes and their disks are removed" in proc.stderr
    proc = cli("up", "--provider", "local", "--idle-action", "down", "--dry-run")
    assert proc.returncode == 2 and "Error: --idle-action 'down' is neither stop nor terminate" in proc.stderr
