"""`clusterctl train --input dali` for real on a local node whose runtime carries NVIDIA DALI (`up --runtime
dali`: DALI's CPU backend, its TensorFlow plugin built against the runtime's TF): the tiny model trained by 2
Horovod ranks from the same records with tf.data and with DALI, to the same loss range and accuracy; the
choice said at start; DALI's index files beside the records on the node.

Its own one-node cluster: the shared training clusters' runtime has no DALI (adding it would make every test of
their modules relay a runtime 0.8 GB larger)."""

from __future__ import annotations

import pytest

from clusterctl.workloads.train import log as train_log

pytestmark = [pytest.mark.integration, pytest.mark.horovod]

TRAIN = (
    "train --data /root/ds --model tiny --epochs 10 --batch-size 8 --log-every 40 --base-lr 2 --warmup-epochs 1 --wait"
)


def test_dali_trains_the_tiny_model_like_tf_data(local_cluster_factory):
    cluster = local_cluster_factory(1, 2, extra=("--runtime", "dali"), runtime=True)
    cli = cluster.cli
    assert "DALI 2.4.0" in cluster.up_stderr, cluster.up_stderr
    data = ("data", "synthetic", "ds", "--images", "640", "--classes", "10", "--image-size", "32")
    assert cli(*data, "--train-shards", "4", "--validation-shards", "2").returncode == 0
    proc = cli("sync", str(cli.cwd / "ds"), "/root/ds", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    runs = {}
    for name in ("tfdata", "dali"):
        proc = cli(*TRAIN.split(), "--input", name, "--model-dir", f"~/runs/{name}", timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        runs[name] = (train_log.parse_train_log(proc.stdout).current, proc.stderr)
        assert f" input={name} " in proc.stdout  # the trainer's start line: what it decoded with
        print(f"\n--input {name}\n" + "".join(x for x in proc.stdout.splitlines(True) if train_log.MARK in x))

    assert "input: tf.data (--input tfdata)" in runs["tfdata"][1]
    assert "input: DALI (--input dali, decoding on DALI's CPU backend: the nodes have no GPUs)" in runs["dali"][1]
    losses = {}
    for name, (run, _) in runs.items():
        assert run.done.complete and run.done.step == 400 and run.start.size == 2
        assert run.eval.examples == 128 and run.eval.top1 > 30, f"{name}: top-1 {run.eval.top1}% near chance (10%)"
        losses[name] = sum(r.loss for r in run.rows[-3:]) / 3
    # From ln(10) = 2.30 at the start to the same range at the end: within 35% of each other.
    assert max(losses.values()) < 1.7 and max(losses.values()) / min(losses.values()) < 1.35, losses
    index = cluster.node_exec(0, "sh", "-c", "ls /root/ds/.dali-index").stdout.split()
    assert sorted(index) == [f"train-0000{i}-of-00004.idx" for i in range(4)] + [
        f"validation-0000{i}-of-00002.idx" for i in range(2)
    ]
