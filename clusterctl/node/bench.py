#!/usr/bin/env python3
"""`python3 PYZ bench ARGS`: the synthetic Horovod benchmark, launched by horovodrun (one process per slot).

TensorFlow 2 + horovod.tensorflow, random images made on the device, so the numbers measure compute and
the allreduce and nothing of storage. The network, the device set-up and the step (optimizer, loss, XLA in
segments, the allreduce) are the trainer's (train/model.py, train/step.py).

Timing follows Horovod's tensorflow2_synthetic_benchmark.py: at least 10 untimed warm-up steps, then
timed batches of --steps steps each; the result is the mean over the batches with their spread, 1.96
standard deviations of single batches (conf=, Horovod's +-). Every batch's rate is printed too
(`interval`): clusterctl takes the mean's confidence interval from them (workloads/bench/stats.py).
How many batches: exactly --iters with --max-seconds 0; else at least --iters, then until the figures this
rung is judged on (--against: the rungs before it) are decided against --threshold, or the first rung's
mean is precise, or --max-seconds of timing have passed (bench_stop.py; the `stop` line says which).

Only rank 0 prints, and only lines that start with `CLUSTERCTL-BENCH` are meant for machines
(clusterctl.workloads.horovod.parse_bench_output reads them):

    CLUSTERCTL-BENCH device rank=1 host=node-1 local_rank=1 gpus=1 logical=1   (one per rank; gpus=none: CPU)
    CLUSTERCTL-BENCH start size=4 model=tiny batch=32 ... precision=float32 compression=none  (what ran)
    CLUSTERCTL-BENCH interval step=10 img_per_sec=123.4 size=4                 (one per timed batch)
    CLUSTERCTL-BENCH stop reason=decided batches=37 seconds=75.31   (why timing stopped: bench_stop.py)
    CLUSTERCTL-BENCH host rank=1 name=node-1 local_rank=0 img_per_sec=30.9 conf=1.2
    CLUSTERCTL-BENCH result size=4 img_per_sec=123.6 img_per_sec_per_proc=30.9 model=tiny batch=32 conf=4.1
    CLUSTERCTL-BENCH error kind=size_mismatch size=2 expected=4          (then exit status 3)

--input-only times the input pipeline alone (JPEG decode, random crop and flip, resize, batch, prefetch;
no model, no allreduce in the steps): when it is not well above the model's img/s, feeding is the
bottleneck.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from typing import Any

from clusterctl.node import nccl_report
from clusterctl.node.bench_stop import Reference, Rule, time_batches
from clusterctl.node.train import options as train_options
from clusterctl.node.train.model import (
    build_model,
    choose_precision,
    describe,
    input_shape,
    pin_device,
    report_devices,
)
from clusterctl.node.train.options import EXIT_SIZE_MISMATCH, PRECISIONS
from clusterctl.node.train.step import (
    broadcast_from_rank0,
    make_forward,
    make_objective,
    make_optimizer,
    make_step,
)

# TF's C++ start-up chatter would bury the result lines in every rank's output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MARK = "CLUSTERCTL-BENCH"
DESCRIPTION = "Synthetic Horovod benchmark, shipped to every node and launched by horovodrun (one process per slot)."


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bench", description=DESCRIPTION)
    p.add_argument("--model", choices=("resnet50", "tiny"), default="resnet50")
    p.add_argument("--batch-size", type=int, default=32, help="images per process per step")
    p.add_argument("--warmup-steps", type=int, default=10, help="untimed steps first (graph tracing, broadcast)")
    p.add_argument("--steps", type=int, default=10, help="steps per timed batch")
    p.add_argument("--iters", type=int, default=10, help="timed batches: the least, or all with --max-seconds 0")
    p.add_argument(
        "--max-seconds", type=float, default=0.0, help="seconds of timing after which no batch starts (0: --iters)"
    )
    p.add_argument("--threshold", type=float, default=0.9, help="what the --against figures are judged against")
    p.add_argument(
        "--against",
        type=Reference.parse,
        action="append",
        default=[],
        help="MEAN:SD:N:SCALE of a rung run before: this rung's img/s over SCALE x MEAN is judged (repeatable)",
    )
    p.add_argument("--input-only", action="store_true", help="time the input pipeline alone, no model")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="float16 always with loss scaling; mixed: float16 on GPUs, bfloat16 on CPUs; auto: float16 on "
        "GPUs with tensor cores (compute capability 7.0+), else fp32 (clusterctl passes the GPU type's)",
    )
    p.add_argument("--mixed-precision", dest="precision", action="store_const", const="mixed")
    p.add_argument("--xla", action="store_true", help="compile the model with XLA (jit_compile)")
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for the allreduce")
    p.add_argument("--expect-size", type=int, default=None, help="fail unless Horovod's size is exactly this")
    p.add_argument("--seed", type=int, default=1234)
    args = p.parse_args(argv)
    for name in ("batch_size", "warmup_steps", "steps"):
        if getattr(args, name) < 1:
            # warm-up >= 1: the first step traces the graph and is followed by the broadcast; never timed.
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.iters < 2:
        p.error("--iters must be at least 2 (a mean's interval needs a variance)")
    if args.max_seconds < 0 or not 0 < args.threshold <= 1:
        p.error("--max-seconds must be at least 0 and --threshold in (0, 1]")
    return args


def emit(kind: str, /, **fields: object) -> None:
    parts = [MARK, kind]
    for key, value in fields.items():
        parts.append(f"{key}={value:.2f}" if isinstance(value, float) else f"{key}={value}")
    print(" ".join(parts), flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    nccl_report.capture()  # before NCCL starts: its report of the network into this process's own file

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()

    # Every rank checks, so every rank exits the same way and none waits in a collective for the others.
    if args.expect_size is not None and size != args.expect_size:
        if rank == 0:
            emit("error", kind="size_mismatch", size=size, expected=args.expect_size)
            print(
                f"bench: Horovod size is {size} but {args.expect_size} processes were expected: "
                "some hosts or slots did not join (check the hosts file and -np)",
                file=sys.stderr,
                flush=True,
            )
        return EXIT_SIZE_MISMATCH

    # One GPU per process, or the host's cores shared between its processes (the trainer's set-up).
    gpus, capabilities, threads = pin_device(tf, hvd)

    # Every rank says which GPU it has (after the device set-up above: this starts TensorFlow's runtime).
    report_devices(tf, hvd, emit)
    nccl_report.check(tf, hvd, gpus, emit)  # the network NCCL chose: a wrong one ends the run here

    # float16 needs loss scaling and is what tensor-core GPUs are fast at; CPUs only speed up bfloat16.
    policy = choose_precision(args.precision, capabilities)
    if policy != "float32":
        tf.keras.mixed_precision.set_global_policy(policy)
    loss_scaling = policy == "mixed_float16"
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    tf.random.set_seed(args.seed + rank)
    shape, classes = input_shape(args.model), 1000 if args.model == "resnet50" else 10
    model = build_model(tf, args.model, shape[0], classes)
    if rank == 0:
        print(describe(args.model, model), flush=True)
    if args.input_only:
        # The node's cores shared by its processes, as the trainer's pipeline has them; on to the GPU as there.
        ds = input_pipeline(tf, args.batch_size, shape, args.seed + rank, threads)
        if gpus:
            ds = ds.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2))
        batches = iter(ds)

        def train_step() -> Any:
            return next(batches)[0]
    else:
        # The trainer's step (train/step.py): its optimizer, loss and weight decay at the trainer's defaults.
        recipe = train_options.parse_args(["--synthetic", "--model", args.model])
        opt, _ = make_optimizer(tf, 0.01 * size, recipe.momentum, loss_scaling)
        objective = make_objective(tf, model, classes, recipe.label_smoothing, recipe.weight_decay, recipe.recipe)
        forward = make_forward(tf, model, args.xla)
        step = make_step(tf, hvd, model, opt, objective, forward, loss_scaling=loss_scaling, compression=compression)

        # One fixed random batch of 8-bit images (what the trainer's input pipeline hands over), made on this
        # process's device: no input pipeline in the measurement.
        images = tf.cast(tf.random.uniform((args.batch_size, *shape), maxval=256, dtype=tf.int32), tf.uint8)
        labels = tf.random.uniform((args.batch_size,), maxval=classes, dtype=tf.int64)

        def one_step() -> Any:
            return step(images, labels)[0]

        # No AutoGraph: the step has no Python control flow over tensors, and converting it (with the Keras
        # calls and Horovod's allreduce inside) cost each process ~2.3 CPU-s of its ~4.6 s start with the tiny
        # model on CPU; Horovod's own tf.cond stays a tf.cond.
        train_step = tf.function(one_step, autograph=False)

    loss = train_step()
    if not args.input_only:
        # After the first step the optimizer's slots exist too, so one broadcast makes every rank start alike.
        opt_vars = opt.variables() if callable(opt.variables) else opt.variables
        broadcast_from_rank0(tf, hvd, [*model.variables, *opt_vars])
    for _ in range(args.warmup_steps - 1):
        loss = train_step()
    loss.numpy()  # wait for the warm-up to finish before the clock starts

    if rank == 0:
        emit(
            "start",
            size=size,
            model="input-pipeline" if args.input_only else args.model,
            batch=args.batch_size,
            warmup_steps=args.warmup_steps,
            steps=args.steps,
            iters=args.iters,
            max_seconds=args.max_seconds,
            threshold=args.threshold,
            against=len(args.against),
            gpus=len(gpus),
            precision=policy,
            loss_scaling=int(loss_scaling),
            xla=int(args.xla),
            fp16_allreduce=int(args.fp16_allreduce),
            compression="fp16" if args.fp16_allreduce else "none",  # what the allreduce sends
        )

    local_rates: list[float] = []
    totals = time_rung(args, hvd, tf, train_step, local_rates)

    local_mean, local_conf = mean_conf(local_rates)
    rates = hvd.allgather(tf.constant([[local_mean, local_conf, float(local_rank)]], tf.float64)).numpy()
    names = hvd.allgather_object(socket.gethostname())
    if rank == 0:
        for r, ((rate, conf, lrank), name) in enumerate(zip(rates, names)):
            emit("host", rank=r, name=name, local_rank=int(lrank), img_per_sec=float(rate), conf=float(conf))
        total, conf = mean_conf(totals)
        emit(
            "result",
            size=size,
            img_per_sec=total,
            img_per_sec_per_proc=total / size,
            model="input-pipeline" if args.input_only else args.model,
            batch=args.batch_size,
            conf=conf,
        )
    return 0


def time_rung(args: argparse.Namespace, hvd: Any, tf: Any, train_step: Any, local_rates: list[float]) -> list[float]:
    """Timed batches until bench_stop's rule says stop (the `stop` line says why): each batch's img/s of all
    ranks together; this rank's own rates appended to local_rates."""
    rank, size = hvd.rank(), hvd.size()
    rule = Rule(args.iters, args.max_seconds, args.threshold, tuple(args.against))
    clock = time.perf_counter()

    def next_batch() -> tuple[float, float]:
        t0 = time.perf_counter()
        for _ in range(args.steps):
            out = train_step()
        out.numpy()  # the copy to the host waits for the device: GPU kernels run asynchronously
        now = time.perf_counter()
        local_rates.append(args.batch_size * args.steps / (now - t0))
        # The total is the sum of what every rank measured, not rank 0's rate times size; the seconds are the
        # ranks' mean, so every rank sees the same figures and the stopping rule stops them all at one batch.
        summed = hvd.allreduce(tf.constant([local_rates[-1], now - clock], tf.float64), op=hvd.Sum).numpy()
        total = float(f"{summed[0]:.2f}")  # as printed: the rule judges what the verdict will read
        if rank == 0:
            emit("interval", step=len(local_rates) * args.steps, img_per_sec=total, size=size)
        return total, float(summed[1]) / size

    totals, why = time_batches(rule, next_batch)
    if rank == 0:
        emit("stop", reason=why, batches=len(totals), seconds=time.perf_counter() - clock)
    return totals


