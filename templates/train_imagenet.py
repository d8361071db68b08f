#!/usr/bin/env python3
"""ImageNet training with TensorFlow 2 + Horovod, shipped to every node and launched by horovodrun.

Standalone on purpose: nodes have TensorFlow and Horovod, not clusterctl. One process per slot; rank 0
alone prints, checkpoints and writes TensorBoard summaries.

Data: ImageNet-format TFRecords in --data: `train-*` and `validation-*` shards of tf.train.Examples
with `image/encoded` (JPEG bytes) and `image/class/label`, which is 1-based as in the standard ImageNet
TFRecords (label 0 is the unused "background"; --label-offset 1 maps 1..C to 0..C-1). Optional
`image/object/bbox/{xmin,ymin,xmax,ymax}` guide the random crops, as for ImageNet. `clusterctl data`
writes this format, plus `labels.txt` (line N = class of label N) and `dataset.json` (counts), which
this script reads when present.

Output for machines (clusterctl.workloads.train_log parses it): every line starts with `CLUSTERCTL-TRAIN`; event lines
are `CLUSTERCTL-TRAIN <kind> key=value ...` (values shell-quoted when needed) and the table is

    CLUSTERCTL-TRAIN    Step   Epoch      img/s      Loss  TotalLoss         LR   Elapsed
    CLUSTERCTL-TRAIN      10    0.50      812.3    2.2910     2.3750   0.012500      14.2

(the recipe's Step/Epoch/Speed/Loss/FinLoss/LR table: img/s for all processes together, Loss the
cross-entropy averaged over all ranks and the steps since the last line, TotalLoss with weight decay,
Elapsed seconds since this process started). Kinds: device, start, resume, checkpoint, warning, done, eval,
error. `device` comes once per rank, first: `device rank=R host=H local_rank=L gpus=ID logical=N`, the GPU
the rank computes on as its node numbers it (gpus=none: the CPU), which clusterctl checks against the
node's slots.
`eval` carries top1/top5 in percent, and is followed by the same as one JSON line of its own
({"metric": top1, "top1": ..., "top5": ..., "eval_loss": ..., "step": ...}) for `clusterctl sweep`.

Fault tolerance: Horovod has none, so checkpoints are the way back. Rank 0 saves every
--checkpoint-every steps and at every epoch end (ckpt-<images seen, all ranks together>, the last
--keep-checkpoints kept, by images); on start it restores the one that has seen the most images (model,
optimizer state, step, epoch, images) and broadcasts it to every rank, so only rank 0 needs --model-dir.
Resumed on another number of processes, the run goes on from the step of this global batch at those images,
and the learning rate from the images exactly. After a resume the input pipeline starts a fresh shuffle; it
does not replay the exact images of the interrupted epoch.

Resuming: every variable the checkpoint tracks (the model, the optimizer with its momentum, and a loss-scale
optimizer's loss scale and its counter) goes from rank 0 to every rank after the restore, and at the end
the ranks compare a fingerprint of those variables (`sync` line). `hparams.json` beside the checkpoints
records the hyperparameters they were trained with; a resume under other ones is refused (exit 7): give
another --model-dir. Under `clusterctl sweep` (CLUSTERCTL_SWEEP and CLUSTERCTL_TRIAL set) the default
--model-dir is train_out/<sweep>/trial-<N>, one per trial.

Copies and spot: each saved checkpoint gets a manifest of its files and sizes, written last (a checkpoint
without one, or with a file missing or of another size, is never restored), and is copied in the
background to --checkpoint-copy HOST (the same folder there, over the leader's ssh) and to --checkpoint-to
s3://bucket/prefix (see train_ckpt.py, staged beside this script). On start, rank 0 restores the newest
complete checkpoint of all three places. With --spot-poll, each node's first process polls its instance's
spot interruption notice (IMDSv2); when one appears on any node, rank 0 checkpoints at once, waits for the
copies, and the job ends with status 8 (rank 0's; the others exit 0): start it again with the same command.

Elastic (--elastic, under horovodrun --min-np/--max-np --host-discovery-script): the training loop is
train_elastic.py's, staged beside this script; no collective runs before it (a process that joins later
would meet the others in their state sync), so each rank prints its own `device` line and rank 0's restore
reaches the others in that sync. See train_elastic.py for what a commit keeps and the `world_size` lines.

Exit status: 0 done; 2 bad arguments; 3 Horovod size differs from --expect-size; 4 nothing to evaluate
or a checkpoint that does not fit the model; 5 no data files; 6 labels outside 0..classes-1 after
--label-offset; 7 the checkpoint was trained with other hyperparameters; 8 a spot notice (see above). The
job's own status 9 comes from hvd_launch.py: an elastic job had fewer than --min-np processes for
--elastic-timeout.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import shlex
import socket
import sys
import time

# TF's C++ start-up chatter would bury the table in every rank's output.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MARK = "CLUSTERCTL-TRAIN"
EXIT_SIZE_MISMATCH = 3
EXIT_CHECKPOINT = 4
EXIT_NO_DATA = 5
EXIT_BAD_LABELS = 6
EXIT_HPARAMS = 7
BAD_LABEL = "label outside 0..classes-1 after --label-offset"
IMAGENET_TRAIN_EXAMPLES = 1281167
IMAGENET_VALIDATION_EXAMPLES = 50000
MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
COLUMNS = ("Step", "Epoch", "img/s", "Loss", "TotalLoss", "LR", "Elapsed")
_T0 = time.time()
EXIT_SPOT = 8  # stopped after a spot interruption notice, its checkpoint saved and copied


# ---- arguments ---------------------------------------------------------------------------------------
# What a recipe sets when its flag is not given. Goyal et al. 2017, "Accurate, Large Minibatch SGD":
# /10 at epochs 30, 60, 80 of 90 (the step schedule's 1/3, 2/3, 8/9), 5 warm-up epochs, no label
# smoothing. Its gamma 0 for the last batch norm of each residual block is in the model (train_model.py).
RECIPES = {
    "default": {"lr_schedule": "cosine", "warmup_epochs": 5.0, "label_smoothing": 0.1},
    "goyal": {"lr_schedule": "step", "warmup_epochs": 5.0, "label_smoothing": 0.0},
}
# The flags a checkpoint's run is defined by (hparams.json): resuming under other values would mix two runs.
HPARAMS = (
    "model",
    "image_size",
    "num_classes",
    "batch_size",
    "epochs",
    "base_lr",
    "recipe",
    "warmup_epochs",
    "lr_schedule",
    "momentum",
    "weight_decay",
    "label_smoothing",
    "label_offset",
    "min_crop_area",
    "seed",
)


def default_model_dir(env) -> str:
    """train_out; one folder per trial under clusterctl sweep, whose trials share a working folder."""
    sweep, trial = env.get("CLUSTERCTL_SWEEP", ""), env.get("CLUSTERCTL_TRIAL", "")
    if sweep and trial:
        return os.path.join("train_out", os.path.basename(sweep), f"trial-{os.path.basename(trial)}")
    return "train_out"


def _s3_uri(text: str) -> str:
    import train_ckpt

    try:
        train_ckpt.parse_s3(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    d = p.add_argument_group("data")
    d.add_argument("--data", help="folder with train-* and validation-* TFRecord shards")
    d.add_argument("--synthetic", action="store_true", help="random in-memory images instead of --data")
    d.add_argument(
        "--train-examples",
        type=int,
        default=None,
        help="images per epoch (default: dataset.json, else counted; synthetic: ImageNet's)",
    )
    d.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="default: lines of labels.txt in --data, else 1000 (10 for --model tiny --synthetic)",
    )
    d.add_argument("--label-offset", type=int, default=1, help="subtracted from image/class/label (1 = ImageNet)")
    d.add_argument("--shuffle-buffer", type=int, default=10000, help="records in each rank's shuffle buffer")
    d.add_argument("--min-crop-area", type=float, default=0.08, help="smallest random crop, as a fraction of the image")
    m = p.add_argument_group("model and optimisation")
    m.add_argument("--model", choices=("resnet50", "tiny"), default="resnet50")
    m.add_argument("--image-size", type=int, default=None, help="default 224 (resnet50), 32 (tiny)")
    m.add_argument("--batch-size", type=int, default=64, help="images per process per step")
    m.add_argument("--epochs", type=float, default=90)
    m.add_argument(
        "--max-steps", type=int, default=None, help="stop at this global step (the schedule still spans --epochs)"
    )
    m.add_argument(
        "--base-lr",
        "--lr",
        type=float,
        default=0.1,
        help="learning rate per 256 images; the peak is base-lr * global batch / 256",
    )
    m.add_argument(
        "--recipe",
        choices=tuple(RECIPES),
        default="default",
        help="default: cosine decay, label smoothing 0.1; goyal: Goyal et al. 2017 (step decay at "
        "30/60/80 of 90 epochs, label smoothing 0)",
    )
    m.add_argument("--warmup-epochs", type=float, default=None, help="linear warm-up from ~0 to the peak (5)")
    m.add_argument(
        "--lr-schedule",
        choices=("cosine", "step", "poly"),
        default=None,
        help="decay after the warm-up (step: /10 at 1/3, 2/3 and 8/9 of the epochs); default: the recipe's",
    )
    m.add_argument("--momentum", type=float, default=0.9)
    m.add_argument("--weight-decay", type=float, default=1e-4, help="L2 on conv and dense kernels")
    m.add_argument("--label-smoothing", type=float, default=None, help="default: the recipe's")
    m.add_argument(
        "--precision",
        choices=("auto", "fp32", "float16", "bfloat16", "mixed"),
        default="auto",
        help="auto: float16 with loss scaling on GPUs with tensor cores (compute capability 7.0+), "
        "else fp32; mixed: float16 on GPUs, bfloat16 on CPUs; float16 always has loss scaling",
    )
    m.add_argument(
        "--mixed-precision", dest="precision", action="store_const", const="mixed", help="same as --precision mixed"
    )
    m.add_argument("--fp32", dest="precision", action="store_const", const="fp32", help="same as --precision fp32")
    m.add_argument("--xla", action="store_true", help="compile the model with XLA")
    m.add_argument("--fp16-allreduce", action="store_true", help="compress gradients to float16 for the allreduce")
    m.add_argument("--seed", type=int, default=1234)
    o = p.add_argument_group("checkpoints, logs, evaluation")
    o.add_argument(
        "--model-dir",
        default=None,
        help="checkpoints and TensorBoard logs (rank 0's disk); default train_out, and under "
        "clusterctl sweep train_out/<sweep>/trial-<N>",
    )
    o.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints (0: epochs only)")
    o.add_argument("--keep-checkpoints", type=int, default=5)
    o.add_argument(
        "--checkpoint-copy",
        metavar="HOST",
        default=None,
        help="also copy every checkpoint to this node (ssh from rank 0's node), into the same folder",
    )
    o.add_argument(
        "--checkpoint-to",
        metavar="S3_URI",
        type=_s3_uri,
        default=None,
        help="also upload every checkpoint to s3://bucket/prefix (boto3, the instance's own credentials)",
    )
    o.add_argument("--s3-endpoint-url", default=None, help="S3 endpoint for --checkpoint-to (a test server)")
    o.add_argument(
        "--spot-poll",
        type=float,
        default=0.0,
        help="seconds between polls of the spot interruption notice (IMDSv2); 0: do not poll",
    )
    o.add_argument("--imds-endpoint", default="http://169.254.169.254", help="the instance metadata service")
    o.add_argument("--log-every", type=int, default=100, help="steps between table lines")
    o.add_argument("--no-eval", action="store_true", help="skip the evaluation after training")
    o.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="also evaluate every N epochs during training, on all ranks (0: only at the end)",
    )
    o.add_argument("--eval-only", action="store_true", help="evaluate the latest checkpoint and exit")
    o.add_argument("--eval-batch-size", type=int, default=None, help="default: --batch-size")
    o.add_argument(
        "--eval-steps",
        type=int,
        default=None,
        help="at most this many batches per rank (default: the whole validation set; synthetic: 10)",
    )
    o.add_argument("--no-gpu", action="store_true", help="hide GPUs (evaluating next to a running job)")
    o.add_argument("--expect-size", type=int, default=None, help="fail unless Horovod's size is exactly this")
    e = p.add_argument_group("elastic (horovodrun --min-np/--max-np --host-discovery-script)")
    e.add_argument(
        "--elastic",
        action="store_true",
        help="train under Elastic Horovod: a lost process is dropped, a new one joins at the next commit",
    )
    # 50 steps: a commit copies the model and optimizer to host memory (Horovod's elastic docs: commit
    # less often than every batch); a lost node costs at most this many steps, redone at the new size.
    e.add_argument("--commit-every", type=int, default=50, help="steps between commits of the elastic state")
    args = p.parse_args(argv)
    if not args.synthetic and not args.data:
        p.error("give --data DIR (TFRecords) or --synthetic")
    for name in ("batch_size", "log_every", "keep_checkpoints", "shuffle_buffer", "commit_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    for name, value in RECIPES[args.recipe].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.model_dir is None:
        args.model_dir = default_model_dir(os.environ)
    for name in ("checkpoint_every", "warmup_epochs", "weight_decay", "label_smoothing", "base_lr", "eval_every"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must not be negative")
    if args.epochs <= 0:
        p.error("--epochs must be positive")
    if args.max_steps is not None and args.max_steps < 1:
        p.error("--max-steps must be at least 1")
    if not 0 < args.min_crop_area <= 1:
        p.error("--min-crop-area must be in (0, 1]")
    if args.elastic and (args.eval_every or args.expect_size or args.eval_only):
        p.error("--elastic trains at a changing size: --eval-every, --expect-size and --eval-only do not apply")
    if args.image_size is None:
        args.image_size = 224 if args.model == "resnet50" else 32
    if args.eval_batch_size is None:
        args.eval_batch_size = args.batch_size
    return args


# ---- output (rank 0) ---------------------------------------------------------------------------------
def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return shlex.quote(str(value))


def emit(event: str, **fields: object) -> None:
    print(" ".join([MARK, event] + [f"{k}={_fmt(v)}" for k, v in fields.items()]), flush=True)


def table_header() -> None:
    print(
        f"{MARK} {'Step':>7} {'Epoch':>7} {'img/s':>10} {'Loss':>9} {'TotalLoss':>10} {'LR':>10} {'Elapsed':>9}",
        flush=True,
    )


def table_row(step: int, epoch: float, img_per_sec: float, loss: float, total: float, lr: float) -> None:
    print(
        f"{MARK} {step:>7d} {epoch:>7.2f} {img_per_sec:>10.1f} {loss:>9.4f} {total:>10.4f} {lr:>10.6f} "
        f"{time.time() - _T0:>9.1f}",
        flush=True,
    )


# ---- data --------------------------------------------------------------------------------------------
def data_files(data_dir: str, split: str) -> list[str]:
    """`train-*` / `validation-*` shards, sorted; hidden and temporary files are not shards."""
    return sorted(
        f
        for f in glob.glob(os.path.join(data_dir, f"{split}-*"))
        if not f.endswith((".tmp", ".partial")) and os.path.isfile(f)
    )


def dataset_meta(data_dir: str | None) -> dict:
    """dataset.json and labels.txt written by `clusterctl data`, when present."""
    meta: dict = {}
    if not data_dir:
        return meta
    path = os.path.join(data_dir, "dataset.json")
    if os.path.isfile(path):
        with open(path) as f:
            meta = json.load(f)
    labels = os.path.join(data_dir, "labels.txt")
    if "num_classes" not in meta and os.path.isfile(labels):
        with open(labels) as f:
            meta["num_classes"] = sum(1 for line in f if line.strip())
    return meta


def label_problem(meta: dict, label_offset: int, classes: int) -> str | None:
    """Why the labels of a dataset.json (label_base, num_classes) fall outside 0..classes-1 after the
    offset; None when they fit or the metadata does not say."""
    base, n = meta.get("label_base"), meta.get("num_classes")
    if not isinstance(base, int) or not isinstance(n, int) or n < 1:
        return None
    low, high = base - label_offset, base + n - 1 - label_offset
    if low < 0 or high > classes - 1:
        return (
            f"labels {base}..{base + n - 1} minus --label-offset {label_offset} are {low}..{high}, "
            f"outside 0..{classes - 1}: use --label-offset {base}"
        )
    return None


def parse_record(tf, serialized, label_offset: int, classes: int | None = None):
    """One serialized Example -> (JPEG bytes, 0-based label, boxes [1, N, 4] as ymin, xmin, ymax, xmax).
    With `classes`, a label outside 0..classes-1 raises InvalidArgumentError (one_hot would silently make
    it an all-zero target)."""
    features = {
        "image/encoded": tf.io.FixedLenFeature([], tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64, default_value=-1),
    }
    for k in ("xmin", "ymin", "xmax", "ymax"):
        features[f"image/object/bbox/{k}"] = tf.io.VarLenFeature(tf.float32)
    p = tf.io.parse_single_example(serialized, features)
    label = tf.cast(p["image/class/label"], tf.int32) - label_offset
    if classes is not None:
        tf.debugging.assert_less(label, classes, message=BAD_LABEL)
        tf.debugging.assert_non_negative(label, message=BAD_LABEL)
    box = tf.stack([tf.sparse.to_dense(p[f"image/object/bbox/{k}"]) for k in ("ymin", "xmin", "ymax", "xmax")], axis=-1)
    return p["image/encoded"], label, tf.reshape(box, [1, -1, 4])


def _normalize(tf, image):
    """Cast and normalise, on the device: the step's first op (XLA fuses it into the model's first conv)."""
    image = tf.cast(image, tf.float32)
    return (image - tf.constant(MEAN_RGB)) / tf.constant(STDDEV_RGB)


def _to_uint8(tf, image):
    """The pipeline hands 8-bit images to the device (a quarter of float32's bytes, as NVIDIA's reference
    pipeline does); _normalize runs there."""
    return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)


def preprocess_train(tf, encoded, box, size: int, min_area: float, seed):
    """The Inception-style random crop (guided by the boxes when there are any), resize, flip; `seed`
    (shape [2]) decides both, so each rank and each restart draws its own (see augment_seeds)."""
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = tf.image.extract_jpeg_shape(encoded)
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=box,
        seed=crop_seed,
        min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3),
        area_range=(min_area, 1.0),
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(crop)
    image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)
    image = tf.image.resize(image, [size, size], method="bilinear")
    image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return _to_uint8(tf, image)


def preprocess_eval(tf, encoded, size: int):
    """Centre crop of 87.5% of the shorter side, resize."""
    image = tf.io.decode_jpeg(encoded, channels=3)
    shape = tf.shape(image)
    side = tf.cast(tf.cast(tf.minimum(shape[0], shape[1]), tf.float32) * 0.875, tf.int32)
    image = tf.image.crop_to_bounding_box(image, (shape[0] - side) // 2, (shape[1] - side) // 2, side, side)
    image = tf.image.resize(image, [size, size], method="bilinear")
    return _to_uint8(tf, image)


def augment_seeds(tf, seed: int):
    """An endless stream of [2]-shaped seeds, one per training image, for the stateless crop and flip.
    `seed` is data_seed(): it differs by rank and by the step a run starts from, so ranks and restarts
    do not draw the same augmentation sequence (the global seed alone would give every rank the same)."""
    return tf.data.Dataset.random(seed=seed).batch(2)


def data_seed(seed: int, rank: int, start_step: int) -> int:
    """A different shuffle and augmentation on every (re)start, different on every rank."""
    return seed + 7919 * rank + 104729 * start_step


def input_threads(cpus: int | None, local_size: int) -> int:
    """The input pipeline's threads for one process: the node's CPUs shared by its processes."""
    return max(1, (cpus or 1) // max(1, local_size))


def records(tf, files: list[str], rank: int, size: int, *, training: bool, seed: int, threads: int = 8):
    """This rank's records. Each file goes to one rank when there are at least as many files as ranks
    (every record read once per pass, by exactly one rank); with fewer files, records are dealt out.
    Up to `threads` files are read in parallel."""
    if len(files) >= size:
        ds = tf.data.Dataset.from_tensor_slices(files).shard(size, rank)
        if training:
            ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.interleave(
            lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
            cycle_length=min(threads, max(1, len(files) // size)),
            block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=not training,
        )
        return ds
    ds = tf.data.TFRecordDataset(files, buffer_size=8 << 20).shard(size, rank)
    return ds.repeat() if training else ds


def _sized(tf, ds, threads: int):
    """The pipeline's own thread pool, the node's CPUs shared by its processes (not each process all)."""
    options = tf.data.Options()
    options.threading.private_threadpool_size = threads
    options.threading.max_intra_op_parallelism = 1
    return ds.with_options(options)


def train_dataset(
    tf, args, files: list[str], rank: int, size: int, seed: int, classes: int | None = None, threads: int = 8
):
    ds = records(tf, files, rank, size, training=True, seed=seed, threads=threads)
    ds = ds.shuffle(args.shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    # The seed rides with each record through the parallel map: the same image gets the same crop
    # whichever thread decodes it.
    ds = tf.data.Dataset.zip((ds, augment_seeds(tf, seed)))

    def fn(serialized, aug_seed):
        encoded, label, box = parse_record(tf, serialized, args.label_offset, classes)
        return preprocess_train(tf, encoded, box, args.image_size, args.min_crop_area, aug_seed), label

    # AUTOTUNE: tf.data sizes the parallelism itself, within the pipeline's own pool of `threads` (_sized).
    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)
    return _sized(tf, ds.batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE), threads)


def eval_dataset(tf, args, files: list[str], rank: int, size: int, threads: int = 8):
    ds = records(tf, files, rank, size, training=False, seed=0, threads=threads)

    def fn(serialized):
        encoded, label, _ = parse_record(tf, serialized, args.label_offset)
        return preprocess_eval(tf, encoded, args.image_size), label

    ds = ds.map(fn, num_parallel_calls=tf.data.AUTOTUNE)
    return _sized(tf, ds.batch(args.eval_batch_size).prefetch(tf.data.AUTOTUNE), threads)


def synthetic_dataset(tf, args, classes: int, seed: int, batch: int):
    """One random batch of 8-bit images on this process, repeated: measures everything but storage and
    decoding."""
    g = tf.random.Generator.from_seed(seed)
    images = tf.cast(g.uniform((batch, args.image_size, args.image_size, 3), maxval=256, dtype=tf.int32), tf.uint8)
    labels = g.uniform((batch,), maxval=classes, dtype=tf.int32)
    return tf.data.Dataset.from_tensors((images, labels)).repeat()


def count_records(tf, hvd, files: list[str], alone: bool = False) -> int:
    """Records in `files`, each rank counting its own share, summed over all ranks (alone: this rank counts
    them all, no collective: an elastic job's process may join while the others train)."""
    rank, size = (0, 1) if alone else (hvd.rank(), hvd.size())
    mine = [f for i, f in enumerate(files) if i % size == rank]
    n = 0
    if mine:
        n = int(tf.data.TFRecordDataset(mine).reduce(tf.constant(0, tf.int64), lambda c, _: c + 1))
    return n if alone else int(hvd.allreduce(tf.constant(n, tf.int64), op=hvd.Sum))


# ---- learning rate, checkpoints ------------------------------------------------------------------
def checkpoint_variables(tf, ckpt) -> list:
    """Every variable the checkpoint tracks, each once: the model, the optimizer with its slots, and a
    LossScaleOptimizer's loss scale and its counter (which its .variables leaves out in Keras 2.15)."""
    seen, out = set(), []
    for obj in tf.train.TrackableView(ckpt).descendants():
        if isinstance(obj, tf.Variable) and obj.ref() not in seen:
            seen.add(obj.ref())
            out.append(obj)
    return out


def check_hparams(path: str, hparams: dict, has_checkpoint: bool) -> str | None:
    """Compare with the hparams.json beside the checkpoints (written when missing). Why a resume under
    these hyperparameters is refused, or None."""
    if os.path.isfile(path):
        with open(path) as f:
            saved = json.load(f)
        diff = [f"{k} {saved[k]!r} -> {hparams[k]!r}" for k in hparams if k in saved and saved[k] != hparams[k]]
        if diff and has_checkpoint:
            return (
                f"the checkpoints in {os.path.dirname(path)} were trained with other hyperparameters "
                f"({', '.join(diff)}); give another --model-dir or the same flags"
            )
        if not diff:
            return None
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(hparams, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    return None


def learning_rate(step: float, peak: float, warmup_steps: float, total_steps: float, schedule: str) -> float:
    """The large-minibatch recipe: linear warm-up to `peak`, then cosine / step / polynomial decay.
    Pure Python (the step is known on the host), so the value logged is the value used."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    span = max(1.0, total_steps - warmup_steps)
    done = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return 0.5 * peak * (1 + math.cos(math.pi * done))
    if schedule == "poly":
        return peak * (1 - done) ** 2
    frac = step / max(1.0, total_steps)
    return peak * 0.1 ** sum(frac >= b for b in (1 / 3, 2 / 3, 8 / 9))


# ---- main --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:  # noqa: C901 (a rank's whole run, in the order Horovod's examples write it)
    args = parse_args(argv)

    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    rank, size, local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
    chief = rank == 0

    if args.expect_size is not None and size != args.expect_size:
        if chief:
            emit("error", kind="size_mismatch", size=size, expected=args.expect_size)
        return EXIT_SIZE_MISMATCH

    gpus = tf.config.list_physical_devices("GPU")
    if args.no_gpu and gpus:
        tf.config.set_visible_devices([], "GPU")
        gpus = []
    capabilities = []
    # This host's cores shared between its processes: the input pipeline's threads (and on CPU the model's).
    threads = input_threads(os.cpu_count(), hvd.local_size())
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")
        try:
            capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability")]
        except (ValueError, RuntimeError):
            capabilities = [None]
    else:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass

    # Every rank says which GPU it has (after the device set-up above: this starts TensorFlow's runtime).
    import train_model  # staged beside this script: the networks and the device report, shared with the benchmark

    gpu_ids, logical = train_model.device_report(tf)
    if args.elastic:
        # No collective before the elastic loop: a process joining later would meet the others in its sync.
        emit("device", rank=rank, host=socket.gethostname(), local_rank=local_rank, gpus=gpu_ids, logical=logical)
    else:
        devices = hvd.allgather_object((rank, socket.gethostname(), local_rank, gpu_ids, logical))
        if chief:
            for r, host, lrank, ids, n in devices:
                emit("device", rank=r, host=host, local_rank=lrank, gpus=ids, logical=n)

    precision = train_model.choose_precision(args.precision, capabilities)
    if precision != "float32":
        tf.keras.mixed_precision.set_global_policy(precision)
    loss_scaling = precision == "mixed_float16"

    # ---- the data and what it implies
    meta = dataset_meta(None if args.synthetic else args.data)
    train_files: list[str] = []
    val_files: list[str] = []
    if not args.synthetic:
        train_files = data_files(args.data, "train")
        val_files = data_files(args.data, "validation")
        missing = []
        if not args.eval_only and not train_files:
            missing.append("train")
        if (args.eval_only or not args.no_eval or args.eval_every) and not val_files:
            missing.append("validation")
        if missing:
            if chief:
                emit("error", kind="no_data", data=args.data, missing=",".join(missing))
                print(
                    f"train_imagenet: no {' or '.join(s + '-*' for s in missing)} files in {args.data}",
                    file=sys.stderr,
                    flush=True,
                )
            return EXIT_NO_DATA
    classes = args.num_classes or meta.get("num_classes") or (10 if args.synthetic and args.model == "tiny" else 1000)
    if args.train_examples:
        train_examples = args.train_examples
    elif args.synthetic:
        train_examples = IMAGENET_TRAIN_EXAMPLES
    elif meta.get("splits", {}).get("train", {}).get("examples"):
        train_examples = int(meta["splits"]["train"]["examples"])
    else:
        train_examples = count_records(tf, hvd, train_files, alone=args.elastic) if train_files else 0

    bad_labels = None if args.synthetic else label_problem(meta, args.label_offset, classes)
    if bad_labels:
        if chief:
            emit("error", kind="bad_labels", message=bad_labels)
            print(f"train_imagenet: Error: {bad_labels}", file=sys.stderr, flush=True)
        return EXIT_BAD_LABELS

    global_batch = args.batch_size * size
    steps_per_epoch = max(1, train_examples // global_batch)
    total_steps = max(1, int(round(args.epochs * steps_per_epoch)))
    stop_step = min(total_steps, args.max_steps) if args.max_steps else total_steps
    peak_lr = args.base_lr * global_batch / 256
    warmup_steps = args.warmup_epochs * steps_per_epoch

    # ---- model, optimizer, checkpoint
    tf.random.set_seed(args.seed)  # the same initial weights everywhere (and the broadcast makes sure)
    model = train_model.build_model(tf, args.model, args.image_size, classes)
    zeroed = train_model.zero_gamma_layers(tf, model)
    if chief:
        print(train_model.describe(args.model, model), flush=True)
    opt = tf.keras.optimizers.SGD(learning_rate=peak_lr, momentum=args.momentum)
    inner = opt
    if loss_scaling:
        opt = tf.keras.mixed_precision.LossScaleOptimizer(opt)
    inner.build(model.trainable_variables)  # momentum slots exist now: restore and broadcast can fill them
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
    # The global batch the steps were counted in: a job resumed on another number of processes keeps its
    # place in the schedule by epochs, not by steps.
    batch_var = tf.Variable(global_batch, dtype=tf.int64, trainable=False, name="global_batch")
    # Images trained on, all ranks together: what orders and names the checkpoints (ckpt-<images>), and where a
    # resume on another number of processes takes up the schedule; steps are rescaled there, images never.
    images_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="images_seen")
    ckpt = tf.train.Checkpoint(
        model=model, optimizer=opt, step=step_var, epoch=epoch_var, global_batch=batch_var, images=images_var
    )
    ckpt_dir = os.path.join(args.model_dir, "checkpoints")
    copier = None
    manager = None
    restored = ""
    status = 0
    if chief:
        os.makedirs(ckpt_dir, exist_ok=True)
        copier = choose_checkpoint(tf, args, ckpt_dir)
        manager = tf.train.CheckpointManager(ckpt, ckpt_dir, max_to_keep=args.keep_checkpoints)
        hparams = {k: getattr(args, k) for k in HPARAMS if k != "num_classes"}
        hparams["num_classes"] = classes
        mismatch = (
            None
            if args.eval_only
            else check_hparams(os.path.join(ckpt_dir, "hparams.json"), hparams, bool(manager.latest_checkpoint))
        )
        if mismatch:
            emit("error", kind="hparams_mismatch", message=mismatch)
            print(f"train_imagenet: Error: {mismatch}", file=sys.stderr, flush=True)
            status = EXIT_HPARAMS
        elif manager.latest_checkpoint:
            try:
                ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
                restored = manager.latest_checkpoint
            except (AssertionError, ValueError, tf.errors.OpError) as exc:
                emit(
                    "error",
                    kind="bad_checkpoint",
                    checkpoint=manager.latest_checkpoint,
                    message=" ".join(str(exc).split())[:300],
                )
                status = EXIT_CHECKPOINT
        elif args.eval_only:
            emit("error", kind="no_checkpoint", model_dir=args.model_dir)
            status = EXIT_CHECKPOINT
    # Every rank learns rank 0's verdict, so all exit together instead of waiting in a collective.
    if not args.elastic:  # (elastic: rank 0's status and variables reach every rank in the state's sync)
        status = int(hvd.broadcast(tf.constant(status, tf.int32), root_rank=0, name="restore_status"))
        if status:
            return status
    # Everything the checkpoint holds, not model + opt.variables: a LossScaleOptimizer's loss scale is not
    # among its .variables, and a rank left at the initial scale unscales the averaged gradients differently.
    _ = ckpt.save_counter  # created lazily (by a restore or a save): make it on every rank, so all list the same
    tracked = checkpoint_variables(tf, ckpt)
    if not args.elastic:
        hvd.broadcast_variables(tracked, root_rank=0)
    start_step = int(step_var.numpy())
    saved_batch = int(batch_var.numpy())
    start_images = int(images_var.numpy())

    eval_kwargs = dict(classes=classes, val_files=val_files, threads=threads)
    if args.eval_only:
        # Epochs as the training run counted them (its global batch, not this evaluation's).
        saved_spe = max(1, train_examples // saved_batch) if saved_batch > 0 else steps_per_epoch
        return evaluate(tf, hvd, args, model, start_step, saved_spe, restored, **eval_kwargs)
    batch_changed = {}
    if saved_batch != global_batch:
        moved = int(round(start_images / global_batch))  # the step of this global batch at those images
        if restored:
            batch_changed = dict(saved=saved_batch, now=global_batch, step=start_step, new_step=moved)
        start_step = moved
        step_var.assign(moved)
        batch_var.assign(global_batch)

    writer = tf.summary.create_file_writer(os.path.join(args.model_dir, "tensorboard")) if chief else None
    if chief:
        emit(
            "start",
            size=size,
            model=args.model,
            image_size=args.image_size,
            classes=classes,
            batch=args.batch_size,
            global_batch=global_batch,
            train_examples=train_examples,
            steps_per_epoch=steps_per_epoch,
            epochs=float(args.epochs),
            total_steps=total_steps,
            stop_step=stop_step,
            start_step=start_step,
            start_images=start_images,
            peak_lr=peak_lr,
            schedule=args.lr_schedule,
            precision=precision,
            loss_scaling=loss_scaling,
            fp16_allreduce=args.fp16_allreduce,
            recipe=args.recipe,
            label_smoothing=args.label_smoothing,
            zero_gamma_layers=zeroed,
            eval_every=args.eval_every,
            input_threads=threads,
            fusion_threshold=os.environ.get("HOROVOD_FUSION_THRESHOLD", ""),
            cycle_time_ms=os.environ.get("HOROVOD_CYCLE_TIME", ""),
            xla=args.xla,
            gpus=len(gpus),
            synthetic=args.synthetic,
            data=args.data or "",
            model_dir=args.model_dir,
            train_files=len(train_files),
            validation_files=len(val_files),
            elastic=args.elastic,
            commit_every=args.commit_every,
        )
        if restored:
            emit("resume", step=start_step, images=start_images, epoch=int(epoch_var.numpy()), checkpoint=restored)
        if batch_changed:
            emit("warning", kind="global_batch_changed", **batch_changed)
        if train_files and len(train_files) % size:
            emit("warning", kind="uneven_shards", files=len(train_files), size=size)

    if start_step >= stop_step and not args.elastic:
        if chief:
            emit(
                "done",
                step=start_step,
                epoch=start_step / steps_per_epoch,
                complete=start_step >= total_steps,
                elapsed=time.time() - _T0,
                img_per_sec=0.0,
                note="nothing left to train",
            )
        if args.no_eval:
            return 0
        return evaluate(tf, hvd, args, model, start_step, steps_per_epoch, restored, writer=writer, **eval_kwargs)

    loss_fn = tf.keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=args.label_smoothing)
    decay_vars = [v for v in model.trainable_variables if "kernel" in v.name]
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    sums = tf.Variable(tf.zeros(3, tf.float64), trainable=False)  # loss, total loss, steps since the last line

    def forward(x):
        return model(_normalize(tf, x), training=True)

    if args.xla:
        # Horovod's collectives have no XLA kernels on CPU: compile the model, not the step around it.
        forward = tf.function(forward, jit_compile=True)

    @tf.function
    def train_step(images, labels, lr, batch):
        with tf.GradientTape() as tape:
            logits = tf.cast(forward(images), tf.float32)
            loss = loss_fn(tf.one_hot(labels, classes), logits)
            total = loss + args.weight_decay * tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in decay_vars])
            scaled = opt.get_scaled_loss(total) if loss_scaling else total
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(scaled, model.trainable_variables)
        if loss_scaling:
            grads = opt.get_unscaled_gradients(grads)
        inner.learning_rate.assign(lr)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        step_var.assign_add(1)
        images_var.assign_add(batch)  # the global batch (a tensor: an elastic job's size changes, no retrace)
        sums.assign_add(tf.cast(tf.stack([loss, total, 1.0]), tf.float64))

    if chief:
        table_header()
    if args.elastic:
        import train_elastic

        return train_elastic.run(
            tf,
            hvd,
            args,
            train_elastic.Job(
                train_step=train_step,
                tracked=tracked,
                sums=sums,
                manager=manager,
                copier=copier,
                writer=writer,
                step_var=step_var,
                epoch_var=epoch_var,
                batch_var=batch_var,
                images_var=images_var,
                classes=classes,
                train_files=train_files,
                train_examples=train_examples,
                threads=threads,
                gpus=len(gpus),
                plan_images=stop_step * global_batch,
                status=status,
                model=model,
                opt=opt if loss_scaling else None,
                eval_kwargs=eval_kwargs,
            ),
        )
    # A different shuffle and augmentation on every (re)start, different on every rank.
    seed = data_seed(args.seed, rank, start_step)
    if args.synthetic:
        train_ds = synthetic_dataset(tf, args, classes, seed, args.batch_size)
    else:
        train_ds = train_dataset(tf, args, train_files, rank, size, seed, classes, threads)
    if gpus:
        train_ds = train_ds.apply(tf.data.experimental.prefetch_to_device("/GPU:0", buffer_size=2))

    import train_ckpt

    # Each node's first process watches its own instance; a notice on any node stops every rank.
    spot = (
        train_ckpt.SpotWatch(args.imds_endpoint, args.spot_poll).start() if args.spot_poll and local_rank == 0 else None
    )
    it = iter(train_ds)
    step = start_step
    last_step, last_time = step, time.time()
    run_start = last_time

    def position(step: int) -> float:
        """Where the schedule is, in steps of this global batch, counted from the images seen (exact after a
        resume on another number of processes, where `step` was rounded)."""
        return (start_images + (step - start_step) * global_batch) / global_batch

    lr = learning_rate(position(step), peak_lr, warmup_steps, total_steps, args.lr_schedule)
    while step < stop_step:
        if args.spot_poll and spot_notice(tf, hvd, spot):
            return stop_for_spot(
                tf, hvd, args, manager, copier, epoch_var, step, steps_per_epoch, spot, images_var, global_batch
            )
        lr = learning_rate(position(step), peak_lr, warmup_steps, total_steps, args.lr_schedule)
        try:
            images, labels = next(it)
        except tf.errors.InvalidArgumentError as exc:
            if BAD_LABEL not in str(exc):
                raise
            # Any rank may meet it first: it says so itself; horovodrun then ends the others.
            message = f"a {BAD_LABEL} in rank {rank}'s data at step {step + 1}: check --label-offset and --num-classes"
            emit("error", kind="bad_labels", rank=rank, step=step + 1, message=message)
            print(f"train_imagenet: Error: {message}", file=sys.stderr, flush=True)
            return EXIT_BAD_LABELS
        train_step(images, labels, tf.constant(lr, tf.float32), tf.constant(global_batch, tf.int64))
        step += 1
        if step % args.log_every == 0 or step == start_step + 1 or step == stop_step:
            # The means of every rank over the steps since the last line (a collective: all ranks come here).
            means = hvd.allreduce(sums.read_value(), op=hvd.Average, name="log_sums").numpy()
            sums.assign(tf.zeros(3, tf.float64))
            now = time.time()
            rate = (step - last_step) * global_batch / max(now - last_time, 1e-9)
            last_step, last_time = step, now
            loss, total = means[0] / max(means[2], 1), means[1] / max(means[2], 1)
            if chief:
                table_row(step, step / steps_per_epoch, rate, loss, total, lr)
                with writer.as_default(step=step):
                    tf.summary.scalar("train/loss", loss)
                    tf.summary.scalar("train/total_loss", total)
                    tf.summary.scalar("train/learning_rate", lr)
                    tf.summary.scalar("train/images_per_sec", rate)
                    tf.summary.scalar("train/epoch", step / steps_per_epoch)
        epoch_end = step % steps_per_epoch == 0
        if chief and (epoch_end or step == stop_step or (args.checkpoint_every and step % args.checkpoint_every == 0)):
            epoch_var.assign(step // steps_per_epoch)
            t = time.time()
            seen = int(images_var.numpy())  # (`images` is the batch)
            path = manager.save(checkpoint_number=seen)
            seal_checkpoint(copier, path, step, seen, global_batch)
            emit("checkpoint", step=step, images=seen, epoch=int(epoch_var.numpy()), path=path, seconds=time.time() - t)
        if (
            args.eval_every
            and epoch_end
            and (step // steps_per_epoch) % args.eval_every == 0
            and (step < stop_step or args.no_eval)
        ):
            # All ranks, each validation image once (the final evaluation's sharding); not the sweep's metric.
            evaluate(
                tf,
                hvd,
                args,
                model,
                step,
                steps_per_epoch,
                manager.latest_checkpoint if manager else "",
                writer=writer,
                final=False,
                **eval_kwargs,
            )
    # Batch-norm moving statistics are each rank's own (not averaged), the epoch and the save counter are
    # set by rank 0 when it saves; everything else must be the same.
    own = {v.ref() for v in model.non_trainable_variables} | {epoch_var.ref(), ckpt.save_counter.ref()}
    sync = replicas_agree(tf, hvd, [v for v in tracked if v.ref() not in own], opt if loss_scaling else None)
    if chief:
        emit("sync", step=step, identical=sync[0], variables=len(tracked) - len(own), loss_scales=sync[1])
        if not sync[0]:
            emit("warning", kind="replicas_differ", step=step, loss_scales=sync[1], variables=sync[2])
        writer.flush()
        trained = time.time() - run_start
        emit(
            "done",
            step=step,
            epoch=step / steps_per_epoch,
            complete=step >= total_steps,
            elapsed=time.time() - _T0,
            img_per_sec=(step - start_step) * global_batch / max(trained, 1e-9),
        )
        print(f"Finished in {trained:.1f} s", flush=True)
    if copier is not None:
        copier.wait()
    if args.no_eval:
        return 0
    return evaluate(
        tf,
        hvd,
        args,
        model,
        step,
        steps_per_epoch,
        manager.latest_checkpoint if manager else "",
        writer=writer,
        **eval_kwargs,
    )


def choose_checkpoint(tf, args, ckpt_dir: str):
    """Rank 0: point TensorFlow's checkpoint state at the newest complete checkpoint of the leader's folder,
    the --checkpoint-copy node and --checkpoint-to (fetched here first when it is elsewhere), so the
    CheckpointManager restores it; none complete: no state, a fresh start. Returns the Copier for saves."""
    import train_ckpt

    copies = []
    if args.checkpoint_copy:
        copies.append(train_ckpt.SshCopy(args.checkpoint_copy, os.path.abspath(ckpt_dir)))
    if args.checkpoint_to:
        copies.append(train_ckpt.S3Copy(args.checkpoint_to, args.s3_endpoint_url))
    try:
        path, place, manifest = train_ckpt.newest(ckpt_dir, copies, emit)
    except Exception as exc:  # a failed fetch: what is complete here is still good
        emit("warning", kind="checkpoint_fetch_failed", message=" ".join(str(exc).split())[:300])
        path, place, manifest = train_ckpt.newest(ckpt_dir, [], emit)
    state = os.path.join(ckpt_dir, "checkpoint")
    if path is None:
        if os.path.exists(state):
            os.remove(state)
    else:
        complete, _ = train_ckpt.scan_listing(*train_ckpt.local_listing(ckpt_dir))
        kept = [os.path.join(ckpt_dir, complete[n]["name"]) for n in sorted(complete)]  # by images, oldest first
        # Timestamps after the last preserved one: the manager counts these as its own and prunes them, fewest
        # images first, to --keep-checkpoints (without, a restart would keep every older checkpoint forever).
        now = time.time()
        quiet = tf.get_logger().level
        tf.get_logger().setLevel("ERROR")  # its deprecation note: the manager reads this very state file
        try:
            tf.compat.v1.train.update_checkpoint_state(
                ckpt_dir,
                path,
                all_model_checkpoint_paths=kept,
                all_model_checkpoint_timestamps=[now - len(kept) + i for i in range(len(kept))],
                last_preserved_timestamp=now - len(kept) - 1,
            )
        finally:
            tf.get_logger().setLevel(quiet)
        if place != "local":
            emit("checkpoint_fetched", images=manifest["images"], step=manifest["step"], place=place, path=path)
    return train_ckpt.Copier(copies, args.keep_checkpoints, emit)


def seal_checkpoint(copier, path: str, step: int, images: int, global_batch: int) -> None:
    """The manifest, written last, makes a saved checkpoint complete; then the copies, in the background."""
    import train_ckpt

    folder, name = os.path.split(path)
    manifest = train_ckpt.make_manifest(folder, name, step, images, global_batch)
    train_ckpt.write_manifest(folder, manifest)
    train_ckpt.prune_local(folder)
    if copier is not None:
        copier.submit(folder, manifest)


def spot_notice(tf, hvd, spot) -> bool:
    """Whether any node has an interruption notice (one tiny allreduce per step, only with --spot-poll)."""
    mine = 1 if spot is not None and spot.notice is not None else 0
    return int(hvd.allreduce(tf.constant(mine, tf.int32), op=hvd.Max, name="spot_notice").numpy()) > 0


def stop_for_spot(
    tf, hvd, args, manager, copier, epoch_var, step: int, steps_per_epoch: int, spot, images_var, global_batch: int
) -> int:
    """Checkpoint now (unless this step's is saved), wait for its copies, and stop every rank together."""
    if manager is not None:
        t = time.time()
        path = manager.latest_checkpoint or ""
        images = int(images_var.numpy())
        if not path.endswith(f"ckpt-{images}"):
            epoch_var.assign(step // steps_per_epoch)
            path = manager.save(checkpoint_number=images)
            seal_checkpoint(copier, path, step, images, global_batch)
            emit(
                "checkpoint",
                step=step,
                images=images,
                epoch=int(epoch_var.numpy()),
                path=path,
                seconds=time.time() - t,
                reason="spot",
            )
        if copier is not None:
            copier.wait()
        emit(
            "error",
            kind="spot_interruption",
            step=step,
            checkpoint=path,
            at=f"{time.time():.3f}",
            message=f"spot interruption notice: checkpoint {os.path.basename(path)} saved and copied; "
            "start the job again with the same command",
        )
    if spot is not None and spot.notice is not None:
        emit("spot_notice", rank=hvd.rank(), seen_at=f"{spot.seen_at:.3f}", action=spot.notice.get("action", ""))
    # Nobody exits before rank 0's checkpoint is safe; then only rank 0 says why (horovodrun ends every
    # process once one has exited non-zero: the others exit 0, so the job's status is rank 0's).
    hvd.allreduce(tf.constant(0, tf.int32), name="spot_saved")
    return EXIT_SPOT if hvd.rank() == 0 else 0


def replicas_agree(tf, hvd, variables: list, loss_scale_opt=None) -> tuple[bool, str, str]:
    """Whether every rank holds the same values of `variables` (a float64 sum and sum of squares of each,
    gathered), each rank's loss scale ("-" without loss scaling), and the first names that differ."""
    fp = tf.stack(
        [
            tf.stack([tf.reduce_sum(tf.cast(v, tf.float64)), tf.reduce_sum(tf.cast(v, tf.float64) ** 2)])
            for v in variables
        ]
    )
    scale = float(loss_scale_opt.loss_scale.numpy()) if loss_scale_opt is not None else -1.0
    every = hvd.allgather_object((fp.numpy().tolist(), scale))
    identical = all(f == every[0][0] and s == every[0][1] for f, s in every)
    scales = ",".join("-" if s < 0 else f"{s:g}" for _, s in every)
    differ = [v.name for i, v in enumerate(variables) if any(f[i] != every[0][0][i] for f, _ in every)]
    return identical, scales, ",".join(differ[:5]) or "-"


def evaluate(
    tf,
    hvd,
    args,
    model,
    step: int,
    steps_per_epoch: int,
    checkpoint: str,
    *,
    classes: int,
    val_files: list[str],
    writer=None,
    threads: int = 8,
    final: bool = True,
) -> int:
    """top-1 / top-5 over the validation shards, each record seen by exactly one rank; one collective at the end.
    A periodic one (final=False) says final=0 on its line and prints no JSON line for the sweep."""
    rank, size = hvd.rank(), hvd.size()
    # Batch-norm statistics are not averaged during training: every rank evaluates rank 0's model (the
    # one in the checkpoint), so the result does not depend on the number of processes.
    hvd.broadcast_variables(model.variables, root_rank=0)
    if args.synthetic:
        ds = synthetic_dataset(tf, args, classes, args.seed + 31 * rank + 1, args.eval_batch_size)
        limit = args.eval_steps or 10
    else:
        ds = eval_dataset(tf, args, val_files, rank, size, threads)
        limit = args.eval_steps
    k = min(5, classes)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    @tf.function
    def eval_step(images, labels):
        logits = tf.cast(model(_normalize(tf, images), training=False), tf.float32)
        top1 = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, 1), tf.float64))
        topk = tf.reduce_sum(tf.cast(tf.math.in_top_k(labels, logits, k), tf.float64))
        return tf.stack(
            [top1, topk, tf.cast(loss_fn(labels, logits), tf.float64), tf.cast(tf.shape(labels)[0], tf.float64)]
        )

    t = time.time()
    acc = tf.zeros(4, tf.float64)
    for i, (images, labels) in enumerate(ds):
        if limit is not None and i >= limit:
            break
        acc += eval_step(images, labels)
    top1, topk, loss, n = hvd.allreduce(acc, op=hvd.Sum, name="eval_sums").numpy()
    if rank == 0:
        n = int(n)
        top1_pct = 100.0 * top1 / max(n, 1)
        topk_pct = 100.0 * topk / max(n, 1)
        emit(
            "eval",
            step=step,
            epoch=step / steps_per_epoch,
            top1=round(top1_pct, 3),
            top5=round(topk_pct, 3),
            loss=loss / max(n, 1),
            examples=n,
            k=k,
            checkpoint=checkpoint or "",
            time=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            seconds=time.time() - t,
            size=size,
            final=final,
        )
        print(f"Validation: top-1 {top1_pct:.2f}%  top-5 {topk_pct:.2f}%  on {n} images at step {step}", flush=True)
        # for `clusterctl sweep` (its default metric is a JSON line's "metric")
        if final:
            print(
                json.dumps(
                    {
                        "metric": round(top1_pct, 3),
                        "top1": round(top1_pct, 3),
                        "top5": round(topk_pct, 3),
                        "eval_loss": float(loss / max(n, 1)),
                        "step": int(step),
                    }
                ),
                flush=True,
            )
        if writer is not None:
            with writer.as_default(step=step):
                tf.summary.scalar("eval/top1", top1_pct)
                tf.summary.scalar("eval/top5", topk_pct)
                tf.summary.scalar("eval/loss", loss / max(n, 1))
            writer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
