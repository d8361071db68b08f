"""The GPU types' fast paths, run for real on this machine's CPU: float16 (with loss scaling) and bfloat16,
gradients compressed to float16 for the allreduce, the model compiled with XLA. horovodrun, gloo, 2 processes,
the tiny model, a few steps: the loss stays finite and both ranks end with the same weights.

Never skipped: without TensorFlow and Horovod in the training Python it fails and says how to get them.
"""

from __future__ import annotations

import math
import os
import shlex
import signal
import subprocess

import pytest

from clusterctl.workloads.horovod import horovodrun_argv, parse_bench_output, scrubbed_env
from clusterctl.workloads.train import log as train_log, options as train
from conftest import HOROVODRUN, TRAIN_PY as PY, node_pyz

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

TIMEOUT_S = 300  # TensorFlow's float16 and XLA on a CPU are slow to trace and compile; the steps are few


@pytest.fixture(scope="module", autouse=True)
def _horovod(horovod_present):
    """Every test here runs real horovodrun: fail loudly, never skip, when it is missing."""


def _run(argv: list[str], cwd) -> tuple[int, str]:
    env = scrubbed_env(dict(os.environ))
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"horovodrun did not finish in {TIMEOUT_S} s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.mark.parametrize("precision, policy", [("float16", "mixed_float16"), ("bfloat16", "mixed_bfloat16")])
def test_sixteen_bit_compressed_xla_training_keeps_both_ranks_identical(tmp_path, precision, policy):
    opts = train.TrainOptions(
        synthetic=True,
        model="tiny",
        epochs=1,
        batch_size=8,
        model_dir=str(tmp_path / "model"),
        max_steps=4,
        warmup_epochs=0,
        log_every=2,
        checkpoint_every=0,
        no_eval=True,
        precision=precision,
        xla=True,
        fp16_allreduce=True,
        extra=("--train-examples", "64"),
    )
    script = train.trainer_argv(PY, node_pyz(), opts)
    code, out = _run(horovodrun_argv(2, "localhost:2", script, horovodrun=HOROVODRUN), tmp_path)
    assert code == 0, out[-4000:]
    run = train_log.parse_train_log(out).current
    assert run is not None and run.start is not None, out[-4000:]
    f = run.start.fields
    assert (f["precision"], f["loss_scaling"], f["xla"], f["fp16_allreduce"], f["size"]) == (
        policy,
        "1" if precision == "float16" else "0",
        "1",
        "1",
        "2",
    )
    assert [r.step for r in run.rows] == [1, 2, 4]
    assert all(math.isfinite(r.loss) and math.isfinite(r.total_loss) and r.loss > 0 for r in run.rows), run.rows
    assert run.done is not None and run.done.step == 4
    # The trainer's own check: every rank's weights, optimizer slots and loss scale, fingerprinted in float64
    # and gathered, are the same on both ranks after the compressed allreduces.
    sync = next(line for line in out.splitlines() if f"{train_log.MARK} sync " in line)
    fields = dict(tok.split("=", 1) for tok in shlex.split(sync.split(f"{train_log.MARK} sync ", 1)[1]))
    assert fields["identical"] == "1", sync
    assert int(fields["variables"]) > 0
    if precision == "float16":  # both ranks carry the same dynamic loss scale
        scales = fields["loss_scales"].split(",")
        assert len(scales) == 2 and scales[0] == scales[1] != "-", sync


def test_the_benchmark_runs_float16_with_compression_and_xla(tmp_path):
    script = [
        PY,
        node_pyz(),
        "bench",
        "--model",
        "tiny",
        "--batch-size",
        "8",
        "--warmup-steps",
        "2",
        "--steps",
        "2",
        "--iters",
        "3",
        "--precision",
        "float16",
        "--xla",
        "--fp16-allreduce",
    ]
    code, out = _run(horovodrun_argv(2, "localhost:2", script, horovodrun=HOROVODRUN), tmp_path)
    assert code == 0, out[-4000:]
    start = next(line for line in out.splitlines() if "CLUSTERCTL-BENCH start " in line)
    assert "precision=mixed_float16 loss_scaling=1 xla=1 fp16_allreduce=1" in start, start
    run = parse_bench_output(out)
    assert run.size == 2 and run.img_per_sec > 0 and math.isfinite(run.img_per_sec)
