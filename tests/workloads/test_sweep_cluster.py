"""`clusterctl sweep` for real: 2 namespace nodes with 2 slots each, a 6-trial grid over a tiny script,
the scheduler detached on the leader, a node killed mid-sweep, --status and --cancel from another process."""

from __future__ import annotations

import json
import os
import signal
import time
from itertools import combinations
from pathlib import Path

import pytest

from conftest import node_pid

pytestmark = pytest.mark.integration

# A trial: logs where and when it ran (its own clock), sleeps (member_sleep on the member: a node about to
# be killed keeps its trials until it is), prints its metric (a function of its parameters whose best is
# lr=0.1, batch=64) as a JSON line and as a text line.
TRIAL = r"""
import json, os, socket, sys, time
args = dict(a.split("=", 1) for a in sys.argv[1:])
lr, batch, sleep = float(args["lr"]), int(args["batch"]), float(args.get("sleep", "1.5"))
if socket.gethostname().endswith("-member-1"):
    sleep = float(args.get("member_sleep", sleep))
print("START", f"{time.time():.6f}", socket.gethostname(), os.environ["CUDA_VISIBLE_DEVICES"],
      os.environ["CLUSTERCTL_TRIAL"], flush=True)
time.sleep(sleep)
score = round(1 - 2 * abs(lr - 0.1) - abs(batch - 64) / 640, 6)
print("END", f"{time.time():.6f}", flush=True)
print(f"score: {score}")
print(json.dumps({"metric": score, "lr": lr, "batch": batch}), flush=True)
"""
GRID = ("--grid", "lr=0.01,0.1,0.3", "--grid", "batch=32,64")
CMD = ("--", "python", "trial.py", "lr={lr}", "batch={batch}")


def score(lr: float, batch: int) -> float:
    return round(1 - 2 * abs(lr - 0.1) - abs(batch - 64) / 640, 6)


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    cluster = module_cluster_factory(2, 2, runtime=True)
    (cluster.cli.cwd / "trial.py").write_text(TRIAL)
    return cluster


