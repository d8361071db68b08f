"""`python PYZ input_rate [--ranks R] [--seconds S] -- TRAINER_FLAGS`: what the trainer's input pipeline delivers
on this node with every rank's pipeline running at once.

R processes, one per rank this node runs, each the trainer's own training pipeline (node/train/data.py's
train_dataset: read, shuffle, JPEG decode, random crop, resize, flip, batch, built from the trainer's own flags)
at the thread count that rank gets in training (model.input_threads: the node's CPUs shared between its
ranks), timed together for S seconds once each has made its first batch. Every hardware thread of every core
is busy, as in training, so the figure is the node's own, not one thread's rate times a count of vCPUs (a
core's second hardware thread adds far less than a core).

`clusterctl train` runs it on the leader before a run with real records (workloads/train/start.py's feed_check);
bench/input_pipeline.py runs it on this machine. Only the shuffle buffer is smaller than the trainer's
(SHUFFLE_CAP records: it costs memory and start-up, not decoding).

Prints one line, `input-rate images_per_sec=<all ranks> ranks=R threads=<per rank> cores=<physical>
cpus=<logical> images=<timed>`; exit 0. Each program that reads it goes through workloads/train/feed.py's
parse_probe.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from typing import Any

from clusterctl.node.train import data as pipeline, options
from clusterctl.node.train.model import input_threads

DESCRIPTION = "The trainer's input pipeline timed on this node, every rank's pipeline at once."
SHUFFLE_CAP = 1024  # records in each timed pipeline's shuffle buffer
INPUT_PATH = "tf.data"  # the pipeline timed here (the trainer's CPU path)


def physical_cores(cpus: set[int]) -> int:
    """Distinct (package, core) pairs among `cpus`, from the kernel's topology; their count when it says nothing."""
    pairs = set()
    for cpu in cpus:
        topo = f"/sys/devices/system/cpu/cpu{cpu}/topology"
        try:
            with open(f"{topo}/physical_package_id") as f, open(f"{topo}/core_id") as g:
                pairs.add((f.read().strip(), g.read().strip()))
        except OSError:
            return len(cpus)
    return len(pairs) or len(cpus)


def _rank(args: argparse.Namespace, rank: int, ranks: int, threads: int, seconds: float, gate: Any, out: Any) -> None:
    """One rank's pipeline: its first batch (the graph traced, the shuffle buffer filled), everyone's, then
    batches for `seconds`; (images, seconds) to `out`."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the input pipeline runs on the CPU; the GPUs stay free
    import tensorflow as tf  # the node runtime's

    files = pipeline.data_files(args.data, "train")
    seed = pipeline.data_seed(args.seed, rank, 0)
    it = iter(pipeline.train_dataset(tf, args, files, rank, ranks, seed, threads=threads))
    next(it)
    gate.wait(timeout=600)
    images, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(it)
        images += args.batch_size
    out.put((images, time.perf_counter() - t0))


def measure(args: argparse.Namespace, ranks: int, threads: int, seconds: float) -> tuple[float, int]:
    """Images per second of `ranks` pipelines together, and the images timed. Forked before TensorFlow loads."""
    ctx = multiprocessing.get_context("fork")
    gate, out = ctx.Barrier(ranks), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(args, r, ranks, threads, seconds, gate, out)) for r in range(ranks)]
    for p in procs:
        p.start()
    results = [out.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    images = sum(n for n, _ in results)
    return images / max(t for _, t in results), images


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="input_rate", description=DESCRIPTION)
    p.add_argument("--ranks", type=int, default=1, help="pipelines at once: the ranks this node runs")
    p.add_argument("--seconds", type=float, default=10.0, help="time all of them together this long")
    p.add_argument("trainer", nargs=argparse.REMAINDER, help="-- then the trainer's flags (--data DIR ...)")
    a = p.parse_args(argv)
    flags = a.trainer[1:] if a.trainer[:1] == ["--"] else a.trainer
    args = options.parse_args(flags)
    if a.ranks < 1 or a.seconds <= 0:
        p.error("--ranks must be at least 1 and --seconds positive")
    if not args.data or not pipeline.data_files(args.data, "train"):
        raise SystemExit(f"input-rate: no train-* files in {args.data}")
    args.shuffle_buffer = min(args.shuffle_buffer, SHUFFLE_CAP)
    mine = os.sched_getaffinity(0)
    threads = input_threads(os.cpu_count(), a.ranks)  # what pin_device gives each rank
    rate, images = measure(args, a.ranks, threads, a.seconds)
    print(
        f"input-rate images_per_sec={rate:.1f} ranks={a.ranks} threads={threads} "
        f"cores={physical_cores(mine)} cpus={len(mine)} images={images} path={INPUT_PATH}",
        flush=True,
    )
    return 0
