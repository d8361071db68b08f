"""clusterctl sweep without a cluster: trials from grids and ranges, command templates, the metric, the
scheduler's slot assignment, its node-side shell scripts run for real here, and the whole scheduler
against fake nodes (an `ssh` stand-in that runs the script locally, or fails like a dead node)."""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import stat
import subprocess
import time

import pytest

from clusterctl.errors import RemoteCommandError, UsageError
from clusterctl.node.sweep import scripts as S
from clusterctl.remote.session import TREE_FN
from clusterctl.workloads.sweep import (
    leader as sweep,
    plan as sweep_plan,
    results as sweep_results,
    state as sweep_state,
)
from conftest import node_argv


# ---- trials ------------------------------------------------------------------------------------------------
def test_grid_is_every_combination_first_flag_slowest():
    grid = sweep_plan.parse_grid(["lr=0.1,0.01", "batch=32,64,128"])
    assert grid == {"lr": ["0.1", "0.01"], "batch": ["32", "64", "128"]}
    combos = sweep_plan.expand(grid)
    assert len(combos) == 6
    assert combos[0] == {"lr": "0.1", "batch": "32"} and combos[2] == {"lr": "0.1", "batch": "128"}
    assert combos[3] == {"lr": "0.01", "batch": "32"}
    assert len({tuple(c.items()) for c in combos}) == 6


@pytest.mark.parametrize(
    "items, needle",
    [
        (["lr"], "NAME=V1,V2"),
        (["lr="], "empty value"),
        (["lr=0.1,,0.2"], "empty value"),
        (["lr=0.1,0.1"], "listed twice"),
        (["lr=1", "lr=2"], "given twice"),
        (["1lr=1"], "not a name"),
        (["python=1"], "filled in by clusterctl"),
        (["trial=1"], "filled in by clusterctl"),
    ],
)
def test_bad_grids_are_refused(items, needle):
    with pytest.raises(UsageError, match=needle):
        sweep_plan.parse_grid(items)


def test_random_samples_stay_in_their_ranges_and_repeat_with_the_seed():
    ranges = sweep_plan.parse_ranges(["lr=1e-4:1e-1:log", "batch=16:128:int", "dropout=0.1:0.5"])
    grid = {"opt": ["sgd", "adam"]}
    combos = sweep_plan.expand(grid, ranges, random_k=200, seed=7)
    assert len(combos) == 200
    lrs = [float(c["lr"]) for c in combos]
    assert all(1e-4 * 0.999 <= x <= 1e-1 * 1.001 for x in lrs)
    # log-uniform: about half the samples below the geometric middle (1e-2.5), far more than uniform would give
    below = sum(x < 10**-2.5 for x in lrs)
    assert 70 <= below <= 130
    assert all(re.fullmatch(r"\d+", c["batch"]) and 16 <= int(c["batch"]) <= 128 for c in combos)
    assert all(0.1 <= float(c["dropout"]) <= 0.5 for c in combos)
    assert {c["opt"] for c in combos} == {"sgd", "adam"}
    assert sweep_plan.expand(grid, ranges, random_k=200, seed=7) == combos
    assert sweep_plan.expand(grid, ranges, random_k=200, seed=8) != combos


@pytest.mark.parametrize(
    "grid, ranges, k, needle",
    [
        ({}, ["lr=0.1:1"], None, "needs --random"),
        ({}, [], None, "nothing to sweep"),
        ({"lr": ["1"]}, ["lr=0.1:1"], 3, "both as --grid and --range"),
        ({}, [], 3, "none given"),
        ({"lr": ["1"]}, [], 0, "at least 1"),
    ],
)
def test_bad_sweeps_are_refused(grid, ranges, k, needle):
    with pytest.raises(UsageError, match=needle):
        sweep_plan.expand(grid, sweep_plan.parse_ranges(ranges), k)


@pytest.mark.parametrize(
    "item, needle",
    [
        ("lr=1:0.1", "LOW must be below HIGH"),
        ("lr=0:1:log", "above 0"),
        ("lr=1.5:4:int", "whole numbers"),
        ("lr=a:b", "not numbers"),
        ("lr=1:2:cubic", "not linear, log or int"),
        ("lr=1", "NAME=LOW:HIGH"),
    ],
)
def test_bad_ranges_are_refused(item, needle):
    with pytest.raises(UsageError, match=needle):
        sweep_plan.parse_ranges([item])


