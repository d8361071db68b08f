"""`data tfrecords --resize SIDE`: the remedy `train` names when the cores cannot feed the GPUs. Images whose
shorter side is longer than SIDE are scaled down to it (aspect kept) and re-encoded; the others are kept byte
for byte; the leader's converter gets the flag too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.data import tfrecords, tfrecords_leader
from clusterctl.errors import ConfigError
from conftest import REPO


def _examples(tf, paths) -> dict[str, tuple[int, int, bytes]]:
    out = {}
    for rec in tf.data.TFRecordDataset([str(p) for p in paths]):
        ex = tf.train.Example.FromString(rec.numpy()).features.feature
        name = ex["image/filename"].bytes_list.value[0].decode()
        h, w = ex["image/height"].int64_list.value[0], ex["image/width"].int64_list.value[0]
        out[name] = (h, w, ex["image/encoded"].bytes_list.value[0])
    return out


def test_resize_scales_the_shorter_side_down_and_keeps_small_images(tmp_path):
    import numpy as np
    import tensorflow as tf

    src = tmp_path / "src" / "cls"
    src.mkdir(parents=True)
    rng = np.random.default_rng(0)
    sizes = {"wide.jpg": (375, 500), "tall.jpg": (640, 480), "small.jpg": (200, 300)}
    raw = {}
    for name, (h, w) in sizes.items():
        raw[name] = tf.io.encode_jpeg(rng.integers(0, 255, (h, w, 3), dtype=np.uint8), quality=90).numpy()
        (src / name).write_bytes(raw[name])
    dst = tmp_path / "records"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterctl",
            "data",
            "tfrecords",
            str(src.parent),
            str(dst),
            "--resize",
            "256",
            "--validation-fraction",
            "0",
            "--train-shards",
            "1",
            "--validation-shards",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_HOME": str(tmp_path / "home")},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    got = _examples(tf, sorted(Path(dst).glob("train-*")))
    assert {n: hw[:2] for n, hw in got.items()} == {
        "wide.jpg": (256, 341),
        "tall.jpg": (341, 256),
        "small.jpg": (200, 300),
    }
    for h, w, data in got.values():
        assert tuple(tf.io.decode_jpeg(data).shape) == (h, w, 3)  # the header matches the pixels
    assert got["small.jpg"][2] == raw["small.jpg"]  # not touched
    with pytest.raises(ConfigError):
        tfrecords.convert_folder(src.parent, tmp_path / "bad", resize=8)


def test_the_leaders_converter_gets_the_flag():
    argv = tfrecords_leader.leader_argv("/py", "/pyz", "/src", "/dst", resize=256)
    assert argv[:5] == ["/py", "/pyz", "tfrecords", "/src", "/dst"] and argv[argv.index("--resize") + 1] == "256"
    assert "--resize" not in tfrecords_leader.leader_argv("/py", "/pyz", "/src", "/dst")
