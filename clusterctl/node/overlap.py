"""`python3 PYZ overlap ARGS`: how much of the allreduce the training step hides behind its backward pass.

Launched by horovodrun (bench/overlap.py runs it; docs/REAL_HARDWARE.md on GPUs). The step is the trainer's
(train/step.py), on one fixed batch made on the device. For each step design (`blocks`: the trainer's, XLA per
segment; `whole`: the model as one XLA op, the design before it) it times, after warm-up steps, each step
alone, in rounds that take every design and mode in turn (the median step; rank 0 prints the mean over the
ranks' medians):

    compute    the step without its allreduce (what one process alone would take)
    allreduce  the allreduce of the step's gradients alone (zeros of their shapes, the same compression)
    both       the step

and with --trace records Horovod's timeline (HOROVOD_TIMELINE's, started and stopped around a few steps,
each step's start taken on the timeline's clock) and reads from it when the step's gradients reached Horovod. Rank 0's lines:

    CLUSTERCTL-OVERLAP time design=blocks mode=compute seconds=0.8123 steps=8 size=2
    CLUSTERCTL-OVERLAP timeline design=blocks steps=3 gradients=161 forward_s=0.2412 first_s=0.2520
        last_s=0.7702 first=0.0206 bound=0.3271 path=...      (one line)

first_s / last_s: from the step's start to the first and the last gradient's arrival (the median step); first:
the first one's point in the backward pass (0: its start, 1: its end), which starts after the forward pass
(forward_s, timed alone); bound: first_s / last_s, the same point counted from the step's start, an upper
bound on `first` that needs no forward time. The whole-model design hands all gradients over at once:
first and bound near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from clusterctl.node.train import options as train_options
from clusterctl.node.train.model import build_model, choose_precision, input_shape, pin_device
from clusterctl.node.train.options import PRECISIONS
from clusterctl.node.train.step import DESIGNS, make_forward, make_objective, make_optimizer, make_step

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
MARK = "CLUSTERCTL-OVERLAP"
MODES = ("compute", "allreduce", "both")
SYNC = "clusterctl.overlap.sync"  # the allreduce that starts a traced step on every rank at once
DESCRIPTION = "How much of the allreduce the training step hides behind its backward pass (launched by horovodrun)."


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="overlap", description=DESCRIPTION)
    p.add_argument("--model", choices=("resnet50", "tiny"), default="resnet50")
    p.add_argument("--image-size", type=int, default=None, help="default 224 (resnet50), 32 (tiny)")
    p.add_argument("--batch-size", type=int, default=32, help="images per process per step")
    p.add_argument("--designs", default="blocks,whole", help=f"comma-separated, of {', '.join(DESIGNS)}")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (tracing, XLA compiling)")
    p.add_argument("--steps", type=int, default=5, help="timed steps per design and mode in each round")
    p.add_argument("--rounds", type=int, default=3, help="rounds over every design and mode, in turn")
    p.add_argument("--trace", metavar="PREFIX", help="record Horovod's timeline to PREFIX-<design>.json")
    p.add_argument("--trace-steps", type=int, default=3)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32", help="as the trainer's --precision")
    p.add_argument("--no-xla", dest="xla", action="store_false", help="plain TensorFlow ops (both designs alike)")
    p.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for the allreduce")
    args = p.parse_args(argv)
    args.designs = [d for d in args.designs.split(",") if d]
    args.modes = [m for m in args.modes.split(",") if m]
    bad = [d for d in args.designs if d not in DESIGNS] + [m for m in args.modes if m not in MODES]
    if bad or not args.designs:
        p.error(f"unknown design or mode {', '.join(bad) or '(none given)'}")
    for name in ("batch_size", "warmup_steps", "steps", "rounds", "trace_steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def emit(kind: str, /, **fields: object) -> None:
    words = (f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
    print(MARK, kind, *words, flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)

    import horovod.tensorflow as hvd  # the node runtime's
    import tensorflow as tf

    if args.trace:
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"  # Horovod's switch for start_timeline / stop_timeline
    hvd.init()
    _gpus, capabilities, _threads = pin_device(tf, hvd)
    policy = choose_precision(args.precision, capabilities)
    if policy != "float32":
        tf.keras.mixed_precision.set_global_policy(policy)
    loss_scaling = policy == "mixed_float16"
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none

    tf.random.set_seed(1234)
    classes = 1000 if args.model == "resnet50" else 10
    shape = input_shape(args.model, args.image_size)
    model = build_model(tf, args.model, shape[0], classes)
    recipe = train_options.parse_args(["--synthetic", "--model", args.model])  # the trainer's defaults
    opt, _ = make_optimizer(tf, 0.01, recipe.momentum, loss_scaling)
    objective = make_objective(tf, model, classes, recipe.label_smoothing, recipe.weight_decay, recipe.recipe)
    images = tf.cast(tf.random.uniform((args.batch_size, *shape), maxval=256, dtype=tf.int32), tf.uint8)
    labels = tf.random.uniform((args.batch_size,), maxval=classes, dtype=tf.int64)
    zeros = [tf.zeros(v.shape, v.dtype) for v in model.trainable_variables]  # the gradients' shapes

    def reduce_all() -> Any:
        sums = [hvd.allreduce(g, compression=compression, name=f"clusterctl.overlap.g{i}") for i, g in enumerate(zeros)]
        return tf.add_n([tf.reduce_sum(r) for r in sums])

    reduce_only = tf.function(reduce_all, autograph=False)

    runs: dict[tuple[str, str], Any] = {}  # (design, mode) -> the step, traced once
    if "allreduce" in args.modes:
        runs[("-", "allreduce")] = reduce_only
    forwards = {design: make_forward(tf, model, args.xla, design) for design in args.designs}
    for design, forward in forwards.items():
        for mode in [m for m in args.modes if m != "allreduce"]:
            step = make_step(
                tf,
                hvd,
                model,
                opt,
                objective,
                forward,
                loss_scaling=loss_scaling,
                compression=compression,
                allreduce=mode == "both",
            )
            runs[(design, mode)] = tf.function(lambda step=step: step(images, labels)[0], autograph=False)
    for fn in runs.values():  # tracing and XLA's compiling, before any clock runs
        for _ in range(args.warmup_steps):
            fn().numpy()
    # Round by round, every (design, mode) in turn: a machine whose load drifts slows them all alike.
    times: dict[tuple[str, str], list[float]] = {key: [] for key in runs}
    for _ in range(args.rounds):
        for key, fn in runs.items():
            hvd.allreduce(tf.constant(0.0), name="clusterctl.overlap.sync").numpy()  # every rank starts together
            for _ in range(args.steps):
                t0 = time.perf_counter()
                fn().numpy()  # the copy to the host waits for the device
                times[key].append(time.perf_counter() - t0)
    for (design, mode), measured in times.items():
        mine = tf.constant(statistics.median(measured), tf.float64)
        seconds = float(hvd.allreduce(mine, name="clusterctl.overlap.t"))
        if hvd.rank() == 0:
            emit("time", design=design, mode=mode, seconds=seconds, steps=len(measured), size=hvd.size())
    if args.trace and "both" in args.modes:
        for design, forward in forwards.items():
            record_timeline(tf, hvd, args, design, runs[(design, "both")], tf.function(lambda f=forward: f(images)))
    return 0


def record_timeline(tf: Any, hvd: Any, args: argparse.Namespace, design: str, train_step: Any, forward: Any) -> None:
    """A few steps on Horovod's timeline; rank 0 reads the file back."""
    for _ in range(2):
        forward().numpy()
    times = []
    for _ in range(max(5, args.steps)):
        t0 = time.perf_counter()
        forward().numpy()
        times.append(time.perf_counter() - t0)
    forward_s = float(hvd.allreduce(tf.constant(statistics.median(times), tf.float64), name="clusterctl.overlap.f"))
    path = f"{args.trace}-{design}.json"
    hvd.start_timeline(path)
    sync = tf.function(lambda: hvd.allreduce(tf.constant(0.0), name=SYNC))  # named: left out of the step's tensors
    spans = []
    for _ in range(args.trace_steps):
        sync().numpy()  # both ranks start together
        t0 = time.time()  # the timeline's clock: its file says when it started, since the epoch
        train_step().numpy()
        spans.append((t0, time.time()))
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return
    with open(path, encoding="utf-8") as f:
        steps = step_submissions(read_timeline(f.read()), spans, ignore=(SYNC,))
    if not steps:
        emit("timeline", design=design, steps=0, path=path)
        return
    emit(
        "timeline",
        design=design,
        steps=len(steps),
        gradients=statistics.median(n for _, _, n in steps),
        forward_s=forward_s,
        first_s=statistics.median(first for first, _, _ in steps),
        last_s=statistics.median(last for _, last, _ in steps),
        # each step's own point, then their median (one step's first with another's last would say nothing)
        first=statistics.median(backward_point(first, last, forward_s) for first, last, _ in steps),
        bound=statistics.median(first / last if last > 0 else 1.0 for first, last, _ in steps),
        path=path,
    )


