"""What keeps a cluster up, signal by signal, and what idle does: the watchdog's decision (busy_reasons,
decide: pure functions of the probes) over samples recorded on this machine or written in the probe's
shape; the real probe against a real clusterctl tmux job; `status` lines; --idle-action end to end in the
settings, the nodes' files and the AWS request's shutdown behaviour."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from clusterctl.autostop import settings, watchdog
from clusterctl.cluster import autostop_status as status
from clusterctl.errors import ConfigError, UsageError
from clusterctl.node.watchdog import activity, files, leases, rules
from clusterctl.remote import nodepkg, tmux
from clusterctl.types import Autostop, ClusterFacts, ClusterSpec
from conftest import node_argv

CFG = {**files.DEFAULTS, "idle_stop": 60, "created_at": None}


def _probe(t: float, net: int = 0, disk: int = 0, **more) -> dict:
    """A probe as `watchdog probe` prints it (nothing running), read at time t."""
    return {"gpus": None, "training": [], "sessions": {}, "jobs": [], "io": {"t": t, "net": net, "disk": disk}, **more}


# ---- a clusterctl tmux job: the issue's `run --detach prep 'sleep 400'` ------------------------------------
@pytest.fixture
def private_tmux(tmp_path, monkeypatch):
    """A tmux server of this test alone (its own socket folder and HOME), as a node's login user has."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TMUX_TMPDIR", str(tmp_path))
    yield tmp_path
    subprocess.run(["tmux", "kill-server"], capture_output=True)


def _probe_here() -> dict:
    out = subprocess.run(node_argv("watchdog", "probe"), capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)