def test_command_words_are_filled_then_quoted():
    trials = sweep_plan.build_trials(
        ["{python}", "train.py", "--lr={lr}", "--name", "{name}", "--out", "run{trial}"],
        [{"lr": "0.1", "name": "a b; rm -rf /"}],
        "/opt/py/bin/python",
    )
    assert len(trials) == 1 and trials[0].id == 1
    assert shlex.split(trials[0].command) == [
        "/opt/py/bin/python",
        "train.py",
        "--lr=0.1",
        "--name",
        "a b; rm -rf /",
        "--out",
        "run1",
    ]


def test_one_word_command_is_shell_text_with_quoted_values():
    cmd = sweep_plan.render_command(["python t.py --tag {tag} > out-${HOME}.txt; echo {tag}"], {"tag": "x y"})
    assert cmd == "python t.py --tag 'x y' > out-${HOME}.txt; echo 'x y'"
    out = subprocess.run(
        ["sh", "-c", sweep_plan.render_command(["printf '%s|' {a} {b}"], {"a": "1 2", "b": "$(id)"})],
        capture_output=True,
        text=True,
    ).stdout
    assert out == "1 2|$(id)|"


def test_unknown_placeholder_and_missing_command_are_refused():
    with pytest.raises(UsageError, match=r"\{batch\}"):
        sweep_plan.build_trials(["python", "t.py", "--lr", "{lr}", "--batch", "{batch}"], [{"lr": "1"}], "python")
    with pytest.raises(UsageError, match="no command"):
        sweep_plan.build_trials([], [{"lr": "1"}], "python")
    assert sweep_plan.unused(["python", "t.py", "{lr}"], ["lr", "batch"]) == ["batch"]


def test_metric_name_comes_from_the_regex_or_the_key():
    def spec(**metric):
        return sweep_plan.SweepSpec(template=("echo", "{x}"), grid=("x=1",), **metric)

    assert spec(metric_regex=r"accuracy: (\S+)").metric_name == "accuracy"
    assert spec(metric_regex=r"(?P<val_loss>\S+) loss").metric_name == "val_loss"
    assert spec(metric_regex=r"\s+top1=(\S+)").metric_name == "metric"
    assert spec(metric_key="top1").metric_name == "top1"


# ---- the metric ----------------------------------------------------------------------------------------------
LOG = """epoch 1 accuracy: 0.50 loss 2.0
{"metric": 0.61, "top1": 55.5}
epoch 2 accuracy: 0.75 (best 0.80) loss 1.0
noise 3
"""


@pytest.mark.parametrize(
    "regex, key, want",
    [
        (r"accuracy: (\S+)", "metric", 0.75),  # group 1 of the last matching line
        (r"accuracy", "metric", 0.75),  # the first number after the match
        (r"accuracy: [0-9.]+", "metric", 0.75),  # no group: the last number in the match
        (r"best (?P<value>[0-9.]+)", "metric", 0.80),
        (r"loss", "metric", 1.0),
        (r"no such line", "metric", 0.61),  # falls back to the JSON line
        (None, "metric", 0.61),
        (None, "top1", 55.5),
        (None, "missing", None),
    ],
)
def test_metric_is_the_last_matching_line_or_the_json_line(regex, key, want):
    assert S.parse_metric(LOG, regex, key) == want


def test_metric_ignores_non_numbers_and_non_finite_values():
    assert S.parse_metric('{"metric": NaN}\n{"metric": true}\n{"metric": "0.3"}\n', None) is None
    assert S.parse_metric("acc: nan\nacc: 0.4\nacc: nan\n", r"acc: (\S+)") == 0.4
    assert S.parse_metric("", r"acc") is None


# ---- slot assignment -----------------------------------------------------------------------------------------
def _trial(i, state="queued", node=None, gpus=None, requeued=0):
    return {"id": i, "state": state, "node": node, "gpus": gpus, "requeued": requeued}


def _node(host, slots, alive=True, failing=None):
    return {"host": host, "slots": slots, "alive": alive, "failing_since": failing}


