#!/usr/bin/env python3
"""Can the CPUs feed the GPUs? The training input pipeline's rate per physical core here, with every hardware
thread busy, and what it means per type.

No arguments; one to two minutes on a 2-core machine. It makes ImageNet-sized JPEGs (500x375, quality 90, about
ImageNet's ~110 KB a file) in a temp folder, turns them into TFRecords the way `clusterctl data tfrecords`
does, and runs the node package's input_rate on them: the trainer's own pipeline (clusterctl/node/train/data.py's
train_dataset: decode, random crop, resize to 224, flip, batch) with as many threads as this machine has
hardware threads, so both threads of every core are busy, as in training; the rate per physical core is that
over the cores here. The same again on the images pre-resized to a shorter side of 256, the remedy `train`
suggests. Then, for every instance type of the catalog, its physical cores (DescribeInstanceTypes' DefaultCores,
clusterctl/providers/aws/catalog.py's CPUS) x that rate against its GPUs x NVIDIA's published ResNet-50 v1.5
img/s (clusterctl/workloads/train/feed.py), and the input path it would get.

    python bench/input_pipeline.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from clusterctl.providers.aws import catalog  # noqa: E402
from clusterctl.workloads.train import config as train_config, feed as train_feed  # noqa: E402

IMAGES = 192  # 6 classes x 32: the timed run reads them in a loop
CLASSES = 6
WIDTH, HEIGHT, QUALITY = 500, 375, 90  # ImageNet's typical landscape photo
SMALL_WIDTH, SMALL_HEIGHT = 341, 256  # the same, its shorter side resized to 256 (what the crops are taken from)


def make_jpegs(folder: Path, width: int, height: int) -> float:
    """IMAGES JPEG files in class folders: smooth random scenes with grain, so they decode like photographs
    (flat images decode several times faster). Returns their mean size in KB."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    total = 0
    for i in range(IMAGES):
        low = rng.uniform(0, 255, (12, 16, 3)).astype(np.float32)
        img = tf.image.resize(low[None], (height, width), method="bicubic")[0].numpy()
        img += rng.normal(0, 20, img.shape)
        data = tf.io.encode_jpeg(np.clip(img, 0, 255).astype(np.uint8), quality=QUALITY).numpy()
        path = folder / f"class_{i % CLASSES}" / f"img_{i:05d}.JPEG"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        total += len(data)
    return total / IMAGES / 1024


def node_rate(records: Path) -> train_feed.Probe:
    """The node package's input_rate in its own process: one pipeline with every hardware thread here."""
    probe = ["input_rate", "--ranks", "1", "--seconds", "10", "--", "--data", str(records), "--batch-size", "32"]
    out = subprocess.run(
        [sys.executable, "-m", "clusterctl.node", *probe],
        cwd=REPO,  # this checkout's clusterctl
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    parsed = train_feed.parse_probe(out)
    if parsed is None:
        sys.exit(f"input_rate printed no rate: {out!r}")
    return parsed


def main() -> int:
    t0 = time.monotonic()
    from clusterctl.data import tfrecords

    rates: dict[int, train_feed.Probe] = {}
    sizes: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="input-pipeline-") as tmp:
        # ImageNet-sized, and the same scenes pre-resized to a shorter side of 256 (the advice's effect).
        for width, height in ((WIDTH, HEIGHT), (SMALL_WIDTH, SMALL_HEIGHT)):
            jpegs, records = Path(tmp) / f"jpegs-{width}", Path(tmp) / f"records-{width}"
            sizes[width] = make_jpegs(jpegs, width, height)
            tfrecords.convert_folder(jpegs, records, train_shards=4, validation_shards=1, validation_fraction=0.05)
            rates[width] = node_rate(records)
    here = rates[WIDTH]
    print(
        f"{IMAGES} JPEGs of {WIDTH}x{HEIGHT} at quality {QUALITY}, {sizes[WIDTH]:.0f} KB on average; "
        f"{here.cores} physical cores, {here.cpus} hardware threads here, all of them busy"
    )
    print(f"input pipeline: {here.images_per_sec:.0f} img/s here, {here.per_core:.0f} img/s per physical core")
    small = rates[SMALL_WIDTH]
    print(
        f"(pre-resized to {SMALL_WIDTH}x{SMALL_HEIGHT}, {sizes[SMALL_WIDTH]:.0f} KB: {small.per_core:.0f} img/s "
        f"per core, {small.per_core / here.per_core:.1f}x)"
    )
    print()
    header = (
        f"{'type':<15}{'GPUs':>10}{'cores':>7}{'x thr':>6}{'decoded img/s':>15}{'GPUs need':>11}{'feeds':>7}  input"
    )
    print(header)
    print("-" * len(header))
    starved = []
    for itype, cpus in catalog.CPUS.items():
        gpus = catalog.gpus(itype) or 0
        gpu = train_config.gpu_type(catalog.gpu_model_of(itype))  # the model the record would hold
        f = train_feed.feed(cpus.cores, cpus.cores * here.per_core, gpus, gpu)
        if f is None:
            continue
        path = f.path if not f.starves else f"{f.path} (GPUs wait)"
        print(
            f"{itype:<15}{f'{gpus} x {gpu}':>10}{cpus.cores:>7}{cpus.threads_per_core:>6}{f.supply:>15,.0f}"
            f"{f.demand:>11,.0f}{f.ratio:>7.0%}  {path}"
        )
        if f.starves:
            starved.append(itype)
    print()
    print("GPUs need: GPUs x their expected img/s (clusterctl/workloads/train/feed.py, with sources):")
    for gpu, e in train_feed.EXPECTED.items():
        print(f"  {gpu:<5} {e.per_gpu:>6,.0f} img/s  {e.source}")
    if starved:
        print(f"below 100%: the GPUs would wait for images on {', '.join(starved)}: {train_feed.ADVICE}")
    print(f"({time.monotonic() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
