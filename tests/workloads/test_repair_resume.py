"""A non-elastic run after `repair`: a member's namespace processes killed mid-run, the node replaced (its runtime and
the dataset with it), and the same `train` command resumes from the last checkpoint on all three nodes."""

from __future__ import annotations

import os
import re
import signal

import pytest

from clusterctl.workloads.train import log as train_log
from conftest import node_pid, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.horovod]


def test_train_resumes_with_the_same_command_after_repair(local_cluster_factory, horovod_present):
    c = local_cluster_factory(3, 1, runtime=True)
    cli = c.cli
    ok = cli("data", "synthetic", "ds", "--images", "240", "--classes", "10", "--image-size", "32")
    assert ok.returncode == 0, ok.stderr
    ok = cli("sync", "--cluster", c.name, str(cli.cwd / "ds"), "/root/ds", timeout=300)
    assert ok.returncode == 0, ok.stderr
    cmd = ["train", "--data", "/root/ds", "--model", "tiny", "--epochs", "25", "--batch-size", "8"]
    cmd += ["--checkpoint-every", "10", "--log-every", "10", "--model-dir", "~/runs/r", "--warmup-epochs", "1"]
    proc = cli(*cmd)
    assert proc.returncode == 0, proc.stderr
    job = re.search(r"started training job (train-[\w-]+)", proc.stderr).group(1)

    def log() -> str:
        return c.node_exec(0, "sh", "-c", f"cat ~/.clusterctl/jobs/{job}.log 2>/dev/null; true").stdout

    def saved() -> int | None:
        run = train_log.parse_train_log(log()).current
        steps = [cp.step for cp in run.checkpoints] if run is not None else []
        return max(steps) if steps and max(steps) >= 20 else None

    wait_for(saved, 300, "a checkpoint at step 20 or later", interval=0.5)
    os.kill(node_pid(c.name, 2), signal.SIGKILL)  # member-2 is gone: its sshd (PID 1) and every rank with it
    cli("train", "--stop", timeout=120)
    first = train_log.parse_train_log(log()).current
    assert first is not None and first.done is None, "the run finished before the member was lost"
    before = max(cp.step for cp in first.checkpoints)

    proc = cli("repair", c.name, "--yes", timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert "node runtime" in proc.stderr and "dataset /root/ds verified on 1 new node(s)" in proc.stderr, proc.stderr

    proc = cli(*cmd, "--wait", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    run = train_log.parse_train_log(proc.stdout).current
    assert run.resumed_from is not None and run.resumed_from.step >= before
    assert run.start.size == 3 and run.start.start_step == run.resumed_from.step
    assert run.done is not None and run.done.complete and run.done.step == run.start.total_steps
