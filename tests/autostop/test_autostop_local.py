"""Autostop for real on local clusters: the watchdog inside the leader node, the supervisor on the host.

Three clusters at once (the waits overlap): one goes idle after its last command and must stop itself
about --idle-stop later, one is kept busy by a training-like process on its member only (which the
leader sees over ssh) and must not stop, one hits --max-lifetime while busy.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from clusterctl.autostop import watchdog
from clusterctl.node.watchdog.activity import is_own
from clusterctl.providers.local import netns, supervisor
from clusterctl.remote import nodepkg

pytestmark = pytest.mark.integration


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
    # on a loaded machine one bring-up takes longer than --idle-stop: the first two are held off (--off)
    # until the last is up, then turned on with their limit (idle time counts from then)
    idle = local_cluster_factory(2, 1, ("--idle-stop", "20s"))
    cli = idle.cli
    assert cli("autostop", idle.name, "--off").returncode == 0
    busy = local_cluster_factory(2, 1, ("--idle-stop", "20s"))
    assert cli("autostop", busy.name, "--off").returncode == 0
    old = local_cluster_factory(1, 1, ("--idle-stop", "off", "--max-lifetime", "30s", "--idle-action", "terminate"))
    for c in (idle, busy):
        assert cli("autostop", c.name, "--on", "--idle-stop", "20s").returncode == 0
    for c in (idle, busy, old):
        assert supervisor.supervisors(c.name), f"no supervisor for {c.name}"

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
    # idle at the last check, or (the check came while the command ran) held by it: 20s after either way
    out = status.stdout
    assert ("autostop: stops in" in out and "if nothing runs (idle-stop 20s" in out) or (
        "autostop: busy: " in out and "it stops 20s after the last of them ends" in out
    ), out

    # ... and about --idle-stop after that last command, it stops itself: namespaces, sshd, supervisor gone
    gone = _wait_gone(cli, idle.name, 90)
    assert gone is not None, f"{idle.name} is still up: {cli('status', idle.name).stdout}"
    assert gone - last_command >= 15, f"stopped {gone - last_command:.1f}s after the last command"
    # (its addresses may already serve another cluster on this machine: its namespaces and processes are what count)
    # stop (the default --idle-action): the nodes' homes are kept for the next `up` of this name
    assert netns.leftovers(idle.name).empty and (cli.home / "clusters" / idle.name / "nodes" / "1" / "home").is_dir()
    deadline = time.monotonic() + 10
    while supervisor.supervisors(idle.name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert supervisor.supervisors(idle.name) == []
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
    # terminate: the homes went with the nodes
    assert (
        rec["note"].startswith("terminated by autostop at ")
        and not (cli.home / "clusters" / old.name / "nodes").exists()
    )

    # busy: well past its idle window, still up, and its leader knows why (the member's python)
    assert netns.cluster_netns(busy.name) and all(_answers(h) for h in busy.hosts)
    lines = cli("status", busy.name).stdout
    assert f"{busy.hosts[1]}: python3[" in lines and "time.sleep(900)" in lines, lines
    assert _record(cli, busy.name)["status"] == "up"

    # keep: no stop before then; --off: a warning; --on with a new limit
    proc = cli("keep", busy.name, "--for", "4h")
    assert proc.returncode == 0 and "autostop waits until" in proc.stderr and "autostop: kept until" in proc.stdout
    cfg = json.loads((watchdog.local_dir(cli_store(cli), busy.name) / "config.json").read_text())
    assert 4 * 3600 - 60 < cfg["keep_until"] - time.time() <= 4 * 3600
    proc = cli("autostop", busy.name, "--off")
    assert (
        proc.returncode == 0
        and "Warning:" in proc.stderr
        and f"runs until `clusterctl down {busy.name}`" in proc.stderr
    )
    assert "autostop: OFF" in proc.stdout
    proc = cli("autostop", busy.name, "--on", "--idle-stop", "30m")
    out = proc.stdout  # the last check's view: from before --on (nothing held it then), or the member's job
    assert proc.returncode == 0 and (
        ("autostop: stops in" in out and "idle-stop 30m" in out)
        or (f"autostop: busy: {busy.hosts[1]}: detached job train" in out and "it stops 30m after the last" in out)
    ), out
    assert cli("keep", busy.name, "--for", "soon").returncode == 2


def cli_store(cli):
    from clusterctl.state import StateStore

    return StateStore(cli.home)


NVIDIA_SMI = "#!/bin/sh\necho 0\necho 0\n"  # two GPUs, both idle: what a p3 shows during a copy or a pip install


def test_gpu_cluster_with_idle_gpus_stays_up_while_a_command_or_a_sync_runs(local_cluster_factory, tmp_path):
    """Issue 14: on GPU nodes the watchdog looked at GPU use only. A stand-in nvidia-smi (each node's /usr/local
    is its own tmpfs) reports two idle GPUs; a command longer than --idle-stop must keep the cluster up, and a
    sync holds a lease while it runs, released after it (also when it fails)."""
    c = local_cluster_factory(2, 1, ("--idle-stop", "20s"))
    for i in range(2):
        c.node_exec(
            i,
            "sh",
            "-c",
            'mkdir -p /usr/local/bin && printf "%s" "$0" > /usr/local/bin/nvidia-smi && '
            "chmod 755 /usr/local/bin/nvidia-smi",
            NVIDIA_SMI,
        )
    # the leader's watchdog sees the GPUs: its own probe, run the way it runs inside the node
    pids = [p for p in netns.netns_pids(netns.netns_name(c.name, 0)) if is_own(supervisor._cmdline(p))]
    assert pids, "no watchdog in the leader"
    assert nodepkg.package().at(watchdog.LOCAL_HOME) in supervisor._cmdline(pids[0])  # run from the node package
    probe = c.node_exec(0, "/usr/bin/python3", nodepkg.package().at(watchdog.LOCAL_HOME), "watchdog", "probe")
    assert json.loads(probe.stdout)["gpus"] == [0, 0], probe.stdout
    env = dict(e.split("=", 1) for e in open(f"/proc/{pids[0]}/environ").read().split("\0") if "=" in e)
    assert "/usr/local/bin" in env.get("PATH", "").split(":"), env.get("PATH")

    # a command longer than --idle-stop on the member: idle GPUs, but the node is not idle
    member = c.cli.cwd / "member"
    member.write_text(f"{c.hosts[1]} slots=1\n")
    proc = c.cli("run", "--cluster", c.name, str(member), "sleep 40", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert netns.cluster_netns(c.name) and _answers(c.hosts[0]), "stopped while a command ran on idle GPUs"
    assert _record(c.cli, c.name)["status"] == "up"
    st = json.loads((watchdog.local_dir(cli_store(c.cli), c.name) / "state.json").read_text())
    assert f"{c.hosts[1]}: " in st["last_reason"] and "ssh session" in st["last_reason"], st

    # a sync holds a lease while it runs (on every node's watchdog folder), gone after it
    src = tmp_path / "data"
    src.mkdir()
    for i in range(200):
        (src / f"f{i:04d}.bin").write_bytes(bytes([i % 256]) * 20000)
    folders = [watchdog.local_dir(cli_store(c.cli), c.name, i) / "leases" for i in range(2)]

    def sync_watching_leases(*args: str):
        p = c.cli.popen("sync", "--cluster", c.name, *args)
        seen: dict = {}
        while p.poll() is None:
            for f in folders:
                for lease in f.glob("*.json") if f.exists() else []:
                    try:
                        seen[lease.name] = json.loads(lease.read_text())
                    except (OSError, ValueError):
                        pass
            time.sleep(0.01)
        out, err = p.communicate()
        return p.returncode, out + err, seen

    rc, out, seen = sync_watching_leases(str(src), "/tmp/cc-lease-data")
    assert rc == 0, out
    assert seen and all(n.startswith("sync-") for n in seen), seen
    assert all("clusterctl sync from " in v["what"] and v["until"] > time.time() for v in seen.values()), seen
    assert not any(list(f.glob("*.json")) for f in folders if f.exists()), "the lease outlived the sync"
    # a sync that fails on the nodes (a top-level DST with --delete is refused there): released as well
    rc, out, seen = sync_watching_leases("--delete", str(src), "/cc-lease-top")
    assert rc == 2 and "top-level" in out, out
    assert seen, "no lease during the refused sync"
    assert not any(list(f.glob("*.json")) for f in folders if f.exists()), "a failed sync left its lease"
