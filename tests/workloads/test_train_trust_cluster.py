"""Training results an ML engineer can trust, for real: `clusterctl train` on a 2-node local cluster, 2 slots
each (4 Horovod ranks over gloo), the tiny model on a generated TFRecord set.

- a float16 run with loss scaling resumed from its checkpoint: every rank holds the same weights, optimizer
  state and loss scale afterwards (rank 0 alone restores; before, the loss scale and its counter stayed
  at their initial values on the other ranks);
- a wrong --label-offset stops the run before its first step, with the reason;
- --eval-every evaluates during training on all ranks, each validation image once, logged as lines and to
  TensorBoard; --recipe goyal, --fp16-allreduce and Horovod's fusion settings reach the trainer.
"""

from __future__ import annotations

import base64
import re
import subprocess

import pytest

from clusterctl.workloads.train import log as train_log
from conftest import TRAIN_PY

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

BASE = [
    "train",
    "--data",
    "/root/ds",
    "--model",
    "tiny",
    "--batch-size",
    "8",
    "--log-every",
    "10",
    "--base-lr",
    "1",
    "--warmup-epochs",
    "1",
    "--no-verify-data",
]


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    cluster = module_cluster_factory(2, 2, runtime=True)
    proc = cluster.cli(
        "data",
        "synthetic",
        "ds",
        "--images",
        "640",
        "--classes",
        "10",
        "--image-size",
        "32",
        "--validation-images",
        "128",
        "--train-shards",
        "4",
        "--validation-shards",
        "2",
    )
    assert proc.returncode == 0, proc.stderr
    proc = cluster.cli("sync", str(cluster.cli.cwd / "ds"), "/root/ds", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return cluster


def marked(out: str, kind: str) -> list[dict]:
    """The `CLUSTERCTL-TRAIN <kind> k=v ...` lines of a log, as dicts."""
    found = []
    for line in out.splitlines():
        m = re.search(rf"{train_log.MARK} {kind} (.*)$", line)
        if m:
            found.append(dict(kv.split("=", 1) for kv in m.group(1).split()))
    return found


def test_a_resumed_float16_run_keeps_every_rank_in_step(c):
    args = [
        *BASE,
        "--epochs",
        "4",
        "--precision",
        "float16",
        "--checkpoint-every",
        "20",
        "--trainer-arg=--no-eval",
        "--model-dir",
        "~/runs/fp16",
    ]
    first = c.cli(*args, "--max-steps", "20", "--wait", timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-2000:]
    run1 = train_log.parse_train_log(first.stdout).current
    assert run1.start.fields["precision"] == "mixed_float16" and run1.start.fields["loss_scaling"] == "1"
    assert run1.start.size == 4 and run1.checkpoints[-1].step == 20

    second = c.cli(*args, "--max-steps", "40", "--wait", timeout=900)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-2000:]
    run2 = train_log.parse_train_log(second.stdout).current
    assert run2.resumed_from is not None and run2.resumed_from.step == 20 and run2.done.step == 40
    # Rank 0 restored the loss scale and its good-steps counter; every rank must have them, and so the
    # same unscaled update: identical weights, momentum and loss scale on all 4 ranks 20 steps later.
    (sync,) = marked(second.stdout, "sync")
    scales = sync["loss_scales"].split(",")
    assert len(scales) == 4 and len(set(scales)) == 1 and float(scales[0]) >= 1, sync
    assert sync["identical"] == "1", f"ranks differ after the resume: {second.stdout[-2000:]}"
    assert not [w for w in run2.warnings if w.fields.get("kind") == "replicas_differ"]


def test_a_wrong_label_offset_stops_before_the_first_step(c):
    # clusterctl data writes 1-based labels (dataset.json says label_base 1): offset 0 makes 1..10, not 0..9
    proc = c.cli(
        *BASE, "--epochs", "1", "--model-dir", "~/runs/labels", "--trainer-arg=--label-offset=0", "--wait", timeout=900
    )
    assert proc.returncode != 0, proc.stdout[-3000:]
    run = train_log.parse_train_log(proc.stdout).current
    errors = [e.fields for e in run.errors]
    assert errors and errors[0]["kind"] == "bad_labels", proc.stdout[-3000:]
    assert "outside 0..9" in errors[0]["message"] and "--label-offset 1" in errors[0]["message"]
    assert run.rows == () and run.checkpoints == ()


def test_eval_every_epoch_on_all_ranks_with_goyal_recipe(c, tmp_path):
    proc = c.cli(
        *BASE,
        "--epochs",
        "2",
        "--eval-every",
        "1",
        "--recipe",
        "goyal",
        "--fp16-allreduce",
        "--fusion-threshold-mb",
        "32",
        "--cycle-time-ms",
        "2.5",
        "--model-dir",
        "~/runs/evals",
        "--wait",
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run = train_log.parse_train_log(proc.stdout).current
    f = run.start.fields
    assert (f["recipe"], f["schedule"], f["label_smoothing"], f["fp16_allreduce"]) == ("goyal", "step", "0", "1")
    assert (f["fusion_threshold"], f["cycle_time_ms"]) == (str(32 << 20), "2.5")
    assert run.start.steps_per_epoch == 20 and run.done.step == 40
    # one evaluation after epoch 1 during training, then the final one: each on all 4 ranks, 128 images once
    (mid,) = run.evals
    assert (mid.step, mid.epoch, mid.size, mid.examples) == (20, 1.0, 4, 128)
    assert mid.checkpoint.endswith(f"ckpt-{20 * run.start.global_batch}")  # named by images seen, not by step
    assert run.eval is not None and (run.eval.step, run.eval.size, run.eval.examples) == (40, 4, 128)
    assert [e["final"] for e in marked(proc.stdout, "eval")] == ["0", "1"]
    # both in TensorBoard, at their steps (event files are TFRecords: concatenated, still one)
    events = c.node_exec(0, "sh", "-c", "cat /root/runs/evals/tensorboard/events.out.tfevents.* | base64 -w0").stdout
    path = tmp_path / "events"
    path.write_bytes(base64.b64decode(events))
    probe = (
        "import sys, tensorflow as tf\n"
        "for e in tf.compat.v1.train.summary_iterator(sys.argv[1]):\n"
        "    for v in e.summary.value:\n"
        "        if v.tag == 'eval/top1': print('TOP1', e.step)\n"
    )
    out = subprocess.run([TRAIN_PY, "-c", probe, str(path)], capture_output=True, text=True, timeout=300)
    assert sorted(int(x) for x in re.findall(r"TOP1 (\d+)", out.stdout)) == [20, 40], out.stdout + out.stderr[-2000:]
