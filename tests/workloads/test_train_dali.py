"""clusterctl/node/train/dali.py: DALI's pipelines (its CPU backend here) against data.py's tf.data ones on the
same records: evaluation batches equal to within JPEG decoder rounding, labels and shapes always equal, every
record of the validation set read exactly once across ranks; the training batches' shapes, labels and crops;
the index files DALI's reader needs, written as DALI's tfrecord2idx writes them."""

from __future__ import annotations

import json
import os
import struct
import subprocess

import pytest

from clusterctl.node.train import dali
from conftest import REPO, TRAIN_PY as PY

# Mean and largest absolute difference per 8-bit channel value allowed between DALI's and tf.data's centre
# crops. Both decode with libjpeg-turbo but not with the same IDCT and chroma upsampling, and both resize
# bilinearly from the decoded pixels; measured here: mean 0.93, largest 4 on these images.
MEAN_TOLERANCE = 1.5
MAX_TOLERANCE = 12

SCRIPT = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
sys.path.insert(0, sys.argv[1])
import numpy as np
import tensorflow as tf
from clusterctl.node.dataset import synthetic, tfrecords
from clusterctl.node.train import dali, data, options

out_dir = sys.argv[2]
rng = np.random.default_rng(5)
# Images of several shapes (landscape, portrait, square, odd sides), so the crop's offsets are exercised.
sizes = [(96, 72), (64, 120), (80, 80), (57, 91), (121, 67)]
for split, shards, count in (("train", 3, 30), ("validation", 3, 23)):
    for s in range(shards):
        name = os.path.join(out_dir, tfrecords.shard_name(split, s, shards))
        with tf.io.TFRecordWriter(name) as w:
            for i in range(s, count, shards):
                h, wd = sizes[i % len(sizes)]
                label = 1 + i % 4
                px = synthetic.synthetic_pixels(label, 4, max(h, wd), rng)[:h, :wd]
                jpeg = tf.io.encode_jpeg(px, quality=90).numpy()
                w.write(tfrecords.example_bytes(tf, encoded=jpeg, label=label, synset="s", text="t",
                                                filename=f"{i}.jpg", height=h, width=wd))
args = options.parse_args(["--data", out_dir, "--model", "tiny", "--batch-size", "4", "--image-size", "40",
                           "--eval-batch-size", "5", "--shuffle-buffer", "8"])
val = data.data_files(out_dir, "validation")
plugin = dali.plugin_available
reports = {}
for mode in ("plugin", "generator"):
    # generator: DALI without its TensorFlow plugin, batches through tf.data.Dataset.from_generator
    dali.plugin_available = plugin if mode == "plugin" else (lambda: False)
    report = reports[mode] = {"plugin": dali.plugin_available()}
    # One rank, records in file order on both sides (tf.data reads one file at a time with one thread).
    a = list(data.eval_dataset(tf, args, val, 0, 1, threads=1))
    b = list(dali.eval_dataset(tf, args, val, 0, 1, threads=1, device_id=None))
    xa = np.concatenate([x.numpy() for x, _ in a]).astype(np.int32)
    xb = np.concatenate([x.numpy() for x, _ in b]).astype(np.int32)
    report["eval"] = dict(
        shapes_a=[list(x.shape) for x, _ in a], shapes_b=[list(x.shape) for x, _ in b],
        labels_a=np.concatenate([y.numpy() for _, y in a]).tolist(),
        labels_b=np.concatenate([y.numpy() for _, y in b]).tolist(),
        dtype_b=[str(x.dtype.name) for x, _ in b][0], label_dtype_b=[str(y.dtype.name) for _, y in b][0],
        mean=float(np.abs(xa - xb).mean()), max=int(np.abs(xa - xb).max()),
    )
    # Three ranks: every record once, whichever rank reads it.
    seen = []
    for rank in range(3):
        seen += [int(v) for _, y in dali.eval_dataset(tf, args, val, rank, 3, threads=1, device_id=None) for v in y.numpy()]
    report["ranks"] = sorted(seen)
    # Training: endless batches of the right shapes and labels; random crops (not the eval's centre crop).
    tr = dali.train_dataset(tf, args, data.data_files(out_dir, "train"), 0, 2, 7, 1, None)
    batches = [(x.numpy(), y.numpy()) for x, y in tr.take(12)]
    report["train"] = dict(
        shapes=sorted({str(x.shape) for x, _ in batches}), dtype=str(batches[0][0].dtype),
        labels=sorted({int(v) for _, y in batches for v in y}),
        distinct=len({x.tobytes() for x, _ in batches}),
    )
