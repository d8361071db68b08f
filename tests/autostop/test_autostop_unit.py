"""Autostop, gc and costs without nodes: durations, the watchdog's rules and deadlines, the files it
reads and writes, what the user data carries, what `gc` keeps, what a run costs."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from clusterctl.autostop import settings as autostop, watchdog
from clusterctl.cluster import autostop_status as status, costs, gc
from clusterctl.errors import UsageError
from clusterctl.node.watchdog import activity, files, leases, peers, rules
from clusterctl.proc import alive
from clusterctl.providers.aws import cloud_init
from clusterctl.providers.base import Found
from clusterctl.providers.local import supervisor
from clusterctl.remote import nodepkg
from clusterctl.types import Autostop, Cluster, ClusterFacts, Node
from conftest import REPO, node_argv


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("20s", 20),
        ("30m", 1800),
        ("12h", 43200),
        ("1h30m", 5400),
        ("2d", 172800),
        ("1.5h", 5400),
        ("off", None),
        ("0", None),
        ("never", None),
    ],
)
def test_durations(text, seconds):
    assert autostop.parse_duration(text, "--idle-stop") == seconds


@pytest.mark.parametrize("text", ["30", "m", "-5m", "1 h", "soon", ""])
def test_bad_durations_are_usage_errors(text):
    with pytest.raises(UsageError, match="is not a duration"):
        autostop.parse_duration(text, "--idle-stop")
    with pytest.raises(UsageError):
        autostop.parse_duration("off", "--for", allow_off=False)


def test_settings_default_and_description():
    assert autostop.settings(None, None) == Autostop(3600, None)
    a = autostop.settings("30m", "12h")
    assert a == Autostop(1800, 43200) and autostop.poll_seconds(a) == 60
    assert autostop.poll_seconds(Autostop(20, None)) == 2 and autostop.poll_seconds(Autostop(None, 30)) == 3
    assert "after 30m with nothing busy" in autostop.describe(a) and "at the latest 12h00m after" in autostop.describe(
        a
    )
    assert autostop.describe(Autostop(None, None)).startswith("off")
    assert ClusterFacts(a.extra()).autostop == a and ClusterFacts({}).autostop is None
    assert ClusterFacts(Autostop(None, 60).extra()).autostop == Autostop(None, 60)


# ---- the watchdog's deadlines ---------------------------------------------------------------------------
def test_plan_idle_lifetime_keep_and_off():
    cfg = {"enabled": True, "idle_stop": 60, "max_lifetime": 3600, "created_at": 1000.0, "keep_until": None}
    p = rules.plan(cfg, last_active=1100.0, started=1000.0, now=1130.0)
    assert (p["stop_at"], p["why"], p["idle_for"]) == (1160.0, "idle-stop", 30.0)
    p = rules.plan(cfg, last_active=4590.0, started=1000.0, now=4595.0)
    assert (p["stop_at"], p["why"]) == (4600.0, "max-lifetime")  # lifetime comes first
    p = rules.plan({**cfg, "keep_until": 9000.0}, last_active=1100.0, started=1000.0, now=1130.0)
    assert (p["stop_at"], p["why"]) == (9000.0, "max-lifetime") and p["idle_at"] == 9060.0
    assert rules.plan({**cfg, "enabled": False}, 1100.0, 1000.0, 1130.0)["stop_at"] is None
    assert rules.plan({**cfg, "idle_stop": None, "max_lifetime": None}, 1100.0, 1000.0, 1130.0)["stop_at"] is None
    # no launch time in the settings (AWS): --max-lifetime counts from the node's boot
    p = rules.plan({**cfg, "created_at": None, "idle_stop": None}, time.time(), time.time(), time.time())
    assert p["lifetime_at"] == pytest.approx(rules.boot_time() + 3600, abs=2)


# ---- the watchdog's activity rules ------------------------------------------------------------------------
def _session(faults, *children):
    return {"faults": faults, "children": [{"cmd": c, "own": activity.is_own(c)} for c in children]}


def test_gpu_nodes_are_busy_when_any_signal_says_so():
    own: set = set()
    busy = {"gpus": [0, 87], "training": ["python3[5] train.py"], "sessions": {"1:1": _session(9, "bash")}}
    assert rules.busy_reasons("n1", busy, {}, own, False) == [
        "n1: ssh session running bash",
        "n1: python3[5] train.py",
        "n1: GPU 1 at 87%",
    ]
    # idle GPUs do not make a copy or a shell idle (this returned [] before: a 3-hour sync was stopped)
    assert rules.busy_reasons("n1", {**busy, "gpus": [0, 0]}, {}, own, False) == [
        "n1: ssh session running bash",
        "n1: python3[5] train.py",
    ]
    assert rules.busy_reasons("n1", {"gpus": [0, 0], "training": [], "sessions": {}}, {}, own, False) == []


def test_leases_count_until_they_expire_or_are_released(tmp_path):
    d = str(tmp_path)
    assert leases.leases(d) == []
    leases.take_lease(d, "sync-1-ab", 60, "clusterctl sync from me@laptop")
    leases.take_lease(d, "old", 1, "x")
    now = time.time()
    reasons = leases.leases(d, now + 5)
    assert len(reasons) == 1 and reasons[0].startswith("lease sync-1-ab: clusterctl sync from me@laptop runs")
    assert sorted(os.listdir(tmp_path / "leases")) == ["sync-1-ab.json"]  # the expired one was removed
    leases.release_lease(d, "sync-1-ab")
    leases.release_lease(d, "sync-1-ab")  # twice: no error
    assert leases.leases(d) == []
    # a lease released between the listing and the read (here: a name that resolves to nothing) is no crash
    os.symlink(tmp_path / "nowhere", tmp_path / "leases" / "raced.json")
    (tmp_path / "leases" / "torn.json").write_text("{")  # unreadable, but young: kept for now
    assert leases.leases(d) == [] and (tmp_path / "leases" / "torn.json").exists()
    assert leases.leases(d, time.time() + 120) == [] and not (tmp_path / "leases" / "torn.json").exists()
    (tmp_path / "leases" / "raced.json").unlink()
    for bad in ("../x", "", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            leases.take_lease(d, bad, 5)
    # the command line the operator runs on a cloud node
    proc = subprocess.run(
        node_argv("watchdog", "lease", "--dir", d, "--id", "l1", "--for", "30", "--what", "sync"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"lease": "l1", "held": True}, proc.stderr
    assert leases.leases(d)[0].startswith("lease l1: sync runs")
    proc = subprocess.run(node_argv("watchdog", "release", "--dir", d, "--id", "l1"), capture_output=True, text=True)
    assert proc.returncode == 0 and leases.leases(d) == []
    assert (
        subprocess.run(
            node_argv("watchdog", "lease", "--dir", d, "--id", "../l1", "--for", "3"),
            capture_output=True,
            text=True,
        ).returncode
        == 2
    )


def test_cpu_nodes_training_processes_and_ssh_commands():
    own: set = set()
    assert rules.busy_reasons("n", {"gpus": None, "training": ["python3[7] x.py"], "sessions": {}}, {}, own, False) == [
        "n: python3[7] x.py"
    ]
    now = {"1:5": _session(400, "sleep 25")}
    assert rules.busy_reasons("n", {"gpus": None, "training": [], "sessions": now}, {}, own, False) == [
        "n: ssh session running sleep 25"
    ]
    # a kept connection with nothing running: idle; the same one after a command ended in between: busy
    kept = {"1:5": _session(400)}
    assert rules.busy_reasons("n", {"training": [], "sessions": kept}, {"sessions": kept}, own, False) == []
    assert rules.busy_reasons(
        "n", {"training": [], "sessions": {"1:5": _session(800)}}, {"sessions": kept}, own, False
    ) == ["n: a command ran in an ssh session"]
    # a connection first seen after it ran something: busy, except on the first check (no history yet)
    assert rules.busy_reasons("n", {"training": [], "sessions": kept}, {}, own, False) == [
        "n: a new ssh session ran a command"
    ]
    assert rules.busy_reasons("n", {"training": [], "sessions": kept}, {}, own, True) == []
    # clusterctl's own checks never count, not even after they ended
    probe = {"2:9": _session(300, "/usr/bin/python3 /opt/clusterctl/autostop watchdog status --dir d")}
    assert rules.busy_reasons("n", {"training": [], "sessions": probe}, {}, own, False) == [] and "n/2:9" in own
    assert (
        rules.busy_reasons("n", {"training": [], "sessions": {"2:9": _session(700)}}, {"sessions": probe}, own, False)
        == []
    )


def test_probe_sees_this_machines_processes_but_not_itself(tmp_path):
    sleeper = subprocess.Popen(["/usr/bin/python3", "-c", "import time; time.sleep(30)"])
    try:
        out = subprocess.run(node_argv("watchdog", "probe"), capture_output=True, text=True, timeout=60)
        pr = json.loads(out.stdout)
        assert any(f"[{sleeper.pid}]" in t for t in pr["training"]), pr["training"]
        assert not any(activity.is_own(t) for t in pr["training"])
        assert isinstance(pr["sessions"], dict)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_settings_files_keep_off_on_and_status(tmp_path):
    d = str(tmp_path)
    files.write_json(
        os.path.join(d, "config.json"),
        watchdog.node_config(
            "c", Autostop(60, None), poweroff="node-init", user="root", script="s", created_at=time.time()
        ),
    )

    def run(*a):
        argv = node_argv("watchdog", *a, "--dir", d)
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    st = run("status")
    assert st["running"] is False and st["config"]["idle_stop"] == 60 and st["plan"]["why"] == "idle-stop"
    st = run("keep", "--for", "7200")
    assert 7100 < st["config"]["keep_until"] - time.time() <= 7200
    assert run("off")["config"]["enabled"] is False and run("off")["plan"]["stop_at"] is None
    st = run("on", "--idle-stop", "1800", "--max-lifetime", "none")
    assert (st["config"]["enabled"], st["config"]["idle_stop"], st["config"]["max_lifetime"]) == (True, 1800, None)
    log = (tmp_path / "watchdog.log").read_text()
    assert "keep: no stop before 7200s from now" in log and "autostop turned off" in log
    lines = status.summary({**st, "running": True})
    assert lines[0].startswith("autostop: stops in ") and "idle-stop 30m" in lines[0]
    assert any(line.startswith("autostop: kept until ") for line in lines)
    assert status.summary({**run("off"), "running": True})[0].startswith("autostop: OFF")
    assert status.summary(None, Autostop(1800, 3600), created_at=time.time() - 600)[1].startswith(
        "autostop: stops at the latest in 50m"
    )


def test_a_namespace_node_is_never_shut_down_through_the_hosts_init(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(peers.subprocess, "run", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(peers, "read_file", lambda path: b"sshd\n" if path == "/proc/1/comm" else b"")
    peers.poweroff_self({"poweroff": "shutdown", "user": "root"}, str(tmp_path))
    assert calls == [] and "refusing to run shutdown: PID 1 is sshd" in (tmp_path / "watchdog.log").read_text()
    assert peers.poweroff_command({"poweroff": "shutdown", "user": "ubuntu"}) == "sudo -n shutdown -h now"
    assert peers.poweroff_command({"poweroff": "node-init", "user": "root"}) == "kill -TERM 1"


# ---- AWS: the user data ------------------------------------------------------------------------------------
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG9vZGJ5ZSBjbHVzdGVyY3RsIHRlc3Qga2V5IDAwMDAwMDA x"


def test_user_data_carries_the_watchdog_and_is_the_same_bytes_every_time():
    args = ("demo", "us-east-1", "ubuntu", 8, KEY)
    data = cloud_init.user_data(*args, autostop=Autostop(1800, 43200))
    assert data == cloud_init.user_data(*args, autostop=Autostop(1800, 43200))
    # EC2 takes 16 KB: the watchdog's source must leave room (an eighth of it) for what the user data grows by
    assert len(data) <= cloud_init.LIMIT * 7 // 8, f"{len(data)} bytes of user data, EC2 takes {cloud_init.LIMIT}"
    text = gzip.decompress(data).decode()
    assert text == cloud_init.render_user_data(*args, autostop=Autostop(1800, 43200))
    doc = yaml.safe_load(text)
    files = {f["path"]: f for f in doc["write_files"]}
    program = {p.removeprefix(watchdog.AWS_PROGRAM + "/"): f for p, f in files.items() if p.startswith("/opt/")}
    assert {n: f["content"].encode() for n, f in program.items()} == nodepkg.entries(program=activity.PROGRAM)
    assert {f["permissions"] for f in program.values()} == {"0644"}
    cfg = json.loads(files[f"{watchdog.AWS_DIR}/config.json"]["content"])
    assert cfg == {
        **cfg,
        "idle_stop": 1800,
        "max_lifetime": 43200,
        "created_at": None,
        "poweroff": "shutdown",
        "user": "ubuntu",
        "script": watchdog.AWS_PROGRAM,
        "enabled": True,
    }
    assert doc["runcmd"] == [
        ["systemctl", "daemon-reload"],
        ["systemctl", "enable", "--now", "clusterctl-autostop.service"],
    ]
    unit = files["/etc/systemd/system/clusterctl-autostop.service"]["content"]
    assert "Restart=always" in unit and f"ExecStart=/usr/bin/python3 {watchdog.AWS_PROGRAM} watchdog run " in unit
    cmd = watchdog.remote_command("keep", "--for", "3600")
    assert "/opt/clusterctl/autostop watchdog keep --dir /var/lib/clusterctl/autostop --for 3600" in cmd
    assert "sudo -n" in cmd and activity.is_own(cmd)


def test_the_user_datas_watchdog_runs_from_its_folder_with_the_system_python(tmp_path):
    """The files the user data writes are the whole program: the system's python3 runs their folder alone."""
    doc = yaml.safe_load(cloud_init.render_user_data("demo", "us-east-1", "ubuntu", 8, KEY, autostop=Autostop(60)))
    folder = tmp_path / "autostop"
    for f in doc["write_files"]:
        if f["path"].startswith(watchdog.AWS_PROGRAM + "/"):
            path = folder / f["path"].removeprefix(watchdog.AWS_PROGRAM + "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f["content"])
    python = shutil.which("python3", path="/usr/bin:/bin") or "python3"
    for argv in (["probe"], ["status", "--dir", str(tmp_path / "d")]):
        r = subprocess.run([python, "-I", str(folder), "watchdog", *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and json.loads(r.stdout), r.stderr
    assert "sync" not in {p.name for p in (folder / "clusterctl" / "node").iterdir()}  # the watchdog's files only


def test_a_cloud_node_brought_up_by_an_older_version_still_answers():
    """Its watchdog is /opt/clusterctl/idle_watchdog.py: the operator's commands fall back to it."""
    cmd = watchdog.remote_command("status")
    assert f"elif [ -f {watchdog.AWS_OLD_SCRIPT} ]; then $S /usr/bin/python3 {watchdog.AWS_OLD_SCRIPT} status " in cmd
    assert activity.is_own("/usr/bin/python3\0/opt/clusterctl/idle_watchdog.py\0run\0--dir\0/x\0")


# ---- the local supervisor's command line, and the package's imports -------------------------------------
def test_supervisors_of_this_and_of_older_versions_are_found_by_argv_and_stopped(tmp_path):
    """`down` finds a local cluster's supervisor by its argv: this version's (python -m clusterctl.providers.local
    supervise NAME) and an older version's (python -m clusterctl.autostop supervise NAME) alike."""
    name = f"argv{os.getpid()}"
    for pkg in ("clusterctl/autostop", "clusterctl/providers/local"):  # stand-ins that only wait for SIGTERM
        (tmp_path / pkg).mkdir(parents=True)
        (tmp_path / pkg / "__main__.py").write_text("import time\ntime.sleep(60)\n")
    for pkg in ("clusterctl", "clusterctl/autostop", "clusterctl/providers", "clusterctl/providers/local"):
        (tmp_path / pkg / "__init__.py").write_text("")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    assert supervisor._argv(name)[1:] == ["-m", "clusterctl.providers.local", "supervise", name]
    procs = [
        subprocess.Popen(supervisor._argv(name), env=env, cwd=tmp_path),
        subprocess.Popen([sys.executable, "-m", "clusterctl.autostop", "supervise", name], env=env, cwd=tmp_path),
    ]
    other = subprocess.Popen(
        [sys.executable, "-m", "clusterctl.autostop", "supervise", name + "x"], env=env, cwd=tmp_path
    )
    try:
        assert sorted(supervisor.supervisors(name)) == sorted(p.pid for p in procs)
        assert sorted(supervisor.stop_supervisor(name)) == sorted(p.pid for p in procs)
        assert not any(alive(p.pid) for p in procs) and supervisor.supervisors(name) == []
        assert supervisor.supervisors(name + "x") == [other.pid]
    finally:
        for p in (*procs, other):
            p.kill()
            p.wait()


def test_autostop_never_imports_a_provider():
    """Providers import autostop (settings, the watchdog's files); autostop never imports a provider, not even
    inside a function: the local provider's supervisor is given to it (status) or lives in providers/local."""
    import ast

    pkg = REPO / "clusterctl" / "autostop"
    found = []
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("clusterctl.providers")]
    assert found == []


# ---- gc and costs --------------------------------------------------------------------------------------------
def test_gc_groups_by_cluster_and_keeps_the_young_and_the_unknown():
    now = 100_000.0
    found = [
        Found("a", "instance", "i-1", now - 3 * 3600, "ann@lap"),
        Found("a", "VPC", "vpc-1", None, "ann@lap"),
        Found("b", "key pair", "k", now - 600, "bob@desk"),
        Found("c", "VPC", "vpc-2"),
    ]
    groups = gc.group(found, "aws", "us-east-1", {})
    assert [(g.name, len(g.found), g.owner, g.record) for g in groups] == [
        ("a", 2, "ann@lap", ""),
        ("b", 1, "bob@desk", ""),
        ("c", 1, "", ""),
    ]
    assert groups[0].created_at == now - 3 * 3600 and groups[2].created_at is None
    assert [g.name for g in gc.select(groups, 2 * 3600, now)] == ["a"]
    assert [g.name for g in gc.select(groups, None, now)] == ["a", "b", "c"]  # local: every one is this machine's
    # a cloud's: without a limit, one this machine has no record of goes once an hour old (an unknown age never)
    cloud = gc.group(found, "aws", "us-east-1", {}, elsewhere=True)
    assert [g.name for g in gc.select(cloud, None, now)] == ["a"]


def test_costs():
    c = Cluster(
        "c", "aws", tuple(Node(f"n{i}", f"10.0.0.{i}", 8, "member") for i in range(4)), "us-east-1", "p3.16xlarge"
    )
    assert costs.hourly(c) == pytest.approx(4 * 24.48)
    assert costs.hourly(Cluster("l", "local", ())) == 0.0 and costs.hourly(None) is None
    assert costs.run_cost(1800, 97.92) == pytest.approx(48.96)
    line = costs.epoch_line(1281.167, 97.92)
    assert line == "at 1,281 img/s, one ImageNet epoch (1,281,167 images) takes 16m and costs about $27.20"
    assert costs.epoch_line(100, None).endswith("(price unknown)")


def test_bench_and_train_print_the_cost_of_the_run(tmp_path, monkeypatch, capsys):
    from dataclasses import replace
    from types import SimpleNamespace

    from clusterctl.cli import bench as cli
    from clusterctl.state import StateStore
    from clusterctl.workloads.bench import ladder as bench, verdict as bench_verdict
    from clusterctl.workloads.train import config as train_config, cost as train_cost
    from clusterctl.workloads.train.options import TrainOptions

    monkeypatch.setenv("CLUSTERCTL_HOME", str(tmp_path))
    c = Cluster(
        "c", "aws", tuple(Node(f"n{i}", f"10.0.0.{i}", 8, "member") for i in range(2)), "us-east-1", "p3.16xlarge"
    )
    inv = SimpleNamespace(cluster=c)
    rung = lambda np_, ips, s: bench_verdict.Rung(np_, 1 + np_ // 9, ips, 1.0, 1.0, None, {}, s, "log")  # noqa: E731
    v100 = bench.BenchOptions().config(c)  # what `bench` runs on p3.16xlarge with no flags
    assert v100 == train_config.DEFAULTS["V100"]
    ladder = bench_verdict.Ladder(
        (rung(1, 100.0, 60.0), rung(16, 1500.0, 120.0)), 0.9, True, "ok", config=v100.to_dict()
    )
    cli._bench_cost(inv, ladder, "resnet50")
    err = capsys.readouterr().err
    assert "cost: this ladder ran 3m on a $48.96/hour cluster: about $2.45" in err
    assert (
        "cost: at 1,500 img/s, one ImageNet epoch (1,281,167 images) takes 14m and costs about $11.62; "
        "90 epochs about $1,045.43"
    ) in err, err
    store = StateStore(tmp_path)
    assert costs.load_measured(store, "c", v100.key())["img_per_sec"] == 1500.0
    assert costs.load_measured(store, "c", replace(v100, xla=False).key()) is None

    # `train` with no flags on the same type runs the same configuration: its estimate uses that rate
    opts = SimpleNamespace(model="resnet50", max_steps=None, epochs=2.0, batch_size=None)
    job = SimpleNamespace(np=8, options=TrainOptions(synthetic=True))  # no --data: ImageNet-sized epochs
    line = train_cost.estimate_line(store, inv, job, opts)
    assert (
        "cost: estimated at 750 img/s, 2 ImageNet-sized epoch(s) (2,562,334 images) takes 56m and costs about "
        "$46.46 (from the 1,500 img/s `bench` measured at 16 process(es) for resnet50 224px float16 batch 256 "
        "xla on allreduce fp16, scaled linearly"
    ) in line, line
    # another model, precision, batch, XLA or compression: never that rate, and the bench flags that measure it
    for options, flags in (
        (TrainOptions(synthetic=True, model="tiny"), "--model tiny"),
        (TrainOptions(synthetic=True, precision="fp32"), "--model resnet50 --precision fp32"),
        (
            TrainOptions(synthetic=True, precision="bfloat16", batch_size=192),
            "--model resnet50 --precision bfloat16 --batch-size 192",
        ),
        (TrainOptions(synthetic=True, batch_size=128), "--model resnet50 --batch-size 128"),
        (TrainOptions(synthetic=True, xla=False), "--model resnet50 --no-xla"),
        (TrainOptions(synthetic=True, fp16_allreduce=False), "--model resnet50 --no-fp16-allreduce"),
    ):
        line = train_cost.estimate_line(store, inv, SimpleNamespace(np=8, options=options), opts)
        assert "no img/s measured on this cluster for this configuration" in line, line
        assert f"`clusterctl bench --synthetic {flags}` measures it" in line, line
    # a measured.json of an older clusterctl (one rate, no configuration) is never taken for this one
    (store.cluster_dir("c") / "measured.json").write_text('{"img_per_sec": 1500.0, "np": 16, "model": "resnet50"}')
    assert "no img/s measured" in train_cost.estimate_line(store, inv, job, opts)
    assert train_cost.run_line(1800.0, 48.96) == "cost: this run took 30m on a $48.96/hour cluster: about $24.48"
    assert train_cost.run_line(1800.0, None) == "cost: this run took 30m"
