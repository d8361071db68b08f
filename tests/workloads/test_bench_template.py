"""The node package's benchmark (`python3 PYZ bench`) run for real: horovodrun, gloo, 2 processes on localhost, tiny model.

Never skipped: without TensorFlow and Horovod in the training Python it fails and says how to get them.
CLUSTERCTL_TRAIN_PYTHON names that Python (default: the one running the tests).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.workloads.horovod import device_problems, horovodrun_argv, parse_bench_output, scrubbed_env
from conftest import HOROVODRUN, TRAIN_PY as PY, node_pyz

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

TIMEOUT_S = 300  # measured: about 10 s on 2 cores


@pytest.fixture(scope="module", autouse=True)
def _horovod(horovod_present):
    """Every test here runs real horovodrun: fail loudly, never skip, when it is missing."""


def run_horovodrun(argv: list[str], cwd: Path) -> tuple[int, str, float]:
    """Run in its own process group so a timeout can take the ranks down with it."""
    # A planted credential: the scrubbed environment is what every rank's command line gets.
    env = scrubbed_env({**os.environ, "AWS_SECRET_ACCESS_KEY": "planted-by-test"})
    assert "AWS_SECRET_ACCESS_KEY" not in env
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"horovodrun did not finish in {TIMEOUT_S} s:\n{out[-4000:]}")
    return proc.returncode, out, time.monotonic() - start


def bench_argv(*extra: str) -> list[str]:
    script = [PY, node_pyz(), "bench", "--model", "tiny", "--batch-size", "32", "--steps", "5", "--iters", "4", *extra]
    return horovodrun_argv(2, "localhost:2", script, horovodrun=HOROVODRUN)


def test_tiny_bench_two_processes(tmp_path):
    code, out, wall = run_horovodrun(bench_argv("--expect-size", "2"), tmp_path)
    assert code == 0, out[-4000:]
    run = parse_bench_output(out)
    assert run.size == 2
    assert run.img_per_sec > 0
    assert "[0]<stdout>:model tiny: 5,466 parameters\n" in out  # the shared network (node/train/model.py), named
    # Horovod's reference timing: 10 warm-up steps by default, then --iters timed batches, each one's rate
    # printed (clusterctl takes the mean's interval from them); the result's conf= is their spread, 1.96 sd
    assert "warmup_steps=10 steps=5 iters=4" in out
    assert [i.step for i in run.intervals] == [5, 10, 15, 20]
    # what ran, as the start line says it: results.json's configuration is read from here
    assert {k: run.start[k] for k in ("model", "batch", "steps", "iters", "xla", "precision", "compression")} == {
        "model": "tiny",
        "batch": "32",
        "steps": "5",
        "iters": "4",
        "xla": "0",
        "precision": "float32",
        "compression": "none",
    }
    assert all(i.img_per_sec > 0 and i.size == 2 for i in run.intervals)
    # no --max-seconds: exactly --iters batches, and the stop line says so
    assert (run.stop["reason"], run.stop["batches"]) == ("fixed", "4") and float(run.stop["seconds"]) > 0
    totals = [i.img_per_sec for i in run.intervals]
    mean = sum(totals) / 4
    assert run.img_per_sec == pytest.approx(mean, abs=0.01)
    assert run.conf == pytest.approx(1.96 * (sum((t - mean) ** 2 for t in totals) / 4) ** 0.5, abs=0.01)
    assert run.conf > 0 and all(h.conf > 0 for h in run.hosts)
    assert sorted((h.rank, h.local_rank) for h in run.hosts) == [(0, 0), (1, 1)]
    assert all(h.img_per_sec > 0 for h in run.hosts)
    # every rank said where it computed: the CPU here (gpus=none), fine on a node without GPUs only
    assert sorted((d.rank, d.local_rank, d.gpus, d.logical) for d in run.devices) == [(0, 0, (), 0), (1, 1, (), 0)]
    assert "gpus=none logical=0" in out
    assert device_problems(run.devices, 2, 0) == []
    assert device_problems(run.devices, 2, 4)[0].endswith(
        "ran on the CPU (TensorFlow found no usable GPU: a CPU-only TensorFlow, or CUDA/the driver failed to load)"
    )
    print(f"wall {wall:.1f} s, {run.img_per_sec:.0f} img/s")


def test_a_rung_judged_against_one_before_it_stops_once_decided(tmp_path):
    """--against: the rung before it (here a made-up 1-process rung of 1 img/s, 20 batches): its efficiency,
    hundreds of times the threshold, clears it once the 99.9% interval of the batches narrows enough (at the
    first look, after --iters batches, on a quiet machine; a few more where load makes single batches differ
    fourfold), long before --max-seconds 60. Every rank stops at the same batch, or horovodrun would hang."""
    argv = bench_argv("--expect-size", "2", "--max-seconds", "60", "--threshold", "0.9", "--against", "1.0:0.01:20:2.0")
    code, out, _ = run_horovodrun(argv, tmp_path)
    assert code == 0, out[-4000:]
    run = parse_bench_output(out)
    assert run.stop["reason"] == "decided" and int(run.stop["batches"]) == len(run.intervals) >= 4, out[-4000:]
    assert float(run.stop["seconds"]) < 60, run.stop
    assert (run.start["max_seconds"], run.start["threshold"], run.start["against"]) == ("60.00", "0.90", "1")


def test_size_mismatch_fails_loudly(tmp_path):
    code, out, _ = run_horovodrun(bench_argv("--expect-size", "4"), tmp_path)
    # horovodrun exits 1 whatever status the ranks had (3 here); the reason is in the output.
    assert code != 0
    assert "Horovod size is 2 but 4 processes were expected" in out
    with pytest.raises(ValueError, match="kind=size_mismatch size=2 expected=4"):
        parse_bench_output(out)


def test_input_pipeline_alone(tmp_path):
    """--input-only: JPEG decode, crop, flip, resize, batch without a model, so a feeding bottleneck shows."""
    code, out, _ = run_horovodrun(bench_argv("--expect-size", "2", "--input-only"), tmp_path)
    assert code == 0, out[-4000:]
    run = parse_bench_output(out)
    assert run.model == "input-pipeline" and run.size == 2 and run.img_per_sec > 0 and len(run.intervals) == 4
