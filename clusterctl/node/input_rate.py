"""`python PYZ input_rate --data RECORDS`: the training input pipeline's rate on one CPU core: JPEG decode, random
crop, resize, flip, normalise and batch, exactly as the trainer (node/train/data.py) feeds its model, on the
TFRecords in RECORDS.

`clusterctl train` runs it on the leader before a GPU run (workloads/train_job.py's feed_warning);
bench/input_pipeline.py runs it on this machine. The whole process is pinned to one core and the pipeline given
one thread, so the figure is what one core decodes; a node's cores scale it (decoding is embarrassingly
parallel across the trainer's input threads).

Prints one line, `input-rate per_core=<img/s> cpus=<cores this process may use> images=<timed>`; exit 0.
"""

from __future__ import annotations

import argparse
import glob
import os
import time

from clusterctl.node.train import data as pipeline, options

DESCRIPTION = "The training input pipeline's rate on one CPU core, on the trainer's own pipeline."


def pin_to_one_core() -> int:
    """Pin this process to one of the cores it may use; the node's count of them (before pinning)."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[-1]})
    return len(cores)


def measure(data: str, images: int, batch: int, image_size: int) -> float:
    """Images per second through the trainer's own training pipeline on one thread, after one warm-up batch."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf  # the node runtime's

    files = sorted(glob.glob(os.path.join(data, "train-*")))
    if not files:
        raise SystemExit(f"input-rate: no train-* files in {data}")
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    args = options.parse_args(
        ["--data", data, "--batch-size", str(batch), "--image-size", str(image_size), "--shuffle-buffer", "64"]
    )
    ds = pipeline.train_dataset(tf, args, files, 0, 1, seed=pipeline.data_seed(args.seed, 0, 0), threads=1)
    it = iter(ds)
    next(it)  # warm-up: the graph traced, the shuffle buffer filled
    steps = max(1, images // batch)
    t0 = time.perf_counter()
    for _ in range(steps):
        next(it)
    return steps * batch / (time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="input_rate", description=DESCRIPTION)
    p.add_argument("--data", required=True, help="a folder of train-* TFRecord shards")
    p.add_argument("--images", type=int, default=1024, help="images timed (after a warm-up batch)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--image-size", type=int, default=224)
    a = p.parse_args(argv)
    cpus = pin_to_one_core()
    rate = measure(a.data, a.images, a.batch_size, a.image_size)
    print(f"input-rate per_core={rate:.1f} cpus={cpus} images={max(1, a.images // a.batch_size) * a.batch_size}")
    return 0