def test_assign_spreads_over_nodes_and_queues_the_rest():
    nodes = [_node("a", 2), _node("b", 2)]
    trials = [_trial(i) for i in range(1, 7)]
    plan = S.assign(nodes, trials, 1)
    assert [(t["id"], h, g) for t, h, g in plan] == [(1, "a", [0]), (2, "b", [0]), (3, "a", [1]), (4, "b", [1])]


def test_assign_respects_busy_slots_dead_nodes_requeued_first_and_gpus_per_trial():
    nodes = [_node("a", 4), _node("b", 4, alive=False), _node("c", 4, failing=1.0), _node("d", 3)]
    trials = [_trial(1, "running", "a", [1]), _trial(2), _trial(3), _trial(4, requeued=1), _trial(5)]
    plan = S.assign(nodes, trials, 2)
    assert [(t["id"], h, g) for t, h, g in plan] == [(4, "a", [0, 2]), (2, "d", [0, 1])]


def test_assign_never_gives_a_slot_twice():
    rng = random.Random(3)
    for _ in range(300):
        nodes = [_node(f"n{i}", rng.randint(1, 8), alive=rng.random() > 0.2) for i in range(rng.randint(1, 5))]
        g = rng.randint(1, 3)
        trials = []
        for i in range(rng.randint(0, 30)):
            n = rng.choice(nodes)
            free = S.free_slots(n, trials)
            if n["alive"] and len(free) >= g and rng.random() < 0.4:
                trials.append(_trial(i, "running", n["host"], free[:g]))
            else:
                trials.append(_trial(i))
        plan = S.assign(nodes, trials, g)
        for t, host, gpus in plan:
            t.update(state="running", node=host, gpus=gpus)
        for n in nodes:
            used = [s for t in trials if t["node"] == n["host"] and t["state"] == "running" for s in t["gpus"]]
            assert len(used) == len(set(used)) and all(0 <= s < n["slots"] for s in used)
            assert n["alive"] or not any(h == n["host"] for _, h, _ in plan)
        assert all(len(gpus) == g for _, _, gpus in plan)
        # nothing left queued that would still fit somewhere
        if any(t["state"] == "queued" for t in trials):
            assert not any(n["alive"] and len(S.free_slots(n, trials)) >= g for n in nodes)


# ---- the node-side scripts, run here -------------------------------------------------------------------------
def _sh(script: str) -> str:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60).stdout


def live_sessions() -> set[str]:
    """Session ids of every process here that is not a zombie (an exited child not yet reaped)."""
    return set(_sh("ps -e -o sid= -o stat= | awk '$2 !~ /^Z/ {print $1}'").split())


