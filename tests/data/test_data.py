"""The dataset format (node/dataset/, through clusterctl.data.tfrecords) and `clusterctl data`: folders of images
and generated sets -> ImageNet-format TFRecords, read back by the trainer's own input pipeline
(clusterctl/node/train/data.py: its parse_record, records, eval_dataset and train_dataset functions), so writer
and reader cannot drift apart."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from clusterctl.data import tfrecords as data
from conftest import REPO
from workload_support import imagenet_layout

FEATURES = (
    "image/height",
    "image/width",
    "image/colorspace",
    "image/channels",
    "image/class/label",
    "image/class/synset",
    "image/class/text",
    "image/format",
    "image/filename",
    "image/encoded",
)


@pytest.fixture(scope="module")
def tf():
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow

    return tensorflow


@pytest.fixture(scope="module")
def trainer():
    """The trainer's input pipeline (clusterctl/node/train/data.py: it imports TensorFlow only inside its functions)."""
    from clusterctl.node.train import data

    return data


def read_examples(tf, paths) -> list[dict]:
    out = []
    for rec in tf.data.TFRecordDataset([str(p) for p in paths]):
        ex = tf.train.Example.FromString(rec.numpy())
        f = ex.features.feature
        row = {}
        for k, v in f.items():
            kind = v.WhichOneof("kind")
            vals = list(getattr(v, kind).value)
            row[k] = vals[0] if len(vals) == 1 else vals
        out.append(row)
    return out


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_HOME": str(cwd / "cchome"), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "clusterctl", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