def mean_conf(values: list[float]) -> tuple[float, float]:
    """Mean and 1.96 standard deviations (population, as Horovod's benchmark computes them)."""
    mean = sum(values) / len(values)
    return mean, 1.96 * (sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5


def input_pipeline(tf: Any, batch: int, shape: tuple[int, int, int], seed: int, threads: int) -> Any:
    """ImageNet's training-side pipeline on in-memory JPEGs: parallel decode_and_crop_jpeg, flip, resize,
    batch, prefetch. The JPEGs are made once here (no disk in the measurement: it times decoding and
    augmentation, the part that eats a node's CPUs)."""
    side = max(64, shape[0] * 2)
    gen = tf.random.Generator.from_seed(seed)
    jpegs = [tf.io.encode_jpeg(tf.cast(gen.uniform((side, side, 3), maxval=255), tf.uint8)) for _ in range(16)]
    ds = tf.data.Dataset.from_tensor_slices(tf.stack(jpegs)).repeat()

    def decode(data: Any) -> Any:
        bbox = tf.zeros((1, 0, 4), tf.float32)  # no box: the whole image, as ImageNet's loaders do
        y, x, _ = tf.unstack(tf.image.extract_jpeg_shape(data))
        begin, size_, _ = tf.image.sample_distorted_bounding_box(
            tf.stack([y, x, 3]),
            bbox,
            area_range=(0.08, 1.0),
            aspect_ratio_range=(0.75, 1.33),
            use_image_if_no_bounding_boxes=True,
        )
        oy, ox, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size_)
        image = tf.image.decode_and_crop_jpeg(data, tf.stack([oy, ox, h, w]), channels=3)
        image = tf.image.random_flip_left_right(image)
        # 8-bit out, as the trainer's pipeline: a quarter of float32's bytes to the device, cast there
        return tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, shape[:2])), 0, 255), tf.uint8)

    options = tf.data.Options()
    options.threading.private_threadpool_size = threads  # its own pool: not TensorFlow's inter-op threads
    return (
        ds.map(decode, num_parallel_calls=tf.data.AUTOTUNE)
        .batch(batch, drop_remainder=True)
        .map(lambda x: (x, tf.zeros((batch,), tf.int64)))
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
