"""Autostop for real on local clusters: the watchdog inside the leader node, the supervisor on the host.

Three clusters at once (the waits overlap): one goes idle after its last command and must stop itself
about --idle-stop later, one is kept busy by a training-like process on its member only (which the
leader sees over ssh) and must not stop, one hits --max-lifetime while busy.
"""

from __future__ import annotations

import json
import socket
import time

from clusterctl import autostop
from clusterctl.providers import netns


def _record(cli, name: str) -> dict:
    return json.loads((cli.home / "clusters" / name / "cluster.json").read_text())


def _wait_gone(cli, name: str, timeout: float) -> float | None:
    """When the cluster's namespaces went away (None: not within timeout), once the supervisor has also
    finished its teardown (the record says "stopped")."""
    deadline = time.monotonic() + timeout
    gone = None
    while time.monotonic() < deadline:
        if gone is None and not netns.cluster_netns(name):
            gone = time.monotonic()
        if gone is not None and _record(cli, name)["status"] == "stopped":
            return gone
        time.sleep(0.25)
    return None


def _answers(host: str) -> bool:
    try:
        with socket.create_connection((host, 22), timeout=1):
            return True
    except OSError:
        return False


def test_idle_cluster_stops_after_its_last_command_busy_one_does_not_old_one_does(local_cluster_factory):
    idle = local_cluster_factory(2, 1, ("--idle-stop", "20s"))
    busy = local_cluster_factory(2, 1, ("--idle-stop", "20s"))
    old = local_cluster_factory(1, 1, ("--idle-stop", "off", "--max-lifetime", "30s"))
    cli = idle.cli
    for c in (idle, busy, old):
        assert autostop.supervisors(c.name), f"no supervisor for {c.name}"

    # busy: a training-like process on the member only, detached (no ssh session stays open for it)
    member_hosts = cli.cwd / "busy-member"
    member_hosts.write_text(f"{busy.hosts[1]} slots=1\n")
    sleeper = "python3 -c 'import time; time.sleep(900)'"
    assert cli("run", "--detach", "train", str(member_hosts), sleeper).returncode == 0
    assert cli("run", "--cluster", old.name, "--detach", "train", sleeper).returncode == 0

    # idle: a command that runs longer than --idle-stop keeps the cluster up while it runs
    assert cli("run", "--cluster", idle.name, "sleep 25", timeout=120).returncode == 0
    last_command = time.monotonic()
    assert netns.cluster_netns(idle.name) and _answers(idle.hosts[0]), "stopped while a command ran"
    status = cli("status", idle.name)
    assert "autostop: stops in" in status.stdout and "if nothing runs (idle-stop 20s" in status.stdout, status.stdout

    # ... and about --idle-stop after that last command, it stops itself: namespaces, sshd, supervisor gone
    gone = _wait_gone(cli, idle.name, 90)
    assert gone is not None, f"{idle.name} is still up: {cli('status', idle.name).stdout}"
    assert gone - last_command >= 15, f"stopped {gone - last_command:.1f}s after the last command"
    # (its addresses may already serve another cluster on this machine: its namespaces and processes are what count)
    assert netns.leftovers(idle.name).empty and not (cli.home / "clusters" / idle.name / "nodes").exists()
    deadline = time.monotonic() + 10
    while autostop.supervisors(idle.name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert autostop.supervisors(idle.name) == []
    rec = _record(cli, idle.name)
    assert rec["status"] == "stopped", rec
    assert rec["note"].startswith("stopped by autostop at ") and "idle-stop: nothing busy for " in rec["note"]
    assert "(limit 20s); last activity: " in rec["note"] and "ssh session" in rec["note"], rec["note"]
    proc = cli("ls")
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith(idle.name))
    assert "stopped" in row and "stopped by autostop" in row, row
    assert "total: $0.00/hour now, $0.00 so far for 3 cluster(s)" in proc.stderr, proc.stderr
    assert "autostop: stopped by autostop at" in cli("status", idle.name).stdout
    proc = cli("keep", idle.name, "--for", "1h")
    assert proc.returncode == 3 and f"Error: cluster {idle.name} is stopped (stopped by autostop at" in proc.stderr

    # old: max lifetime wins over a busy job
    assert _wait_gone(cli, old.name, 30) is not None, f"{old.name} outlived --max-lifetime 30s"
    rec = _record(cli, old.name)
    assert rec["status"] == "stopped" and "max-lifetime: up " in rec["note"] and "(limit 30s)" in rec["note"], rec

    # busy: well past its idle window, still up, and its leader knows why (the member's python)
    assert netns.cluster_netns(busy.name) and all(_answers(h) for h in busy.hosts)
    lines = cli("status", busy.name).stdout
    assert f"{busy.hosts[1]}: python3[" in lines and "time.sleep(900)" in lines, lines
    assert _record(cli, busy.name)["status"] == "up"

    # keep: no stop before then; --off: a warning; --on with a new limit
    proc = cli("keep", busy.name, "--for", "4h")
    assert proc.returncode == 0 and "autostop waits until" in proc.stderr and "autostop: kept until" in proc.stdout
    cfg = json.loads((autostop.local_dir(cli_store(cli), busy.name) / "config.json").read_text())
    assert 4 * 3600 - 60 < cfg["keep_until"] - time.time() <= 4 * 3600
    proc = cli("autostop", busy.name, "--off")
    assert proc.returncode == 0 and "Warning:" in proc.stderr and f"runs until `clusterctl down {busy.name}`" in proc.stderr
    assert "autostop: OFF" in proc.stdout
    proc = cli("autostop", busy.name, "--on", "--idle-stop", "30m")
    assert proc.returncode == 0 and "autostop: stops in" in proc.stdout and "idle-stop 30m" in proc.stdout, proc.stdout
    assert cli("keep", busy.name, "--for", "soon").returncode == 2


def cli_store(cli):
    from clusterctl.state import StateStore

    return StateStore(cli.home)