# ---- a folder of images -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def image_folder(tmp_path_factory, tf):
    """The flowers layout: three class folders with RGB JPEGs, an RGBA PNG, a grayscale JPEG, a broken
    .jpg and a LICENSE.txt; returns (folder, {filename: (class, pixels or None)})."""
    import numpy as np

    root = tmp_path_factory.mktemp("flowers")
    rng = np.random.default_rng(7)
    made: dict[str, tuple[str, object]] = {}
    for cls in ("tulips", "daisy", "roses"):  # not in sorted order on purpose
        d = root / cls
        d.mkdir()
        for i in range(5):
            h, w = int(rng.integers(20, 40)), int(rng.integers(20, 40))
            px = rng.integers(0, 255, size=(h, w, 3), dtype=np.uint8)
            name = f"{cls}_{i}.jpg"
            (d / name).write_bytes(tf.io.encode_jpeg(px, quality=95).numpy())
            made[name] = (cls, None)
    # smooth, so JPEG keeps it close (JPEG on white noise would not be)
    yy, xx = np.mgrid[0:24, 0:30]
    rgba = np.stack([xx * 8, yy * 10, (xx + yy) * 4, np.full_like(xx, 128)], -1).astype(np.uint8)
    (root / "roses" / "rose_alpha.PNG").write_bytes(tf.io.encode_png(rgba).numpy())
    made["rose_alpha.PNG"] = ("roses", rgba[..., :3])
    gray = rng.integers(0, 255, size=(26, 22, 1), dtype=np.uint8)
    (root / "daisy" / "daisy_gray.jpeg").write_bytes(tf.io.encode_jpeg(gray, quality=95).numpy())
    made["daisy_gray.jpeg"] = ("daisy", None)
    (root / "daisy" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 this is not a whole jpeg")
    (root / "LICENSE.txt").write_text("CC-BY\n")
    (root / "tulips" / "notes.txt").write_text("not an image\n")
    return root, made


def test_folder_to_tfrecords_through_the_cli_and_read_back(image_folder, tmp_path, tf):
    src, made = image_folder
    dst = tmp_path / "records"
    proc = cli(
        "data",
        "tfrecords",
        str(src),
        str(dst),
        "--validation-fraction",
        "0.2",
        "--train-shards",
        "3",
        "--validation-shards",
        "2",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "skipped" in proc.stderr and "broken.jpg" in proc.stderr
    assert "re-encoded" in proc.stderr  # the PNG and the grayscale JPEG

    names = sorted(p.name for p in dst.iterdir())
    assert names == [
        "dataset.json",
        "labels.txt",
        "train-00000-of-00003",
        "train-00001-of-00003",
        "train-00002-of-00003",
        "validation-00000-of-00002",
        "validation-00001-of-00002",
    ]
    # Classes in sorted folder order, label N on line N (1-based as ImageNet's records).
    assert (dst / "labels.txt").read_text() == "daisy\nroses\ntulips\n"
    label_of = {"daisy": 1, "roses": 2, "tulips": 3}

    rows = read_examples(tf, sorted(dst.glob("train-*")) + sorted(dst.glob("validation-*")))
    by_name = {r["image/filename"].decode(): r for r in rows}
    # Every readable image once, the broken one nowhere, the text files nowhere.
    assert sorted(by_name) == sorted(made) and len(rows) == len(made)
    for name, r in by_name.items():
        cls, pixels = made[name]
        assert set(FEATURES) <= set(r), name
        assert r["image/class/label"] == label_of[cls]
        assert r["image/class/synset"].decode() == cls == r["image/class/text"].decode()
        assert (r["image/format"], r["image/colorspace"], r["image/channels"]) == (b"JPEG", b"RGB", 3)
        img = tf.io.decode_jpeg(r["image/encoded"]).numpy()
        assert img.shape == (r["image/height"], r["image/width"], 3), name
        source = (src / cls / name).read_bytes()
        if name.endswith(".jpg"):
            assert r["image/encoded"] == source, f"{name}: an RGB JPEG must be kept byte for byte"
        if pixels is not None:  # the PNG: same picture, through JPEG at quality 95
            assert abs(img.astype(int) - pixels.astype(int)).mean() < 12

    meta = json.loads((dst / "dataset.json").read_text())
    assert meta["format"] == "imagenet-tfrecord" and meta["label_base"] == 1 and meta["num_classes"] == 3
    counts = {
        s: sum(1 for _ in tf.data.TFRecordDataset([str(dst / f) for f in meta["splits"][s]["shards"]]))
        for s in ("train", "validation")
    }
    assert counts == {s: meta["splits"][s]["examples"] for s in counts}
    assert counts["validation"] >= 3  # at least one image of every class held out
    info = data.read_info(dst)
    assert info.classes == ("daisy", "roses", "tulips") and info.bytes == sum(
        (dst / f).stat().st_size for f in info.files()
    )


def test_the_trainers_pipeline_reads_what_the_writer_wrote(tmp_path, tf, trainer):
    from clusterctl.node.train.options import parse_args

    info = data.write_synthetic(
        tmp_path / "ds", images=60, classes=6, validation_images=30, image_size=40, train_shards=3, validation_shards=2
    )
    ds = tmp_path / "ds"
    # The trainer's defaults for this folder: classes from dataset.json, labels 1-based.
    meta = trainer.dataset_meta(str(ds))
    assert meta["num_classes"] == 6 and meta["splits"]["train"]["examples"] == 60
    args = parse_args(["--data", str(ds), "--model", "tiny", "--batch-size", "4", "--shuffle-buffer", "8"])
    assert args.label_offset == 1 and args.image_size == 32

    val_files = trainer.data_files(str(ds), "validation")
    assert [Path(f).name for f in val_files] == list(info.splits["validation"].shards)
    # parse_record: the 0-based labels the model trains on, from the 1-based records
    written = [(r["image/filename"].decode(), r["image/class/label"]) for r in read_examples(tf, val_files)]
    parsed = [
        (int(label), enc.numpy())
        for enc, label, _ in tf.data.TFRecordDataset(val_files).map(
            lambda s: trainer.parse_record(tf, s, args.label_offset)
        )
    ]
    assert [lab for lab, _ in parsed] == [lab - 1 for _, lab in written]
    assert Counter(lab for lab, _ in parsed) == Counter({k: 5 for k in range(6)})

    # Evaluation: every record seen by exactly one rank, for 2 ranks over 2 files and 3 ranks over 2 files
    for size in (1, 2, 3):
        seen = []
        for rank in range(size):
            recs = trainer.records(tf, val_files, rank, size, training=False, seed=0)
            seen += [
                tf.train.Example.FromString(r.numpy()).features.feature["image/filename"].bytes_list.value[0]
                for r in recs
            ]
        assert sorted(seen) == sorted(n.encode() for n, _ in written), f"size {size}"
    labels_seen = []
    for rank in range(2):
        for images, labels in trainer.eval_dataset(tf, args, val_files, rank, 2):
            assert images.shape[1:] == (32, 32, 3) and images.dtype == tf.uint8  # normalised on the device
            labels_seen += labels.numpy().tolist()
    assert Counter(labels_seen) == Counter({k: 5 for k in range(6)})

    # Training batches: augmented, uint8 (the model normalises them on the device), fixed shape, labels in
    # range; repeats past one epoch.
    train_files = trainer.data_files(str(ds), "train")
    batches = list(trainer.train_dataset(tf, args, train_files, 0, 2, seed=1).take(12))  # > 30 records/rank
    assert all(b[0].shape == (4, 32, 32, 3) for b in batches)
    labels = [int(x) for b in batches for x in b[1].numpy()]
    assert set(labels) <= set(range(6)) and len(set(labels)) >= 4
    assert all(b[0].dtype == tf.uint8 for b in batches)
    pixels = trainer.normalize(tf, tf.concat([b[0] for b in batches], 0))  # as the model's first step does
    assert -3.0 < float(tf.reduce_mean(pixels)) < 3.0 and float(tf.math.reduce_std(pixels)) > 0.1


def test_synthetic_is_deterministic_balanced_and_manifest_friendly(tmp_path, tf):
    a = data.write_synthetic(tmp_path / "a", images=40, classes=4, image_size=16, seed=3, workers=2)
    data.write_synthetic(tmp_path / "b", images=40, classes=4, image_size=16, seed=3, workers=1)

    def digest(root: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}

    # Same input and seed -> the same bytes, whatever the threads did: a manifest of it is stable.
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")], "temporary files left"
    assert a.splits["train"].examples == 40 and a.splits["validation"].examples == 8
    rows = read_examples(tf, [tmp_path / "a" / s for s in a.splits["train"].shards])
    assert Counter(r["image/class/label"] for r in rows) == Counter({1: 10, 2: 10, 3: 10, 4: 10})
    assert {(r["image/height"], r["image/width"]) for r in rows} == {(16, 16)}
    c = data.write_synthetic(tmp_path / "c", images=40, classes=4, image_size=16, seed=4)
    assert digest(tmp_path / "c") != digest(tmp_path / "a")
    assert c.classes == ("class_000", "class_001", "class_002", "class_003")


def test_presplit_folder_keeps_its_split(tmp_path, tf):
    import numpy as np

    for split, n in (("train", 3), ("val", 2)):
        for cls in ("cat", "dog"):
            d = tmp_path / "src" / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                px = np.full((12, 12, 3), 40 * i, dtype=np.uint8)
                (d / f"{split}_{cls}_{i}.jpg").write_bytes(tf.io.encode_jpeg(px).numpy())
    info = data.convert_folder(tmp_path / "src", tmp_path / "out")
    assert info.classes == ("cat", "dog")
    assert (info.splits["train"].examples, info.splits["validation"].examples) == (6, 4)
    val = read_examples(tf, [tmp_path / "out" / s for s in info.splits["validation"].shards])
    assert all(r["image/filename"].startswith(b"val_") for r in val)


def test_refusals_and_no_half_written_dataset(tmp_path, image_folder):
    src, _ = image_folder
    dst = tmp_path / "d"
    data.write_synthetic(dst, images=10, classes=2, image_size=8)
    before = sorted(p.name for p in dst.iterdir())
    proc = cli("data", "synthetic", str(dst), "--images", "10", "--classes", "2", cwd=tmp_path)
    assert proc.returncode == 3 and "already holds a dataset" in proc.stderr and "--force" in proc.stderr
    assert sorted(p.name for p in dst.iterdir()) == before
    proc = cli(
        "data", "synthetic", str(dst), "--images", "12", "--classes", "3", "--image-size", "8", "--force", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads((dst / "dataset.json").read_text())["num_classes"] == 3
    assert not [p for p in dst.iterdir() if p.name.startswith(".")]

    proc = cli("data", "tfrecords", str(tmp_path / "missing"), str(tmp_path / "x"), cwd=tmp_path)
    assert proc.returncode == 3 and proc.stderr.startswith("Error: ") and "no such folder" in proc.stderr
    empty = tmp_path / "empty"
    (empty / "cls").mkdir(parents=True)
    (empty / "cls" / "readme.txt").write_text("x")
    proc = cli("data", "tfrecords", str(empty), str(tmp_path / "y"), cwd=tmp_path)
    assert proc.returncode == 3 and "no class sub-folders with JPEG or PNG images" in proc.stderr
    proc = cli("data", "synthetic", str(tmp_path / "z"), "--images", "2", "--classes", "5", cwd=tmp_path)
    assert proc.returncode == 3 and "fewer than --classes" in proc.stderr
    proc = cli("data", "tfrecords", str(src), str(tmp_path / "w"), "--train-shards", "0", cwd=tmp_path)
    assert proc.returncode == 2 and "--train-shards must be at least 1" in proc.stderr


def test_pure_helpers_and_no_tensorflow_at_import():
    from clusterctl.node.dataset import tfrecords as records

    assert records.shard_name("train", 7, 1024) == "train-00007-of-01024"
    # ImageNet's own shard counts for its sizes; small sets still get a few shards
    assert records.default_shards("train", 1281167) == 1024 and records.default_shards("validation", 50000) == 128
    assert records.default_shards("train", 100) == 8 and records.default_shards("validation", 2) == 2
    assert records.default_shards("validation", 0) == 0
    assert records.deal(list(range(7)), 3) == [[0, 3, 6], [1, 4], [2, 5]]
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, clusterctl.data.tfrecords, clusterctl.node.dataset.convert, clusterctl.workloads.train.start, "
            "clusterctl.cli.app; "
            "print(sorted(m for m in ('tensorflow', 'numpy', 'horovod') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() == "[]"


# ---- ImageNet's flat val/ ---------------------------------------------------------------------------
def test_flat_val_folder_with_labels_csv_or_devkit_ground_truth(tmp_path, tf):
    src = tmp_path / "imagenet"
    truth = imagenet_layout(src, tf)

    # before: the 7 validation images were dropped without a word; now it is a one-line error
    proc = cli("data", "tfrecords", str(src), str(tmp_path / "none"), cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"Error: {src / 'val'} holds 7 images without class sub-folders: give their classes with --val-labels "
        "LOC_val_solution.csv (or the devkit's ground truth with --val-synsets)"
    ]
    assert not (tmp_path / "none").exists()

    # LOC_val_solution.csv: ImageId,PredictionString (synset x y x y, maybe several boxes), rows in any order
    csv = tmp_path / "LOC_val_solution.csv"
    rows = [f"{stem},{s} 10 20 100 200 {s} 1 2 3 4" for stem, s in sorted(truth.items(), reverse=True)]
    csv.write_text("ImageId,PredictionString\n" + "\n".join(rows) + "\n")
    proc = cli("data", "tfrecords", str(src), str(tmp_path / "a"), "--val-labels", str(csv), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    labels = ("n01440764", "n01443537", "n02119789")
    for out in ("a",):
        info = data.read_info(tmp_path / out)
        assert info.splits["validation"].examples == 7 and info.splits["train"].examples == 6
        val = read_examples(tf, [tmp_path / out / s for s in info.splits["validation"].shards])
        got = {
            r["image/filename"].decode().rsplit(".", 1)[0]: (r["image/class/synset"].decode(), r["image/class/label"])
            for r in val
        }
        assert got == {stem: (s, labels.index(s) + 1) for stem, s in truth.items()}

    # the devkit: ground truth (line N = class ID of image N) + its synset list in ID order (not sorted)
    id_order = ["n02119789 kit fox, Vulpes macrotis", "n01443537 goldfish", "n01440764 tench"]
    (tmp_path / "synsets.txt").write_text("\n".join(id_order) + "\n")
    ids = [str([s.split()[0] for s in id_order].index(truth[f"ILSVRC2012_val_{n:08d}"]) + 1) for n in range(1, 8)]
    (tmp_path / "gt.txt").write_text("\n".join(ids) + "\n")
    info = data.convert_folder(
        src, tmp_path / "b", val_labels=tmp_path / "gt.txt", val_synsets=tmp_path / "synsets.txt"
    )
    val = read_examples(tf, [tmp_path / "b" / s for s in info.splits["validation"].shards])
    assert {r["image/filename"].decode().rsplit(".", 1)[0]: r["image/class/synset"].decode() for r in val} == truth

    # one-line errors, nothing written: anything else, a devkit file without its synsets, an unlabelled image
    bad = tmp_path / "labels.json"
    bad.write_text('{"ILSVRC2012_val_00000001": "n01440764"}\n')
    for args, message in (
        (
            ("--val-labels", str(bad)),
            "neither a LOC_val_solution.csv-style CSV (ImageId,PredictionString) nor the devkit's ground truth",
        ),
        (
            ("--val-labels", str(tmp_path / "gt.txt")),
            "is the devkit's ground truth (class IDs): it needs the synset list: give --val-synsets FILE too",
        ),
        (("--val-synsets", str(tmp_path / "synsets.txt")), "--val-synsets goes with --val-labels"),
    ):
        proc = cli("data", "tfrecords", str(src), str(tmp_path / "c"), *args, cwd=tmp_path)
        assert proc.returncode == 3 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert message in proc.stderr and proc.stderr.startswith("Error: "), proc.stderr
    csv.write_text("ImageId,PredictionString\n" + "\n".join(rows[1:]) + "\n")  # one image left without a class
    proc = cli("data", "tfrecords", str(src), str(tmp_path / "c"), "--val-labels", str(csv), cwd=tmp_path)
    assert proc.returncode == 3 and "1 of the 7 images in" in proc.stderr and "have no class in" in proc.stderr
    assert not (tmp_path / "c").exists()


# ---- `data tfrecords --on leader`: the node package's converter ----------------------------------------------
def test_the_converter_runs_from_the_node_package_and_its_lines_are_read_back(image_folder, tmp_path):
    """`python PYZ tfrecords SRC DST` (the leader's command, here with this venv as the node runtime): its
    result line read back as the DatasetInfo a conversion here gives; a refusal is its error line, exit 3,
    raised here as the same one-line ConfigError."""
    from clusterctl.data import tfrecords_leader
    from clusterctl.errors import ConfigError
    from conftest import node_pyz

    src, _ = image_folder
    argv = tfrecords_leader.leader_argv(sys.executable, node_pyz(), str(src), str(tmp_path / "leader"), seed=3)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = tfrecords_leader.parse_leader_result(proc.stdout)
    here = data.convert_folder(src, tmp_path / "here", seed=3)

    def shards(info):
        return {k: (v.examples, v.shards) for k, v in info.splits.items()}

    assert (got.classes, shards(got), got.skipped) == (here.classes, shards(here), here.skipped)
    assert got.path == tmp_path / "leader" and got.reencoded == here.reencoded == 2

    refused = subprocess.run(argv, capture_output=True, text=True, timeout=300)  # DST holds a dataset now
    assert refused.returncode == 3 and "CLUSTERCTL-DATA-ERROR " in refused.stdout, refused.stdout + refused.stderr
    with pytest.raises(ConfigError, match="already holds a dataset") as err:
        tfrecords_leader.parse_leader_result(refused.stdout)
    assert err.value.hint == "pass --force to replace it"