def test_a_detached_job_holds_the_cluster_whatever_it_runs_and_lets_go_when_it_ends(private_tmux):
    # the very command `run --detach prep 'sleep 400'` sends to each node (remote/tmux.py)
    started = subprocess.run(["sh", "-c", tmux.detach_command("prep", "sleep 400")], capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    jobs = [j for j in _probe_here()["jobs"] if j["name"] == "prep"]
    assert len(jobs) == 1 and jobs[0]["cmd"] == "sleep 400", jobs  # the pane shell's subshell is not a second job
    pane = subprocess.run(
        ["tmux", "display-message", "-p", "-t", "=prep:", "#{pane_pid}"], capture_output=True, text=True
    ).stdout.strip()
    assert jobs[0]["pid"] == int(pane)
    assert rules.busy_reasons("10.0.0.2", {"jobs": jobs}, {}, set(), False, CFG) == [
        f"10.0.0.2: detached job prep (tmux session prep, pid {pane}: sleep 400)"
    ]
    # `kill prep` ends it: nothing of it is left to hold the cluster
    subprocess.run(["sh", "-c", tmux.kill_job_command("prep")], capture_output=True, text=True, check=True)
    assert [j for j in _probe_here()["jobs"] if j["name"] == "prep"] == []


def test_the_issue_s_try_recorded_a_job_longer_than_idle_stop_keeps_the_cluster_and_its_end_lets_it_stop():
    """`up --idle-stop 1m`, `run --detach prep 'sleep 400'` (checks every 6 s): the job runs 400 s; the watchdog
    fires 60 s after the last check that saw it, never while it ran (it fired at 66 s)."""
    job = {"name": "prep", "pid": 1234, "cmd": "sleep 400"}
    started, last_active, last_reason, fired_at = 0.0, 0.0, "the watchdog started", None
    cfg = {**CFG, "idle_action": "stop"}
    prev: dict = {}
    for now in range(6, 1000, 6):
        pr = _probe(float(now), jobs=[job] if now <= 400 else [])
        reasons = rules.busy_reasons("this node", pr, prev, set(), now == 6, cfg)
        prev = pr
        last_active, last_reason, plan, why = rules.decide(cfg, reasons, last_active, last_reason, started, float(now))
        if now <= 400:
            assert why is None and plan["stop_at"] == now + 60, (now, plan)
        if why is not None:
            fired_at = now
            break
    assert fired_at == 456  # the last check that saw the job: 396 s; 60 s after it: 456 s
    assert why.startswith("idle-stop: nothing busy for 60s (limit 60s); last activity: this node: detached job prep")


# ---- ssh commands and interactive logins ------------------------------------------------------------------
def _session(faults, login="", *children):
    return {
        "faults": faults,
        "login": login,
        "children": [{"cmd": c, "own": activity.is_own(c)} for c in children],
    }


def test_an_interactive_login_and_an_ssh_command_are_busy_a_kept_connection_is_not():
    pr = _probe(10.0, sessions={"7:1": _session(20, "ubuntu@pts/0", "-bash"), "8:2": _session(5, "", "rsync --server")})
    assert rules.busy_reasons("n", pr, {}, set(), False, CFG) == [
        "n: interactive login ubuntu@pts/0 running -bash",
        "n: ssh session running rsync --server",
    ]
    kept = _probe(10.0, sessions={"9:3": _session(5, "ubuntu@notty")})
    assert rules.busy_reasons("n", kept, {"sessions": kept["sessions"]}, set(), False, CFG) == []


def test_a_clusterctl_command_is_shown_without_its_session_wrapper():
    from clusterctl.remote.session import wrap_command

    assert activity._shown("bash -c " + wrap_command("sleep 25; echo 'a b'")) == "sleep 25; echo 'a b'"
    assert activity._shown("rsync --server -e.LsfxC . /data") == "rsync --server -e.LsfxC . /data"


def test_the_probe_names_the_login_of_a_session():
    """The probe's own parse of sshd's title ("sshd: user@pts/0" for a terminal, "user@notty" for a command)."""
    pr = _probe_here()  # this machine's sessions, whichever there are: each says whether it is a terminal
    assert all(isinstance(s.get("login"), str) for s in pr["sessions"].values())


# ---- GPU use ------------------------------------------------------------------------------------------------
def test_gpu_use_at_or_above_the_threshold_is_busy():
    assert rules.busy_reasons("n", _probe(1.0, gpus=[0, 3]), {}, set(), False, CFG) == ["n: GPU 1 at 3%"]
    assert rules.busy_reasons("n", _probe(1.0, gpus=[0, 3]), {}, set(), False, {**CFG, "gpu_busy_percent": 5}) == []
    assert rules.busy_reasons("n", _probe(1.0, gpus=None), {}, set(), False, CFG) == []  # no nvidia-smi


# ---- network and disk throughput ------------------------------------------------------------------------------
def test_network_and_disk_throughput_above_their_floors_are_busy_between_two_checks():
    before = _probe(100.0, net=10_000_000, disk=50_000_000)
    copying = _probe(130.0, net=10_000_000 + 30 * 40_000_000, disk=50_000_000 + 30 * 2_000_000)  # 40 MB/s, 2 MB/s
    assert rules.busy_reasons("n", copying, before, set(), False, CFG) == [
        "n: network 40.0 MB/s (above 262 KB/s)",
        "n: disk 2.0 MB/s (above 1.0 MB/s)",
    ]
    # the watchdog's own checks, journald, NTP: a few KB/s is idle
    quiet = _probe(130.0, net=10_000_000 + 30 * 5_000, disk=50_000_000 + 30 * 20_000)
    assert rules.busy_reasons("n", quiet, before, set(), False, CFG) == []
    # a floor of None turns the signal off (local nodes: the disks are this machine's, shared with everyone)
    assert rules.busy_reasons("n", copying, before, set(), False, {**CFG, "disk_busy_bytes_per_s": None}) == [
        "n: network 40.0 MB/s (above 262 KB/s)"
    ]
    # no earlier sample, a counter that went back (a reboot), a missing file: no rate, no claim
    assert rules.throughput(copying, {}) == {"net": None, "disk": None}
    assert rules.throughput(before, copying) == {"net": None, "disk": None}
    assert rules.throughput(
        {"io": {"t": 130.0, "net": None, "disk": 5}}, {"io": {"t": 100.0, "net": 1, "disk": 2}}
    ) == {
        "net": None,
        "disk": 0.1,
    }


def test_the_probe_reads_this_machines_counters():
    a = activity.io_counters()
    assert isinstance(a["net"], int) and a["net"] >= 0 and a["t"] == pytest.approx(time.time(), abs=5)
    assert a["disk"] is None or a["disk"] >= 0
    b = activity.io_counters()
    assert b["net"] >= a["net"]


# ---- leases and the order of the reasons ------------------------------------------------------------------
def test_every_signal_of_one_node_is_listed_most_telling_first(tmp_path):
    pr = _probe(
        130.0,
        net=100_000_000,
        jobs=[{"name": "sweep-1", "pid": 9, "cmd": "python3 /root/.clusterctl/node/node-0.pyz sweep /root/s"}],
        training=["python3[12] train.py"],
        gpus=[55],
        sessions={"1:1": _session(3, "", "sleep 5")},
    )
    reasons = rules.busy_reasons("n", pr, _probe(100.0), set(), False, CFG)
    assert [r.split(": ", 1)[1].split(" ")[0] for r in reasons] == ["detached", "ssh", "python3[12]", "GPU", "network"]
    leases.take_lease(str(tmp_path), "sync-1", 60, "clusterctl sync from me@laptop")
    assert leases.leases(str(tmp_path))[0].startswith("lease sync-1: clusterctl sync from me@laptop runs")


# ---- what `status` and `autostop` say -------------------------------------------------------------------------
def test_status_names_the_signal_that_holds_the_cluster_and_the_idle_action():
    now = time.time()
    cfg = {**CFG, "idle_action": "stop"}
    st = {
        "config": cfg,
        "running": True,
        "now": now,
        "state": {
            "checked_at": now - 4,
            "last_active": now - 4,
            "last_reason": "x",
            "busy": ["10.0.0.2: detached job prep (tmux session prep, pid 1234: sleep 400)"],
        },
        "plan": rules.plan(cfg, now - 4, now - 100, now),
    }
    lines = status.summary(st, now=now)
    assert lines[0] == "autostop: busy: 10.0.0.2: detached job prep (tmux session prep, pid 1234: sleep 400)"
    assert lines[1] == "autostop: held by the above (checked 4s ago): it stops 60s after the last of them ends"
    assert lines[-1].startswith("autostop: when it fires: stop: the nodes power off, their disks are kept")
    assert not any("if nothing runs" in line for line in lines)
    idle = {**st, "state": {**st["state"], "busy": []}, "config": {**cfg, "idle_action": "terminate"}}
    lines = status.summary(idle, now=now)
    assert lines[0].startswith("autostop: terminates in ") and "if nothing runs (idle-stop 60s" in lines[0]
    assert lines[-1].startswith("autostop: when it fires: terminate: the nodes and their disks are removed")


# ---- --idle-action ----------------------------------------------------------------------------------------------
def test_idle_action_is_parsed_described_recorded_and_written_for_the_nodes():
    assert settings.settings("30m", None) == Autostop(1800, None, "stop")  # the default: nothing lost
    a = settings.settings("30m", None, "terminate")
    assert a.idle_action == "terminate" and ClusterFacts(a.extra()).autostop == a
    old = ClusterFacts({"autostop_idle_stop": "60", "autostop_max_lifetime": ""}).autostop  # before --idle-action
    assert old is not None and old.idle_action == "terminate"
    with pytest.raises(UsageError, match="neither stop nor terminate"):
        settings.settings("30m", None, "down")
    assert settings.describe(Autostop(1800, None, "stop")).startswith("stops itself after 30m with nothing busy")
    assert "idle action stop: the nodes power off, their disks are kept" in settings.describe(Autostop(1800))
    assert settings.describe(Autostop(1800, None, "terminate")).startswith("terminates itself after 30m")
    local = watchdog.node_config("c", a, poweroff="node-init", user="root", script="s", created_at=1.0)
    aws = watchdog.node_config("c", Autostop(60), poweroff="shutdown", user="ubuntu", script="s", created_at=None)
    assert (local["idle_action"], local["disk_busy_bytes_per_s"]) == ("terminate", None)
    assert aws["idle_action"] == "stop" and "disk_busy_bytes_per_s" not in aws  # the watchdog's floor
    assert rules.idle_action({}) == "terminate" and rules.idle_action(aws) == "stop"  # a file from before: what it did


def test_the_aws_instances_shut_down_as_the_idle_action_says_and_spot_cannot_stop():
    from clusterctl.providers.aws import instances
    from clusterctl.providers.aws.options import AwsOptions

    spec = ClusterSpec("c", "aws", 2, autostop=Autostop(60, None, "stop"))
    assert instances.shutdown_behavior(spec) == "stop"
    assert instances.shutdown_behavior(ClusterSpec("c", "aws", 2, autostop=Autostop(60, None, "terminate"))) == (
        "terminate"
    )
    spot = ClusterSpec("c", "aws", 2, options={"spot": True}, autostop=Autostop(60, None, "stop"))
    with pytest.raises(ConfigError, match="cannot be stopped") as err:
        AwsOptions.from_spec(spot)
    assert "--idle-action terminate" in (err.value.hint or "")
    AwsOptions.from_spec(ClusterSpec("c", "aws", 2, options={"spot": True}, autostop=Autostop(60, None, "terminate")))


def test_a_local_cluster_started_again_forgets_its_last_firing(tmp_path):
    from clusterctl.state import StateStore

    store = StateStore(tmp_path)
    d = watchdog.local_dir(store, "c")
    d.mkdir(parents=True)
    (d / "fired.json").write_text('{"reason": "idle-stop"}')
    (d / "state.json").write_text("{}")
    watchdog.install_local(store, "c", [0], Autostop(60), time.time())
    assert sorted(os.listdir(d)) == ["config.json"]
    # the watchdog runs from the node package, put where shipping it would put it in the node's home
    pkg = nodepkg.package()
    assert (d.parent.parent / pkg.path).read_bytes() == pkg.data
    assert (
        watchdog.local_command(store, "c")
        == f"/usr/bin/python3 {pkg.at('/root')} watchdog run --dir {watchdog.LOCAL_NODE_DIR}"
    )


@pytest.mark.parametrize("broken", [b"print('other bytes')\n", b"PK\x03\x04 cut short"])
def test_a_local_nodes_package_under_its_name_but_of_other_bytes_is_written_again(tmp_path, broken):
    from clusterctl.state import StateStore

    store = StateStore(tmp_path)
    pkg = nodepkg.package()
    archive = watchdog.local_dir(store, "c").parent.parent / pkg.path
    archive.parent.mkdir(parents=True)
    archive.write_bytes(broken)
    watchdog.install_local(store, "c", [0], Autostop(60), time.time())
    assert archive.read_bytes() == pkg.data
