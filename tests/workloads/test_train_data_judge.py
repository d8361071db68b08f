"""train's data judge (workloads/train/nodes.py), pure: every node's copy against its dataset.json (every shard
of every split, of the size recorded), or without one against what the shards' `-of-N` names promise; one line per
node naming what is missing. The same judge on real nodes: tests/workloads/test_train_data_cluster.py."""

from __future__ import annotations

import json

from clusterctl.workloads.train import nodes

MARKER = '{"files": 8, "manifest_sha256": "%s", "source": "/x"}'


def _meta(train: int = 4, validation: int = 2, size: int = 100) -> str:
    def split(name: str, n: int) -> dict:
        shards = [f"{name}-{i:05d}-of-{n:05d}" for i in range(n)]
        return {"examples": 10 * n, "shards": shards, "records": [10] * n, "bytes": [size] * n}

    return json.dumps(
        {
            "format": "imagenet-tfrecord",
            "splits": {"train": split("train", train), "validation": split("validation", validation)},
        }
    )


def _out(files: dict[str, int], marker: str = MARKER % "aa", meta: str = "") -> str:
    listing = "".join(f"{n} {b}\n" for n, b in files.items())
    return f"@files\n{listing}@marker\n{marker}\n@meta\n{meta}\n"


def _whole(train: int = 4, validation: int = 2) -> dict[str, int]:
    files = {f"train-{i:05d}-of-{train:05d}": 100 for i in range(train)}
    files.update({f"validation-{i:05d}-of-{validation:05d}": 100 for i in range(validation)})
    return files


def test_a_whole_copy_on_every_node_passes():
    good = {h: _out(_whole(), meta=_meta()) for h in ("10.0.0.2", "10.0.0.3")}
    assert nodes.data_problems(good) == []


def test_a_node_that_lacks_shards_is_one_line_naming_it_and_what_is_missing():
    files = _whole(train=1024)
    for i in range(300, 1024):
        del files[f"train-{i:05d}-of-01024"]
    outs = {"10.0.0.2": _out(_whole(train=1024), meta=_meta(1024)), "10.0.0.3": _out(files, meta=_meta(1024))}
    assert nodes.data_problems(outs) == [
        "10.0.0.3: train has 300 of 1024 shards (missing train-00300-of-01024, train-00301-of-01024, "
        "train-00302-of-01024 and 721 more)"
    ]


def test_a_short_shard_is_named_with_its_size():
    files = _whole()
    files["train-00002-of-00004"] = 40
    outs = {"10.0.0.3": _out(files, meta=_meta())}
    assert nodes.data_problems(outs) == [
        "10.0.0.3: train shards of another size than dataset.json says: train-00002-of-00004 (40 bytes, not 100)"
    ]


def test_a_killed_conversion_without_dataset_json_is_judged_by_its_shard_names():
    # 3 of 8 train shards, no validation yet, no dataset.json (written last): synced, marker and all
    files = {f"train-{i:05d}-of-00008": 100 for i in range(3)}
    assert nodes.data_problems({"10.0.0.2": _out(files)}) == [
        "10.0.0.2: train has 3 of 8 shards (missing train-00003-of-00008, train-00004-of-00008, "
        "train-00005-of-00008 and 2 more)"
    ]
    mixed = {**files, "train-00000-of-00004": 5}
    assert nodes.data_problems({"10.0.0.2": _out(mixed)})[0].startswith(
        "10.0.0.2: train shards of 2 different sets (-of-00004 and -of-00008)"
    )
    # the user's own TFRecords, whole, without dataset.json: accepted as before
    assert nodes.data_problems({"10.0.0.2": _out(_whole())}) == []
    assert nodes.data_problems({"10.0.0.2": _out({"train-a": 1, "train-b.tmp": 1})}) == []


def test_the_other_refusals_are_kept():
    good = {"10.0.0.2": _out(_whole(), meta=_meta())}
    assert nodes.data_problems({**good, "10.0.0.4": "missing\n"}) == ["10.0.0.4: no such folder"]
    assert nodes.data_problems({**good, "10.0.0.4": _out({"validation-x": 3})}) == ["10.0.0.4: no train-* shards"]
    assert nodes.data_problems({**good, "10.0.0.4": _out(_whole(), "unverified", _meta())}) == [
        "10.0.0.4: not verified by `clusterctl sync` (no completion marker)"
    ]
    assert nodes.data_problems({**good, "10.0.0.4": None}) == ["10.0.0.4: could not check (unreachable)"]
    assert nodes.data_problems({**good, "10.0.0.4": _out(_whole(), MARKER % "bb", _meta())}) == [
        "10.0.0.4: a different dataset than 10.0.0.2 (another manifest)"
    ]
    assert nodes.data_problems({"10.0.0.4": _out(_whole(), meta="{not json")}) == ["10.0.0.4: unreadable dataset.json"]
    assert nodes.data_check_command("/data/my set").startswith("cd '/data/my set' ")