def backward_point(first_s: float, last_s: float, forward_s: float) -> float:
    """Where in the backward pass (0 its start, 1 its end: the last gradient) the first gradient arrived."""
    span = last_s - forward_s
    return min(1.0, max(0.0, (first_s - forward_s) / span)) if span > 0 else 1.0


def read_timeline(text: str) -> list[dict[str, Any]]:
    """Horovod's timeline: a JSON array of Chrome trace events, ']'-closed after every event (a file cut short
    loses its last event only)."""
    text = text.strip()
    try:
        events = json.loads(text)
    except json.JSONDecodeError:
        events = json.loads(text.rstrip(",]") + "]")
    return [e for e in events if isinstance(e, dict)]


def step_submissions(
    events: list[dict[str, Any]], spans: list[tuple[float, float]], ignore: tuple[str, ...] = ()
) -> list[tuple[float, float, int]]:
    """For each step (its start and end in seconds since the epoch): seconds from its start to the first and the
    last tensor's arrival at Horovod (the first phase it opens in the step), and how many tensors arrived.
    `ignore`: tensors by name that are not the step's (their phases may be stamped a moment after its start)."""
    origin = next(
        (
            e["args"]["start_time_since_epoch_in_micros"]
            for e in events
            if "start_time_since_epoch_in_micros" in e.get("args", {})
        ),
        None,
    )
    if origin is None:
        return []
    # a tensor's phases open with "B" events (NEGOTIATE_ALLREDUCE when the first rank submits it, then ALLREDUCE)
    names = {e["pid"]: e.get("args", {}).get("name") for e in events if e.get("ph") == "M"}
    timed = sorted(
        ((origin + e["ts"]) / 1e6, e["pid"])
        for e in events
        if e.get("ph") == "B" and "ts" in e and names.get(e["pid"]) not in ignore
    )
    out = []
    for t0, end in spans:
        arrived: dict[int, float] = {}
        for t, pid in timed:
            if t0 <= t < end:
                arrived.setdefault(pid, t)
        if arrived:
            out.append((min(arrived.values()) - t0, max(arrived.values()) - t0, len(arrived)))
    return out