print("REPORT " + json.dumps(reports))
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict:
    """Both ways into TensorFlow, on one set of records, in one process (TensorFlow starts once)."""
    folder = tmp_path_factory.mktemp("records")
    proc = subprocess.run([PY, "-c", SCRIPT, str(REPO), str(folder)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))
    return json.loads(line[len("REPORT ") :])


@pytest.mark.integration  # TensorFlow and DALI in a subprocess: about 30 s
@pytest.mark.parametrize("mode", ["plugin", "generator"])
def test_dali_eval_batches_equal_tf_data_within_decoder_rounding(reports, mode):
    r = reports[mode]
    assert r["plugin"] is (mode == "plugin")  # the plugin loads here (built against this TensorFlow)
    e = r["eval"]
    assert e["shapes_a"] == e["shapes_b"] == [[5, 40, 40, 3]] * 4 + [[3, 40, 40, 3]]
    assert (
        e["labels_a"]
        == e["labels_b"]
        == [i % 4 for i in range(0, 23, 3)] + [i % 4 for i in range(1, 23, 3)] + [i % 4 for i in range(2, 23, 3)]
    )
    assert (e["dtype_b"], e["label_dtype_b"]) == ("uint8", "int32")
    print(f"\n{mode}: DALI's centre crops against tf.data's: mean |difference| {e['mean']:.2f}, largest {e['max']}")
    assert e["mean"] <= MEAN_TOLERANCE and e["max"] <= MAX_TOLERANCE, e
    assert r["ranks"] == sorted(e["labels_a"])  # 23 records over 3 ranks: each read once
    t = r["train"]
    assert t["shapes"] == ["(4, 40, 40, 3)"] and t["dtype"] == "uint8"
    assert t["labels"] == [0, 1, 2, 3] and t["distinct"] == 12


def _records(path, payloads):
    with open(path, "wb") as f:
        for p in payloads:
            f.write(struct.pack("<Q", len(p)) + b"\0" * 4 + p + b"\0" * 4)