def runs_in(text: str) -> list[dict]:
    """The START/END lines of one trial log: [{host, gpu, trial, start, end|None}]."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["START"]:
            out.append(
                {"start": float(parts[1]), "host": parts[2], "gpu": parts[3], "trial": int(parts[4]), "end": None}
            )
        elif parts[:1] == ["END"]:
            out[-1]["end"] = float(parts[1])
    return out


def status_json(c, *extra) -> dict:
    r = c.cli("sweep", "status", "--cluster", c.name, "--json", *extra, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_for(pred, what: str, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def results_of(c, before: set) -> Path:
    made = sorted(set((c.cli.cwd / "sweep-results").iterdir()) - before)
    assert len(made) == 1, made
    return made[0]


def existing_results(c) -> set:
    root = c.cli.cwd / "sweep-results"
    return set(root.iterdir()) if root.exists() else set()


def test_grid_runs_every_trial_once_one_per_slot_and_finds_the_best(c):
    before = existing_results(c)
    r = c.cli("sweep", "run", "--cluster", c.name, "--file", "trial.py", *GRID, *CMD, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    folder = results_of(c, before)
    doc = json.loads((folder / "results.json").read_text())
    trials = {t["id"]: t for t in doc["trials"]}
    assert sorted(trials) == [1, 2, 3, 4, 5, 6] and doc["status"] == "done"
    names = {f"{c.name}-leader": c.hosts[0], f"{c.name}-member-1": c.hosts[1]}

    # every trial ran exactly once, where and on the GPU the scheduler says, and its metric is its own
    runs = []
    for i, t in trials.items():
        assert t["state"] == "done" and len(t["attempts"]) == 1, t
        mine = runs_in((folder / "logs" / f"trial-{i:04d}.log").read_text())
        assert len(mine) == 1 and mine[0]["end"] is not None and mine[0]["trial"] == i
        assert names[mine[0]["host"]] == t["node"] and mine[0]["gpu"] == str(t["gpus"][0]) and mine[0]["gpu"] in "01"
        assert t["metric"] == pytest.approx(score(float(t["params"]["lr"]), int(t["params"]["batch"])))
        runs.append(mine[0])
    # no slot ran two trials at once (the trials' own timestamps), all 4 slots were used, 2 trials queued
    for a, b in combinations(runs, 2):
        if (a["host"], a["gpu"]) == (b["host"], b["gpu"]):
            assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    assert len({(x["host"], x["gpu"]) for x in runs}) == 4
    edges = sorted([(x["start"], 1) for x in runs] + [(x["end"], -1) for x in runs], key=lambda e: (e[0], e[1]))
    live = peak = 0
    for _, step in edges:
        live += step
        peak = max(peak, live)
    assert peak == 4
    first_end = min(x["end"] for x in runs)
    assert sum(x["start"] >= first_end for x in runs) == 2  # the queued two started only once slots freed

    # the best is lr=0.1 batch=64 (trial 4): first in results.json and in the printed table
    assert doc["best"]["id"] == 4 and doc["best"]["params"] == {"lr": "0.1", "batch": "64"}
    assert doc["metric"] == "metric" and doc["goal"] == "max"
    table = [line.split() for line in r.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in table][0] == "4" and table[0][-1] == "best"
    assert [float(row[6]) for row in table] == sorted((t["metric"] for t in trials.values()), reverse=True)
    assert (folder / "metric_vs_params.png").read_bytes()[:4] == b"\x89PNG"
    assert "trial 4 (lr=0.1 batch=64) started on" in r.stderr and "best: trial 4 (lr=0.1 batch=64) metric 1" in r.stderr
    # nothing of the sweep is left running on the nodes
    for i in range(2):
        assert not c.node_exec(i, "pgrep", "-af", "[t]rial.py|[.]pyz sweep ", check=False).stdout.strip()


def test_random_samples_with_two_gpus_per_trial_and_shell_text(c):
    before = existing_results(c)
    shell = (
        "echo START $(date +%s.%N) $(hostname) $CUDA_VISIBLE_DEVICES {trial}; echo PWD $(pwd); sleep 1; "
        'echo END $(date +%s.%N); echo "x is" {x} for {name}'
    )  # values arrive quoted: {name} has a space
    r = c.cli(
        "sweep",
        "run",
        "--cluster",
        c.name,
        "--random",
        "4",
        "--seed",
        "5",
        "--range",
        "x=1:1000:int",
        "--grid",
        "name=a b,c",
        "--gpus-per-trial",
        "2",
        "--workdir",
        "/tmp",
        "--metric",
        r"x is (\d+)",
        "--goal",
        "min",
        "--",
        shell,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    folder = results_of(c, before)
    doc = json.loads((folder / "results.json").read_text())
    trials = sorted(doc["trials"], key=lambda t: t["id"])
    xs = [int(t["params"]["x"]) for t in trials]
    assert len(trials) == 4 and all(1 <= x <= 1000 for x in xs) and len(set(xs)) > 1
    assert {t["params"]["name"] for t in trials} <= {"a b", "c"}
    runs = []
    for t in trials:
        assert t["state"] == "done" and t["metric"] == int(t["params"]["x"]) and t["gpus"] == [0, 1]
        log = (folder / "logs" / f"trial-{t['id']:04d}.log").read_text()
        assert "PWD /tmp\n" in log and f"for {t['params']['name']}\n" in log
        (run,) = runs_in(log)
        assert run["gpu"] == "0,1" and run["trial"] == t["id"]
        runs.append(run)
    for a, b in combinations(runs, 2):  # a node runs one two-GPU trial at a time
        if a["host"] == b["host"]:
            assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    assert doc["best"]["metric"] == min(xs) and doc["goal"] == "min" and doc["metric"] == "x"
    assert "up to 2 at once" in r.stderr


def test_a_sweep_over_the_shipped_trainer_works_out_of_the_box(c):
    """--file names a shipped template; the trainer takes --lr and prints a JSON line the sweep reads."""
    before = existing_results(c)
    r = c.cli(
        "sweep",
        "run",
        "--cluster",
        c.name,
        "--file",
        "train_imagenet.py",
        "--grid",
        "lr=0.05,0.4",
        "--metric-key",
        "top1",
        "--",
        "python",
        "train_imagenet.py",
        "--synthetic",
        "--model",
        "tiny",
        "--lr",
        "{lr}",
        "--batch-size",
        "16",
        "--max-steps",
        "4",
        "--epochs",
        "1",
        "--train-examples",
        "64",
        "--warmup-epochs",
        "0",
        "--eval-steps",
        "2",
        "--log-every",
        "2",
        "--model-dir",
        "run{trial}",
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((results_of(c, before) / "results.json").read_text())
    assert doc["metric"] == "top1" and {t["state"] for t in doc["trials"]} == {"done"}
    for t in doc["trials"]:
        assert 0 <= t["metric"] <= 100
        log = (results_of(c, before) / "logs" / f"trial-{t['id']:04d}.log").read_text()
        assert "CLUSTERCTL-TRAIN eval" in log and f"Validation: top-1 {t['metric']:.2f}%" in log
        peak = float(log.split("peak_lr=", 1)[1].split()[0])  # the trainer's peak: --lr x global batch / 256
        assert peak == pytest.approx(float(t["params"]["lr"]) * 16 / 256, rel=1e-3)
    assert "TOP1" in r.stdout


def test_sweeps_over_the_trainer_never_resume_another_trials_checkpoint(c):
    """Two sweeps in one working folder, the trainer's --model-dir left out: each trial trains into its own
    folder (train_out/<sweep>/trial-<N>) with its hyperparameters recorded beside its checkpoints. Before,
    every trial trained into ./train_out: the second sweep found the first one's finished run, resumed it
    and reported that run's top-1 as its own."""
    cmd = (
        "python ~/clusterctl-sweeps/$CLUSTERCTL_SWEEP/train_imagenet.py --synthetic --model tiny --lr {lr} "
        "--batch-size 16 --max-steps 4 --epochs 1 --train-examples 64 --warmup-epochs 0 --eval-steps 2 --log-every 2"
    )
    where = {h: i for i, h in enumerate(c.hosts)}
    for i in where.values():
        c.node_exec(i, "mkdir", "-p", "/root/shared-work")
    for grid in ("lr=0.05", "lr=0.4,0.2"):
        before = existing_results(c)
        r = c.cli(
            "sweep",
            "run",
            "--cluster",
            c.name,
            "--file",
            "train_imagenet.py",
            "--workdir",
            "~/shared-work",
            "--grid",
            grid,
            "--metric-key",
            "top1",
            "--",
            cmd,
            timeout=600,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        folder = results_of(c, before)
        doc = json.loads((folder / "results.json").read_text())
        assert {t["state"] for t in doc["trials"]} == {"done"}
        for t in doc["trials"]:
            log = (folder / "logs" / f"trial-{t['id']:04d}.log").read_text()
            assert "CLUSTERCTL-TRAIN resume" not in log and " start_step=0 " in log, log[-2000:]
            model_dir = f"train_out/{doc['id']}/trial-{t['id']}"
            assert f"model_dir={model_dir} " in log
            hp = json.loads(
                c.node_exec(where[t["node"]], "cat", f"/root/shared-work/{model_dir}/checkpoints/hparams.json").stdout
            )
            assert hp["base_lr"] == float(t["params"]["lr"])

    # a --model-dir every trial would share is refused before anything starts
    r = c.cli(
        "sweep",
        "run",
        "--cluster",
        c.name,
        "--file",
        "train_imagenet.py",
        "--grid",
        "lr=0.1,0.2",
        "--",
        "python",
        "train_imagenet.py",
        "--synthetic",
        "--lr",
        "{lr}",
        "--model-dir",
        "out",
        timeout=60,
    )
    assert r.returncode == 2 and r.stderr.count("Error:") == 1 and "{trial}" in r.stderr, r.stderr


def test_status_and_cancel_from_another_terminal(c):
    # watching in one process; Ctrl-C there stops the watching, not the sweep
    watch = c.cli.popen(
        "sweep",
        "run",
        "--cluster",
        c.name,
        "--file",
        "trial.py",
        "--metric",
        r"score: (\S+)",
        "--goal",
        "min",
        *GRID,
        "--",
        "python",
        "trial.py",
        "lr={lr}",
        "batch={batch}",
        "sleep=60",
    )
    try:
        st = wait_for(
            lambda: (
                lambda s: s if s["state"] and sum(t["state"] == "running" for t in s["state"]["trials"]) == 4 else None
            )(status_json(c)),
            "4 running trials",
        )
        watch.send_signal(signal.SIGINT)
        _, err = watch.communicate(timeout=60)
    finally:
        if watch.poll() is None:
            watch.kill()
    assert watch.returncode == 130, err
    assert f"sweep {st['id']} goes on on the leader" in err
    assert st["scheduler"] == "running" and st["state"]["meta"]["goal"] == "min"

    # a second sweep would share the GPUs: refused while this one runs
    again = c.cli("sweep", "run", "--cluster", c.name, "--grid", "x=1", "--", "true", timeout=60)
    assert again.returncode == 3 and f"sweep {st['id']} is still running" in again.stderr

    # --status from another process: the table of what runs where
    shown = c.cli("sweep", "status", "--cluster", c.name, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("running") == 4 and shown.stdout.count("queued") == 2
    assert f"sweep {st['id']} running: 2 queued, 4 running" in shown.stderr
    for i in range(2):
        assert len(c.node_exec(i, "pgrep", "-f", "^python trial[.]py lr=", check=False).stdout.split()) == 2

    # --cancel: every trial ends, on every node, and the scheduler with them
    cancelled = c.cli("sweep", "cancel", "--cluster", c.name, "--id", st["id"], timeout=120)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.count("cancelled") == 6
    for i in range(2):
        assert not c.node_exec(i, "pgrep", "-af", "[t]rial.py|[.]pyz sweep ", check=False).stdout.strip()
    after = status_json(c, "--id", st["id"])
    assert after["scheduler"] == "stopped" and after["state"]["status"] == "cancelled"
    assert {t["state"] for t in after["state"]["trials"]} == {"cancelled"}
    # attaching to it now reports the end (exit 1: it did not finish) and still writes the results
    before = existing_results(c)
    attach = c.cli("sweep", "attach", "--cluster", c.name, timeout=120)
    assert attach.returncode == 1 and f"Error: sweep {st['id']} was cancelled" in attach.stderr
    assert json.loads((results_of(c, before) / "results.json").read_text())["status"] == "cancelled"


def test_a_node_killed_mid_sweep_has_its_trials_rerun_elsewhere(module_cluster_factory):
    c = module_cluster_factory(2, 2, runtime=True)  # its own cluster: this test kills a node
    (c.cli.cwd / "trial.py").write_text(TRIAL)
    start = c.cli(
        "sweep",
        "run",
        "--cluster",
        c.name,
        "--detach",
        "--node-timeout",
        "2",
        "--file",
        "trial.py",
        *GRID,
        "--",
        "python",
        "trial.py",
        "lr={lr}",
        "batch={batch}",
        "sleep=2",
        "member_sleep=120",
        timeout=120,
    )
    assert start.returncode == 0, start.stderr
    sid = start.stderr.split()[1].rstrip(":")

    def running_on_member():
        st = status_json(c, "--id", sid)["state"]
        on = [t["id"] for t in (st or {}).get("trials", []) if t["state"] == "running" and t["node"] == c.hosts[1]]
        return on if len(on) == 2 else None

    victims = wait_for(running_on_member, "2 trials running on the member")
    os.kill(node_pid(c.name, 1), signal.SIGKILL)  # the member's PID 1: every process in it dies with it

    before = existing_results(c)
    r = c.cli("sweep", "attach", "--cluster", c.name, "--id", sid, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    folder = results_of(c, before)
    doc = json.loads((folder / "results.json").read_text())
    assert [n["alive"] for n in doc["nodes"]] == [True, False]
    assert f"node {c.hosts[1]} is dead" in r.stderr and "no logs from" not in r.stderr
    assert r.stderr.count(f"re-queued: its node {c.hosts[1]} died") == 2
    member_dir = c.cli.home / "clusters" / c.name / "nodes" / "1" / "home" / "clusterctl-sweeps" / sid
    ends = {}
    for t in doc["trials"]:
        i = t["id"]
        assert t["state"] == "done" and t["metric"] == pytest.approx(
            score(float(t["params"]["lr"]), int(t["params"]["batch"]))
        )
        final = runs_in((folder / "logs" / f"trial-{i:04d}.log").read_text())
        assert len(final) == 1 and final[0]["end"] is not None
        ends[i] = final[0]
        if i in victims:  # started on the member, cut off there, re-run on the leader, completed once
            assert [(a["node"], a["outcome"]) for a in t["attempts"]] == [
                (c.hosts[1], "node died"),
                (c.hosts[0], "done"),
            ]
            assert t["requeued"] == 1 and t["node"] == c.hosts[0]
            cut = runs_in((member_dir / f"trial-{i:04d}.log").read_text())
            assert len(cut) == 1 and cut[0]["end"] is None and cut[0]["host"] == f"{c.name}-member-1"
            assert final[0]["host"] == f"{c.name}-leader" and final[0]["start"] > cut[0]["start"]
        else:
            assert len(t["attempts"]) == 1 and t["requeued"] == 0
    # the leader's two slots still never ran two trials at once
    leader_runs = [x for x in ends.values() if x["host"] == f"{c.name}-leader"]
    for a, b in combinations(leader_runs, 2):
        if a["gpu"] == b["gpu"]:
            assert a["end"] <= b["start"] or b["end"] <= a["start"], (a, b)
    assert doc["best"]["id"] == 4
    assert r.stdout.count("re-run after its node died") == 2