def test_start_poll_and_kill_scripts_on_this_machine(tmp_path):
    d = str(tmp_path / "sweep dir")
    work = tmp_path / "work"
    work.mkdir()
    items = [
        (
            1,
            "echo gpu=$CUDA_VISIBLE_DEVICES trial=$CLUSTERCTL_TRIAL p=$P pwd=$(pwd); echo 'acc: 0.5'; exit 3",
            [2, 3],
            {"P": "x y"},
        ),
        (2, "sleep 30 & sleep 30; echo never", [0], {}),
    ]
    out = _sh(S.start_script(d, items, workdir=str(work), path_prefix="/nonexistent/bin"))
    started = {i: S.stamp(v) for kind, i, v, _ in S.records(out) if kind == "started"}
    assert set(started) == {1, 2} and all(sid > 1 and when > time.time() - 60 for sid, when in started.values())
    sids = {i: sid for i, (sid, _) in started.items()}
    deadline = time.time() + 10
    while not os.path.exists(f"{d}/trial-0001.exit"):
        assert time.time() < deadline
        time.sleep(0.05)
    recs = {i: (kind, v, text) for kind, i, v, text in S.records(_sh(S.poll_script(d, list(sids.items()))))}
    assert recs[2][0] == "run"
    kind, value, text = recs[1]
    assert kind == "exit" and S.stamp(value)[0] == 3
    assert f"gpu=2,3 trial=1 p=x y pwd={work}" in text and S.parse_metric(text, r"acc: (\S+)") == 0.5
    # the kill ends the whole session, the backgrounded child included, and says so by its status
    r = subprocess.run(
        ["sh", "-c", S.kill_script([sids[2]], TREE_FN, grace=0.5)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert str(sids[2]) not in live_sessions()
    recs = {i: kind for kind, i, _, _ in S.records(_sh(S.poll_script(d, [(2, sids[2])])))}
    assert recs == {2: "gone"}


def test_a_missing_workdir_fails_the_trial_not_the_node(tmp_path):
    d = str(tmp_path / "s")
    out = _sh(S.start_script(d, [(7, "echo hi", [0], {})], workdir=str(tmp_path / "nope")))
    sid, _ = S.stamp(next(v for kind, i, v, _ in S.records(out) if kind == "started"))
    time.sleep(0.3)
    kind, _, value, text = S.records(_sh(S.poll_script(d, [(7, sid)])))[0]
    assert kind == "exit" and S.stamp(value)[0] == 96 and "nope" in text


# ---- the scheduler against fake nodes ------------------------------------------------------------------------
FAKE_SSH = r"""#!/bin/sh
# ssh stand-in: runs the remote script here; a node listed in $FAKE_DEAD refuses like a dead sshd
for a; do prev=$last; last=$a; done
case " $* " in *" -O exit "*) exit 0;; esac
host=${prev#*@}
if [ -e "$FAKE_DEAD/$host" ]; then echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255; fi
echo "$host" >> "$FAKE_DEAD/calls"
exec sh -c "$last"
"""

TRIAL = (
    "echo START $(date +%s.%N) $CLUSTERCTL_TRIAL $CUDA_VISIBLE_DEVICES; sleep {sleep}; "
    "echo END $(date +%s.%N); echo '{{\"metric\": {m}}}'"
)


def _config(tmp_path, trials, nodes=(("n1", 2), ("n2", 2)), **extra):
    d = tmp_path / "sweep"
    d.mkdir()
    dead = tmp_path / "dead"
    dead.mkdir()
    ssh = tmp_path / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    cfg = {
        "id": "sweep-20240101-000000-abcd",
        "nodes": [{"host": h, "slots": s} for h, s in nodes],
        "gpus_per_trial": 1,
        "trials": trials,
        "metric": {"regex": None, "key": "metric"},
        "env": {},
        "path_prefix": None,
        "workdir": None,
        "trial_timeout": None,
        "node_timeout": 0.3,
        "poll": 0.2,
        "max_requeue": 1,
        "ssh": [str(ssh)],
        "user": None,
        "tree_fn": TREE_FN,
        "meta": {"params": ["x"]},
    }
    cfg.update(extra)
    (d / "config.json").write_text(json.dumps(cfg))
    return d, dead


def _scheduler(d, dead):
    env = dict(os.environ, FAKE_DEAD=str(dead))
    return subprocess.Popen(
        node_argv(sweep.PROGRAM, d),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _state(d) -> dict:
    try:
        return json.loads((d / "state.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait(cond, timeout=30.0, what="condition"):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_scheduler_runs_each_trial_once_and_requeues_a_dead_nodes_trials(tmp_path):
    # Every trial waits for the gate before its work: the first four are still running when n2 dies, however
    # slow this machine is (a fixed sleep once let a trial finish first under load).
    gate = tmp_path / "gate"
    hold = f"while [ ! -e {gate} ]; do sleep 0.05; done; "
    trials = [
        {"id": i, "params": {"x": str(i)}, "command": hold + TRIAL.format(sleep=0.3, m=i / 10)} for i in range(1, 7)
    ]
    d, dead = _config(tmp_path, trials)
    proc = _scheduler(d, dead)
    try:
        _wait(lambda: sum(t["state"] == "running" for t in _state(d).get("trials", [])) == 4, what="4 running")
        st = _state(d)
        on_n2 = [t for t in st["trials"] if t["state"] == "running" and t["node"] == "n2"]
        assert len(on_n2) == 2
        for t in on_n2:  # n2 "dies": its processes end and its sshd stops answering
            os.killpg(t["sid"], signal.SIGKILL)
        (dead / "n2").touch()
        gate.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    st = _state(d)
    assert st["status"] == "done", out
    assert [n["alive"] for n in st["nodes"]] == [True, False]
    assert "Connection refused" in st["nodes"][1]["why"]
    for t in st["trials"]:
        assert t["state"] == "done" and t["metric"] == pytest.approx(t["id"] / 10)
        assert t["attempts"][-1]["outcome"] == "done" and t["node"] == t["attempts"][-1]["node"]
    moved = {t["id"] for t in on_n2}
    for t in st["trials"]:
        if t["id"] in moved:
            assert [a["node"] for a in t["attempts"]] == ["n2", "n1"] and t["attempts"][0]["outcome"] == "node died"
            assert t["requeued"] == 1
        else:
            assert len(t["attempts"]) == 1 and t["requeued"] == 0
    # never two trials on one slot at once
    spans = sorted((a["node"], tuple(a["gpus"]), a["started"], a["ended"]) for t in st["trials"] for a in t["attempts"])
    for (n1, g1, _s1, e1), (n2, g2, s2, _e2) in zip(spans, spans[1:]):
        if (n1, g1) == (n2, g2):
            assert e1 <= s2
    assert "trial" in out and "node n2 is dead" in out
    # the state the scheduler wrote reads as typed values and gives back exactly what it wrote (results.json)
    typed = sweep_state.parse_state(st)
    assert typed.status == "done" and typed.ended_for_good and [n.alive for n in typed.nodes] == [True, False]
    assert [t.to_dict() for t in typed.trials] == st["trials"] and [n.to_dict() for n in typed.nodes] == st["nodes"]
    assert {t.id: [a.node for a in t.attempts] for t in typed.trials if t.id in moved} == {
        i: ["n2", "n1"] for i in moved
    }


def test_scheduler_fails_a_trial_twice_orphaned_and_honours_cancel_and_timeouts(tmp_path):
    trials = [
        {"id": 1, "params": {"x": "1"}, "command": "exit 4"},
        {"id": 2, "params": {"x": "2"}, "command": "echo no metric here"},
        {"id": 3, "params": {"x": "3"}, "command": "sleep 30"},
        {"id": 4, "params": {"x": "4"}, "command": "sleep 30"},
        {"id": 5, "params": {"x": "5"}, "command": "sleep 30"},
    ]
    d, dead = _config(tmp_path, trials, nodes=(("n1", 3),), trial_timeout=1.0)
    proc = _scheduler(d, dead)
    try:
        _wait(lambda: _state(d).get("trials", [{}] * 5)[2].get("state") == "failed", what="the timeout")
        # trial 5 started (its own 1 s timeout may end it before the cancel lands on a loaded machine)
        _wait(lambda: bool(_state(d)["trials"][4].get("attempts")), what="trial 5 to start")
        (d / "cancel").touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    st = _state(d)
    by = {t["id"]: t for t in st["trials"]}
    assert st["status"] == "cancelled", out
    assert (by[1]["state"], by[1]["exit_code"], by[1]["error"]) == ("failed", 4, "exit 4")
    assert (by[2]["state"], by[2]["metric"], by[2]["error"]) == ("done", None, "no metric in its output")
    assert by[3]["state"] == "failed" and by[3]["error"] == "timed out after 1s"
    if by[5]["state"] == "cancelled":  # running when the cancel came: ended by it
        assert by[5]["attempts"][-1]["outcome"] == "cancelled"
    else:  # its timeout came first
        assert by[5]["state"] == "failed" and by[5]["error"] == "timed out after 1s", by[5]
    assert not {str(by[i]["sid"]) for i in (3, 4, 5)} & live_sessions()
    typed = {t.id: t for t in sweep_state.parse_state(st).trials}
    assert (
        typed[3].timed_out and typed[3].to_dict() == by[3] and typed[2].metric is None and not typed[2].done_with_metric
    )


def test_cancel_mode_ends_the_trials_of_a_sweep_whose_scheduler_is_gone(tmp_path):
    trials = [{"id": i, "params": {"x": str(i)}, "command": "sleep 30"} for i in (1, 2)]
    d, dead = _config(tmp_path, trials)
    proc = _scheduler(d, dead)
    _wait(lambda: sum(t["state"] == "running" for t in _state(d).get("trials", [])) == 2, what="2 running")
    os.killpg(proc.pid, signal.SIGKILL)  # the scheduler dies; its trials run on
    proc.wait()
    sids = [t["sid"] for t in _state(d)["trials"]]
    assert all(str(s) in live_sessions() for s in sids)
    r = subprocess.run(
        node_argv(sweep.PROGRAM, d, "--cancel"),
        env=dict(os.environ, FAKE_DEAD=str(dead)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(str(s) in live_sessions() for s in sids)
    st = _state(d)
    assert st["status"] == "cancelled" and {t["state"] for t in st["trials"]} == {"cancelled"}


# ---- results ---------------------------------------------------------------------------------------------------
def _done_state():
    trials = []
    for i, (lr, m) in enumerate([("0.1", 0.5), ("0.01", 0.9), ("0.001", 0.7)], start=1):
        trials.append(
            {
                "id": i,
                "params": {"lr": lr, "opt": "sgd" if i % 2 else "adam"},
                "state": "done",
                "metric": m,
                "node": "10.0.0.2",
                "gpus": [i - 1],
                "started": 100.0,
                "ended": 102.5,
                "error": None,
                "requeued": 1 if i == 3 else 0,
                "attempts": [],
            }
        )
    trials.append(
        {
            "id": 4,
            "params": {"lr": "1", "opt": "sgd"},
            "state": "failed",
            "metric": None,
            "node": "10.0.0.3",
            "gpus": [0],
            "started": 100.0,
            "ended": 101.0,
            "error": "exit 1",
            "requeued": 0,
            "attempts": [],
        }
    )
    return {"id": "sweep-20240101-000000-abcd", "status": "failed", "trials": trials, "nodes": []}


def test_rows_are_ranked_by_the_goal_with_failures_last():
    st = sweep_state.parse_state(_done_state())
    assert [t.id for t in sweep_results.ranked(st, "max")] == [2, 3, 1, 4]
    assert [t.id for t in sweep_results.ranked(st, "min")] == [1, 3, 2, 4]
    rows = sweep_results.rows(st, ["lr", "opt"], "max", sort=True, now=200.0)
    assert rows[0]["best"] and rows[0]["trial"] == "2" and rows[0]["params"] == ["0.01", "adam"]
    assert rows[0]["node"] == "10.0.0.2/gpu1" and rows[0]["elapsed"] == "2.5s" and rows[0]["metric"] == "0.9"
    assert "re-run after its node died" in rows[1]["note"]
    assert rows[-1]["state"] == "failed" and rows[-1]["metric"] == "-" and rows[-1]["note"] == "exit 1"
    assert [r["trial"] for r in sweep_results.rows(st, ["lr"], "max", sort=False)] == ["1", "2", "3", "4"]


def test_events_say_what_changed():
    raw = _done_state()
    st = sweep_state.parse_state(raw)
    before = json.loads(json.dumps(raw))
    for t in before["trials"]:
        t.update(state="running", metric=None)
    before["trials"][3]["state"] = "queued"
    lines = sweep_results.events(sweep_state.parse_state(before), st)
    assert "trial 2 done after 2.5s: metric 0.9" in lines
    assert "trial 4 failed after 1.0s: exit 1" in lines
    assert sweep_results.events(st, st) == []
    assert "trial 2 done after 2.5s: acc 0.9" in sweep_results.events(sweep_state.parse_state(before), st, "acc")
    moved = json.loads(json.dumps(raw))
    moved["trials"][2]["attempts"] = [
        {"node": "10.0.0.3", "outcome": "node died"},
        {"node": "10.0.0.2", "outcome": "done"},
    ]
    before["trials"][2]["requeued"] = 0
    lines = sweep_results.events(sweep_state.parse_state(before), sweep_state.parse_state(moved))
    assert "trial 3 (lr=0.001 opt=sgd) re-queued: its node 10.0.0.3 died" in lines


def test_results_json_and_plot(tmp_path):
    raw = dict(_done_state(), meta={"goal": "max", "metric": "acc", "params": ["lr", "opt"]})
    st = sweep_state.parse_state(raw)
    folder = sweep_results.results_dir(tmp_path / "sweep-results")
    again = sweep_results.results_dir(tmp_path / "sweep-results")
    assert folder != again and folder.parent == again.parent
    path = sweep_results.write_results(folder, st, "c1")
    doc = json.loads(path.read_text())
    assert doc["best"]["id"] == 2 and [t["id"] for t in doc["trials"]] == [2, 3, 1, 4] and doc["metric"] == "acc"
    assert list(doc)[:3] == ["cluster", "template", "params"] and doc["cluster"] == "c1" and doc["goal"] == "max"
    assert doc["trials"][0]["params"] == {"lr": "0.01", "opt": "adam"} and doc["status"] == "failed"
    png = folder / "metric_vs_params.png"
    assert sweep_results.plot(st, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10000
    empty = dict(raw, trials=[dict(t, state="failed", metric=None) for t in raw["trials"]])
    assert not sweep_results.plot(sweep_state.parse_state(empty), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


# ---- the state read at the border --------------------------------------------------------------------------
def test_an_older_state_reads_with_its_documented_defaults():
    # no meta, no nodes, trials with only id, state and params: what an older scheduler may have written
    old = {
        "id": "sweep-20240101-000000-abcd",
        "status": "running",
        "trials": [{"id": 1, "state": "queued", "params": {"lr": 0.1}}],
    }
    st = sweep_state.parse_state(old)
    assert st.params == ("lr",) and st.meta.goal == "max" and st.meta.metric == "metric" and st.nodes == ()
    t = st.trials[0]
    assert (t.params, t.requeued, t.attempts, t.node, t.timed_out, t.where()) == (
        {"lr": "0.1"},
        0,
        (),
        None,
        False,
        "-",
    )
    assert not st.ended_for_good and sweep_results.summary(st) == "sweep sweep-20240101-000000-abcd running: 1 queued"
    assert sweep_state.parse_state(dict(old, trials=[])).params == ()


@pytest.mark.parametrize(
    "change, needle",
    [
        (lambda d: d.pop("trials"), "state.trials is missing"),
        (lambda d: d.pop("status"), "state.status is missing"),
        (lambda d: d.update(status="paused"), "state.status is 'paused', not one of running"),
        (lambda d: d.update(trials={"1": {}}), "state.trials is dict"),
        (lambda d: d["trials"][1].pop("id"), "trials[1].id is missing"),
        (lambda d: d["trials"][0].update(state="weird"), "trials[0].state is 'weird'"),
        (lambda d: d["trials"][0].update(metric="0.9"), "trials[0].metric is str '0.9'"),
        (lambda d: d["trials"][0].update(requeued=True), "trials[0].requeued is bool"),
        (lambda d: d["trials"][0].update(gpus=["0"]), "trials[0].gpus holds something that is not a whole number"),
        (lambda d: d["trials"][2].update(attempts=[{"outcome": "done"}]), "trials[2].attempts[0].node is missing"),
        (lambda d: d.update(nodes=[{"slots": 2}]), "nodes[0].host is missing"),
        (lambda d: d.update(meta={"goal": "best"}), "meta.goal is 'best'"),
        (lambda d: d.update(meta=["lr"]), "state.meta is list"),
    ],
)
def test_a_damaged_state_is_refused_naming_the_field(change, needle):
    doc = _done_state()
    change(doc)
    with pytest.raises(RemoteCommandError, match="damaged") as err:
        sweep_state.parse_state(doc)
    assert needle in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(RemoteCommandError, match="state is list, not an object"):
        sweep_state.parse_state([doc])


# ---- the CLI refuses bad input before anything connects ------------------------------------------------------
@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "--range", "lr=0.1:1", "--", "echo", "{lr}"], "--range needs --random"),
        (["run", "--grid", "lr=1", "--", "echo", "{lr}", "{bs}"], "{bs}"),
        (["run", "--grid", "lr=1", "--goal", "best", "--", "echo"], "--goal must be max or min"),
        (["run", "--grid", "lr=1", "--metric", "acc(", "--", "echo"], "not a regular expression"),
        (["run", "--grid", "lr=1", "--gpus-per-trial", "0", "--", "echo"], "at least 1"),
        (["run", "--grid", "lr=1", "--poll", "0", "--", "echo"], "--poll"),
        (["run", "--grid", "lr=1", "--file", "no-such-file.py", "--", "echo"], "no such file"),
        (["status", "--id", "nope"], "not a sweep id"),
        (["attach", "--id", "nope"], "not a sweep id"),
        (["cancel", "--id", "nope"], "not a sweep id"),
        (["attach", "--poll", "100"], "--poll"),
    ],
)
def test_cli_usage_errors(cli, args, needle):
    r = cli("sweep", *args)
    assert r.returncode == 2, r.stderr
    assert needle in r.stderr and r.stderr.startswith("Error: ")


def test_the_modes_are_subcommands_and_their_options_do_not_mix(cli):
    """`sweep status` takes no trial parameters (click refuses the option), `sweep run` no --json."""
    assert "No such option: --grid" in cli("sweep", "status", "--grid", "lr=1").stderr
    assert "No such option: --json" in cli("sweep", "run", "--json", "--grid", "lr=1", "--", "echo").stderr
    # options first and no subcommand: `sweep run`, as before the subcommands (its checks, exit 2)
    bare = cli("sweep", "--grid", "lr=1", "--goal", "best", "--", "echo", "{lr}")
    assert bare.returncode == 2 and bare.stderr == "Error: --goal must be max or min, not 'best'\n", bare.stderr
    # the old mode flags: one line naming the subcommand (a trial command's own --status is left alone)
    old = cli("sweep", "--cluster", "x", "--status", "--id", "y")
    assert old.returncode == 2, old.stderr
    assert (
        old.stderr == "Error: `sweep --status` is now `clusterctl sweep status`: see `clusterctl sweep status --help`\n"
    )
    trial = cli("sweep", "--grid", "lr=1", "--goal", "best", "--", "echo", "{lr}", "--status")
    assert "--goal must be max or min" in trial.stderr
    listed = cli("sweep", "--help").stdout
    assert all(f"  {name} " in listed for name in ("run", "status", "attach", "cancel")), listed


def test_the_spec_is_keyword_built_and_checked_whole():
    """The library refuses what the CLI refused (one UsageError for every caller), by keyword only."""
    with pytest.raises(TypeError):
        sweep_plan.SweepSpec(("echo", "{lr}"), ("lr=1",))  # type: ignore[misc]  # keyword-only on purpose
    spec = sweep_plan.SweepSpec(template=("echo", "{lr}", "{bs}"), grid=("lr=1,2", "bs=8"), ranges=())
    assert spec.params == ("lr", "bs") and len(spec.combos) == 2 and spec.unused() == []
    assert [t.command for t in spec.trials("py")] == ["echo 1 8", "echo 2 8"]
    for bad, needle in (
        (dict(goal="best"), "--goal must be max or min"),
        (dict(node_timeout=0), "--node-timeout"),
        (dict(trial_timeout=-1), "--trial-timeout"),
        (dict(poll=0.01), "--poll"),
        (dict(metric_regex="acc("), "not a regular expression"),
        (dict(grid=()), "nothing to sweep"),
        (dict(template=()), "command"),
    ):
        with pytest.raises(UsageError, match=re.escape(needle)):
            sweep_plan.SweepSpec(**{"template": ("echo", "{lr}"), "grid": ("lr=1",), **bad})


def test_the_shipped_trainer_takes_the_usual_flags(tmp_path):
    from clusterctl.node.train.options import parse_args

    args = parse_args(["--synthetic", "--lr", "0.05", "--batch-size", "16"])
    assert args.base_lr == 0.05 and args.batch_size == 16
    # `--file train_imagenet.py` stages the node package under that name: `python train_imagenet.py ARGS` is the
    # trainer (its --help exits before TensorFlow is imported)
    ((name, data),) = sweep_plan.stage_files(["train_imagenet.py"])
    (tmp_path / name).write_bytes(data)
    proc = subprocess.run(["python3", name, "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: train "), proc.stdout + proc.stderr
    assert "--lr" in proc.stdout and "--model-dir" in proc.stdout


def test_the_trainer_model_dir_must_differ_per_trial():
    # trials run at once in one folder: a shared --model-dir lets them resume each other's checkpoints
    for template in (
        ["python", "train_imagenet.py", "--lr", "{lr}", "--model-dir", "shared"],
        ["python", "train_imagenet.py", "--lr", "{lr}", "--model-dir=run-{lr}"],
        ["python train_imagenet.py --lr {lr} --model-dir out"],
    ):
        with pytest.raises(UsageError, match=r"would be shared by every trial") as err:
            sweep_plan.build_trials(template, [{"lr": "0.1"}], "py")
        assert "{trial}" in err.value.hint
    for template in (
        ["python", "train_imagenet.py", "--lr", "{lr}", "--model-dir", "run{trial}"],
        ["python", "train_imagenet.py", "--lr", "{lr}"],  # the trainer's per-trial default
        ["python", "mine.py", "--lr", "{lr}", "--model-dir", "shared"],
    ):  # not the shipped trainer
        assert len(sweep_plan.build_trials(template, [{"lr": "0.1"}, {"lr": "0.2"}], "py")) == 2
