"""The trainer's flags (parse_args: one check per flag, a recipe's defaults filled in), its exit statuses and
its learning-rate schedule. Pure: no TensorFlow."""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from clusterctl.node.train import checkpoints

DESCRIPTION = "ImageNet training with TensorFlow 2 + Horovod, shipped to every node and launched by horovodrun."
PRECISIONS = ("auto", "fp32", "float16", "bfloat16", "mixed")  # the trainer's and the benchmark's --precision
INPUTS = ("tfdata", "dali")  # the trainer's --input; `clusterctl train --input auto` picks one before the launch
EXIT_SIZE_MISMATCH = 3
EXIT_CHECKPOINT = 4
EXIT_NO_DATA = 5
EXIT_BAD_LABELS = 6
EXIT_HPARAMS = 7
EXIT_SPOT = 8  # stopped after a spot interruption notice, its checkpoint saved and copied


# What a recipe sets when its flag is not given, and how it builds the model (not flags: RECIPE_MODEL).
# nvidia: NVIDIA DeepLearningExamples, TensorFlow/Classification/ConvNets at 729963dd; "sh" is its
# resnet50v1.5/training/DGX1_RN50_AMP_90E.sh (DGXA100_RN50_AMP_90E.sh and the FP32/TF32 scripts pass the same).
# goyal: Goyal et al. 2017, "Accurate, Large Minibatch SGD" (arXiv:1706.02677): 0.1 per 256 images, momentum
# 0.9, weight decay 1e-4, /10 at epochs 30, 60, 80 of 90 (the step schedule's 1/3, 2/3, 8/9), 5 warm-up
# epochs, no label smoothing, gamma 0 in each block's last batch norm.
RECIPES = {
    "nvidia": {
        "base_lr": 0.256,  # sh:29 --lr_init=0.256 per 256 images (utils/learning_rate.py:39-42 scales it linearly)
        "momentum": 0.875,  # sh:29 --momentum=0.875
        "weight_decay": 3.0517578125e-05,  # sh:29 --weight_decay=3.0517578125e-05 (1/32768)
        "warmup_epochs": 8.0,  # sh:29 --lr_warmup_epochs=8 (linear: utils/learning_rate.py:59-62)
        "lr_schedule": "cosine",  # sh:28 --cosine_lr
        "label_smoothing": 0.1,  # sh:28 --label_smoothing 0.1
        # resnet50v1.5/README.md:97 "Scale from 8% to 100%" (its code's area_range is [0.05, 1.0]:
        # utils/image_processing.py:58, utils/dali_utils.py:78; we keep the documented 8%)
        "min_crop_area": 0.08,
    },
    "goyal": {
        "base_lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 1e-4,
        "warmup_epochs": 5.0,
        "lr_schedule": "step",
        "label_smoothing": 0.0,
        "min_crop_area": 0.08,  # Inception-style scale augmentation (Szegedy et al. 2015): 8% to 100%
    },
}
DEFAULT_RECIPE = "nvidia"


@dataclass(frozen=True)
class ModelRecipe:
    """How a recipe initialises and regularises the network (node/train/model.py, main.py)."""

    fan: str  # He-normal's fan for the conv kernels
    he_classifier: bool  # the classifier's kernel He-normal as the convs' (else N(0, 0.01))
    zero_last_gamma: bool  # gamma 0 in the last batch norm of every residual block
    decay_all_but_bn: bool  # weight decay on every trainable variable but batch norm's (else on kernels only)