def test_index_lines_are_offset_and_length_of_every_record(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    _records(data / "train-00000-of-00001", [b"a" * 5, b"", b"b" * 300])
    (idx,) = dali.index_files([str(data / "train-00000-of-00001")])
    assert idx == str(data / ".dali-index" / "train-00000-of-00001.idx")
    assert open(idx).read() == "0 21\n21 16\n37 316\n"
    assert dali.count_indexed([idx]) == 3
    # A record file newer than its index gets a new one.
    _records(data / "train-00000-of-00001", [b"c" * 7])
    os.utime(idx, (1, 1))
    dali.index_files([str(data / "train-00000-of-00001")])
    assert open(idx).read() == "0 23\n"


def test_a_truncated_record_file_is_refused(tmp_path):
    path = tmp_path / "train-00000-of-00001"
    _records(path, [b"x" * 10])
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(ValueError, match="runs past the end"):
        dali.index_files([str(path)])


def test_read_only_data_gets_its_index_in_the_temporary_folder(tmp_path, monkeypatch):
    data = tmp_path / "ro"
    data.mkdir()
    _records(data / "validation-00000-of-00001", [b"z"])
    monkeypatch.setattr(dali.tempfile, "gettempdir", lambda: str(tmp_path / "tmp"))
    monkeypatch.setattr(dali.os, "access", lambda path, mode: not str(path).startswith(str(data)))
    (idx,) = dali.index_files([str(data / "validation-00000-of-00001")])
    assert idx.startswith(str(tmp_path / "tmp" / "clusterctl-dali-index")) and open(idx).read() == "0 17\n"


def test_shards_are_contiguous_and_cover_every_record():
    assert [dali.shard_range(23, r, 3) for r in range(3)] == [(0, 7), (7, 15), (15, 23)]
    assert [dali.shard_range(2, r, 4) for r in range(4)] == [(0, 0), (0, 1), (1, 1), (1, 2)]


# ---- --input: the choice before the launch, and the flag to the trainer ------------------------------------
def _feed(per_core: float):
    from clusterctl.workloads.train import feed as train_feed

    return train_feed.feed(8, 8 * per_core, 4, "V100")  # 4 x 1,270 = 5,080 img/s needed


def test_auto_picks_dali_only_when_gpus_are_there_and_the_measured_feed_is_below_demand():
    from clusterctl.workloads.train.feed import choose_input

    starved = choose_input("auto", _feed(300.0), 4, "/data")  # 2,400 img/s for 5,080
    assert starved.input == "dali"
    assert starved.line() == "input: DALI (auto: 2,400 img/s from the CPUs for 5,080 needed; DALI decodes on the GPUs)"
    fed = choose_input(None, _feed(700.0), 4, "/data")
    assert fed.input == "tfdata" and fed.line() == "input: tf.data (auto: 5,600 img/s from the CPUs for 5,080 needed)"
    assert choose_input("auto", None, 4, "/data").input == "tfdata"  # not measured: the CPUs, as before
    own = choose_input("auto", _feed(300.0), 4, "/data", dali_installed=False)  # `up --python`, a hosts file
    assert own.input == "tfdata" and own.line().endswith("but the nodes' own Python has none)")
    assert choose_input("auto", _feed(300.0), 0, "/data").input == "tfdata"  # no GPUs to decode on
    assert choose_input("auto", None, 4, None).input == "tfdata"  # synthetic
    asked = choose_input("dali", _feed(900.0), 0, "/data")
    assert asked.input == "dali" and "CPU backend" in asked.line()
    assert choose_input("tfdata", _feed(100.0), 4, "/data").input == "tfdata"


def test_input_reaches_the_trainer_and_auto_never_does(monkeypatch):
    from clusterctl.errors import UsageError
    from clusterctl.node.train import options as trainer
    from clusterctl.workloads.train.options import TrainOptions, trainer_argv

    monkeypatch.setattr(trainer, "_has_dali", lambda: True)  # as on a node whose runtime has DALI

    argv = trainer_argv("py", "pkg", TrainOptions(data="/d", input="dali"))
    assert argv[argv.index("--input") + 1] == "dali"
    assert trainer.parse_args(argv[3:]).input == "dali"
    assert "--input" not in trainer_argv("py", "pkg", TrainOptions(data="/d", input="auto"))
    assert trainer.parse_args(["--data", "/d"]).input == "tfdata"
    with pytest.raises(UsageError, match="unknown input 'gpu'"):
        TrainOptions(data="/d", input="gpu")
    with pytest.raises(UsageError, match="--input dali decodes records"):
        TrainOptions(synthetic=True, input="dali")
    with pytest.raises(SystemExit):
        trainer.parse_args(["--synthetic", "--input", "dali"])


def test_the_trainer_refuses_input_dali_where_dali_is_not_installed(tmp_path):
    """A Python without DALI (here: the import system told that no `nvidia` package exists) stops at the flags,
    exit 2, with the way to a runtime that has it."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); sys.modules['nvidia'] = None\n"
        "from clusterctl.node.train import options\n"
        "options.parse_args(['--data', '/d', '--input', 'dali'])\n"
    )
    proc = subprocess.run([PY, "-c", code, str(REPO)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "--input dali: NVIDIA DALI is not installed in this Python" in proc.stderr
    assert "clusterctl up --runtime dali" in proc.stderr


def test_dali_decodes_on_the_gpu_tensorflow_left_the_rank():
    from types import SimpleNamespace

    assert dali.device_id([SimpleNamespace(name="/physical_device:GPU:3")]) == 3  # local rank 3 of 8
    assert dali.device_id([]) is None  # the CPU: DALI's CPU backend
