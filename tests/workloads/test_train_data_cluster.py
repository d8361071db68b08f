"""A dataset is whole on every node or training is refused: a real generated TFRecord set synced to a 2-node local
cluster, judged on the nodes by `train` (workloads/train/nodes.py) against dataset.json. A member that lost shards
after the sync, and a conversion killed halfway and synced as it was, are each one Error line naming the node and
the shards it lacks; the whole copy passes the same judge; nothing on the nodes is changed by the check."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.integration

TRAIN = ("train", "--model", "tiny", "--epochs", "1", "--batch-size", "8")


@pytest.fixture(scope="module")
def c(module_cluster_factory):
    return module_cluster_factory(2, 1)


def _judge(c, data: str) -> list[str]:
    """The library's judge on what the real nodes answer (as train asks them)."""
    from clusterctl.workloads.train import nodes as train_nodes

    proc = c.cli("run", "--json", train_nodes.data_check_command(data))
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    return train_nodes.data_problems({a["host"]: a["stdout"] for a in answers})


def _listing(c, index: int, data: str) -> str:
    return c.node_exec(index, "sh", "-c", f"cd {data} && ls -l --time-style=+%s . .clusterctl-sync").stdout


def test_a_node_missing_shards_or_a_half_conversion_is_refused_naming_it(c):
    proc = c.cli(
        "data", "synthetic", "ds", "--images", "160", "--classes", "4", "--image-size", "16",
        "--train-shards", "8", "--validation-shards", "2",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # dataset.json records each shard's records and bytes (what a whole copy holds)
    import tensorflow as tf

    ds = c.cli.cwd / "ds"
    for split in json.loads((ds / "dataset.json").read_text())["splits"].values():
        assert split["records"] == [sum(1 for _ in tf.data.TFRecordDataset(str(ds / n))) for n in split["shards"]]
        assert (
            split["bytes"] == [(ds / n).stat().st_size for n in split["shards"]]
            and sum(split["records"]) == split["examples"]
        )
    proc = c.cli("sync", str(c.cli.cwd / "ds"), "/root/ds", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _judge(c, "/root/ds") == []  # the whole copy passes

    # the member loses three train shards after the sync (its completion marker stays)
    c.node_exec(1, "sh", "-c", "rm /root/ds/train-0000[357]-of-00008")
    before = [_listing(c, i, "/root/ds") for i in (0, 1)]
    proc = c.cli(*TRAIN, "--data", "/root/ds")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 3 and len(errors) == 1, proc.stderr
    assert (
        f"{c.hosts[1]}: train has 5 of 8 shards (missing train-00003-of-00008, train-00005-of-00008, "
        "train-00007-of-00008)" in errors[0]
    ), errors
    assert f"{c.hosts[0]}:" not in errors[0], errors
    assert [_listing(c, i, "/root/ds") for i in (0, 1)] == before  # the check changed nothing
    assert "train-00007-of-00008" in before[0] and "dataset.json" in before[1]

    # a conversion killed after 3 of 8 train shards (no validation yet, no dataset.json: written last), synced
    half = c.cli.cwd / "half"
    half.mkdir()
    for i in range(3):
        shutil.copy(c.cli.cwd / "ds" / f"train-{i:05d}-of-00008", half)
    proc = c.cli("sync", str(half), "/root/half", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = c.cli(*TRAIN, "--data", "/root/half")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 3 and len(errors) == 1, proc.stderr
    for host in c.hosts:
        assert f"{host}: train has 3 of 8 shards (missing train-00003-of-00008" in errors[0], errors