RECIPE_MODEL = {
    # sh:32 --weight_init=fan_in, used by model/resnet.py:89-99 for conv and dense kernels (truncated normal,
    # scale 2); model/resnet.py:83 every gamma 1; model/resnet.py:283-293 L2 on all but batch norm.
    "nvidia": ModelRecipe(fan="fan_in", he_classifier=True, zero_last_gamma=False, decay_all_but_bn=True),
    # the paper's zero gamma in each block's last batch norm; He fan_out conv kernels as torchvision's.
    "goyal": ModelRecipe(fan="fan_out", he_classifier=False, zero_last_gamma=True, decay_all_but_bn=False),
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


def default_model_dir(env: Mapping[str, str]) -> str:
    """train_out; one folder per trial under clusterctl sweep, whose trials share a working folder."""
    sweep, trial = env.get("CLUSTERCTL_SWEEP", ""), env.get("CLUSTERCTL_TRIAL", "")
    if sweep and trial:
        return os.path.join("train_out", os.path.basename(sweep), f"trial-{os.path.basename(trial)}")
    return "train_out"


def _s3_uri(text: str) -> str:
    try:
        checkpoints.parse_s3(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _has_dali() -> bool:
    """NVIDIA DALI is installed in this Python (looked up, not imported: the flags' checks stay fast)."""
    try:
        return importlib.util.find_spec("nvidia.dali") is not None
    except ModuleNotFoundError:  # no `nvidia` package at all
        return False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train", description=DESCRIPTION)
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
    d.add_argument(
        "--min-crop-area", type=float, default=None, help="smallest random crop, as a fraction of the image (0.08)"
    )
    d.add_argument(
        "--input",
        choices=INPUTS,
        default="tfdata",
        help="who decodes the JPEGs: tfdata (TensorFlow, on the CPUs) or dali (NVIDIA DALI: on the GPU where the "
        "rank has one, else DALI's CPU backend; node/train/dali.py)",
    )
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
        default=None,
        help="learning rate per 256 images; the peak is base-lr * global batch / 256 (nvidia 0.256, goyal 0.1)",
    )
    m.add_argument(
        "--recipe",
        choices=tuple(RECIPES),
        default=DEFAULT_RECIPE,
        help="nvidia: NVIDIA's TensorFlow ResNet-50 v1.5 scripts (lr 0.256, momentum 0.875, weight decay 1/32768 "
        "on all but batch norm, 8 warm-up epochs, cosine, label smoothing 0.1, He fan_in, every gamma 1); "
        "goyal: Goyal et al. 2017 (lr 0.1, momentum 0.9, weight decay 1e-4 on kernels, 5 warm-up epochs, "
        "/10 at 30/60/80 of 90 epochs, no label smoothing, He fan_out, last gamma of each block 0)",
    )
    m.add_argument(
        "--warmup-epochs", type=float, default=None, help="linear warm-up from ~0 to the peak (nvidia 8, goyal 5)"
    )
    m.add_argument(
        "--lr-schedule",
        choices=("cosine", "step", "poly"),
        default=None,
        help="decay after the warm-up (step: /10 at 1/3, 2/3 and 8/9 of the epochs); default: the recipe's",
    )
    m.add_argument("--momentum", type=float, default=None, help="default: the recipe's (nvidia 0.875, goyal 0.9)")
    m.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="L2 (nvidia: 3.0517578125e-05 on all but batch norm; goyal: 1e-4 on kernels)",
    )
    m.add_argument("--label-smoothing", type=float, default=None, help="default: the recipe's")
    m.add_argument(
        "--precision",
        choices=PRECISIONS,
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
    if args.synthetic and args.input == "dali":
        p.error("--input dali decodes records: give --data DIR, not --synthetic")
    if args.input == "dali" and not _has_dali():
        p.error(
            "--input dali: NVIDIA DALI is not installed in this Python: GPU nodes' runtime carries it; "
            "on CPU nodes bring the cluster up with `clusterctl up --runtime dali`"
        )
    if not 0 < args.min_crop_area <= 1:  # after the recipe's values are filled in
        p.error("--min-crop-area must be in (0, 1]")
    if args.elastic and (args.eval_every or args.expect_size or args.eval_only):
        p.error("--elastic trains at a changing size: --eval-every, --expect-size and --eval-only do not apply")
    if args.image_size is None:
        args.image_size = 224 if args.model == "resnet50" else 32
    if args.eval_batch_size is None:
        args.eval_batch_size = args.batch_size
    return args


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
