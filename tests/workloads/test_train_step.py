"""clusterctl/node/train/step.py: the training step the trainer, the benchmark and the overlap probe share. Under
XLA the model is compiled per segment, so its backward pass is a chain of XLA ops whose gradients reach
Horovod one segment at a time (the whole model as one XLA op hands them all over at the end). The pure part
of node/overlap.py, reading Horovod's timeline, here too; the timeline of real steps on 2 nodes is in
test_launch.py."""

from __future__ import annotations

import json
import subprocess

import pytest

from clusterctl.node.overlap import backward_point, read_timeline, step_submissions
from conftest import REPO, TRAIN_PY as PY

TRACE = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, sys.argv[1])
import tensorflow as tf
from clusterctl.node.train import model as train_model, step as train_step

out = {}
for name, size in (("resnet50", 32), ("tiny", 32)):
    m = train_model.build_model(tf, name, size, 10)
    spans = train_step.segments(m)
    parts = train_step.segment_models(tf, m)
    out[name] = {
        "segments": [[m.layers[a].name, m.layers[b].name] for a, b in spans],
        "in_parts": [v.name for p in parts for v in p.trainable_weights],
        "all": [v.name for v in m.trainable_weights],
    }
m = train_model.build_model(tf, "tiny", 32, 10)
opt, _ = train_step.make_optimizer(tf, 0.1, 0.9, False)
objective = train_step.make_objective(tf, m, 10, 0.1, 1e-4, "goyal")
x = tf.zeros((2, 32, 32, 3), tf.uint8)
y = tf.zeros((2,), tf.int64)
for design in ("blocks", "whole"):
    forward = train_step.make_forward(tf, m, True, design)
    step = train_step.make_step(tf, None, m, opt, objective, forward, loss_scaling=False, compression=None, allreduce=False)
    graph = tf.function(step).get_concrete_function(x, y).graph
    xla = [op for op in graph.get_operations() if "_XlaMustCompile" in op.node_def.attr]
    out[design] = sorted(len(op.outputs) for op in xla)
print(json.dumps(out))
"""


@pytest.mark.integration
def test_segments_cover_every_weight_once_and_the_backward_pass_is_a_chain_of_xla_ops():
    proc = subprocess.run([PY, "-c", TRACE, str(REPO)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rn = out["resnet50"]
    # the stem's conv, its batch norm and pool, each of the 16 residual blocks, the classifier
    assert len(rn["segments"]) == 19, rn["segments"]
    assert rn["segments"][:3] == [
        [rn["segments"][0][0], "conv1_conv"],
        ["conv1_bn", "pool1_pool"],
        ["conv2_block1_1_conv", "conv2_block1_out"],
    ]
    assert rn["segments"][-2] == ["conv5_block3_1_conv", "avg_pool"] and rn["segments"][-1] == [
        "predictions",
        "predictions",
    ]
    assert sorted(rn["in_parts"]) == sorted(rn["all"]) and len(rn["all"]) == 161  # each weight in one segment
    tiny = out["tiny"]
    assert len(tiny["segments"]) == 5 and sorted(tiny["in_parts"]) == sorted(tiny["all"])
    # tiny's 5 segments: 5 forward and 5 backward XLA ops, whose outputs hold the 8 gradients between them;
    # the whole model: one of each, the backward one yielding every gradient at once
    assert len(out["blocks"]) == 10, out["blocks"]
    assert len(out["whole"]) == 2 and max(out["whole"]) >= 8, out["whole"]


CONVERSIONS = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, sys.argv[1])
from tensorflow.python.autograph.pyct import transpiler
converted = []
transform = transpiler.PyToPy.transform
def counted(self, obj, user_context):
    converted.append(getattr(obj, "__qualname__", repr(obj)))
    return transform(self, obj, user_context)
transpiler.PyToPy.transform = counted
from clusterctl.node import bench
from clusterctl.node.train import main
bench.main(["--model", "tiny", "--steps", "3", "--iters", "3", "--batch-size", "8"])
print("bench", converted, file=sys.stderr)
del converted[:]
main.main(["--synthetic", "--model", "tiny", "--max-steps", "20", "--batch-size", "8", "--model-dir", sys.argv[2]])
print("train", converted, file=sys.stderr)
"""


@pytest.mark.integration
def test_the_benchmark_and_the_trainer_start_without_autograph(tmp_path):
    """Every function the step, the evaluation and the broadcasts trace is plain TensorFlow with no Python control
    flow over tensors: traced as written. AutoGraph's conversion of them (the Keras calls and Horovod's
    allreduce and broadcast inside) was half of each process's start after its imports."""
    argv = [PY, "-c", CONVERSIONS, str(REPO), str(tmp_path / "run")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith(("bench ", "train "))]
    assert said == ["bench []", "train []"], proc.stderr[-3000:]


def _events(steps: list[list[int]]) -> list[dict]:
    """A timeline as Horovod writes it: its start on the epoch clock, each tensor a "process", its phases
    opening with B and closing with E (ts in microseconds since the start)."""
    ev: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 10_000_000}}
    ]
    for pid in range(1, len(steps[0]) + 1):
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"grad{pid}"}})
    for arrivals in steps:
        for pid, ts in enumerate(arrivals, start=1):
            ev += [
                {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": ts, "pid": pid},
                {"ph": "E", "ts": ts + 50, "pid": pid},
                {"ph": "B", "name": "ALLREDUCE", "ts": ts + 60, "pid": pid},
                {"ph": "E", "ts": ts + 900, "pid": pid},
            ]
    return ev


def test_the_timeline_says_when_each_steps_gradients_arrived():
    # two steps starting 1 s and 3 s after the timeline's start (11 s and 13 s on the epoch clock)
    ev = _events([[1_300_000, 1_500_000, 1_900_000], [3_400_000, 3_400_000, 3_400_000]])
    text = json.dumps(ev)
    assert read_timeline(text) == ev
    assert read_timeline(text[:-1] + ",\n") == ev  # a file cut after an event's comma still reads
    steps = step_submissions(ev, [(11.0, 12.5), (13.0, 14.5)])
    assert [(round(a, 3), round(b, 3), n) for a, b, n in steps] == [(0.3, 0.9, 3), (0.4, 0.4, 3)]
    # the end of a phase is no arrival (the sync allreduce before a step ends after its start); nothing: no step
    assert step_submissions(ev, [(11.3001, 11.4)]) == []
    assert step_submissions(ev, [(20.0, 21.0)]) == []
    assert [n for _, _, n in step_submissions(ev, [(11.0, 12.5)], ignore=("grad1",))] == [2]  # not the step's
    assert step_submissions([e for e in ev if e["pid"] != 0], [(11.0, 12.5)]) == []  # no start: nothing to say


def test_the_first_gradients_point_in_the_backward_pass():
    assert backward_point(0.3, 0.9, 0.25) == pytest.approx(0.05 / 0.65)
    assert backward_point(0.4, 0.4, 0.1) == 1.0  # all at once: at the backward pass's end
    assert backward_point(0.1, 0.9, 0.2) == 0.0  # before the forward pass timed alone ended
    assert backward_point(0.1, 0.1, 0.2) == 1.0
