"""The trainer's options and command line (the node package's `train`, clusterctl/node/train/), pure: TrainOptions, the argv built
from them, Horovod's environment for every rank, and the checks of the paths and the S3 location they name.
workloads/train/plan.py turns them into the launch, train/start.py runs it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from clusterctl import s3uri
from clusterctl.errors import UsageError, within
from clusterctl.node.train.options import (
    INPUTS as TRAINER_INPUTS,
    PRECISIONS as PRECISIONS,  # the trainer's own choices
    RECIPES as _RECIPE_VALUES,
)

PROGRAM = "train"  # the node package's program (clusterctl/node/train/main.py)


# ---- the command line ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainOptions:
    """What `clusterctl train` passes to the trainer; None leaves the trainer's default."""

    data: str | None = None
    synthetic: bool = False
    model: str = "resnet50"
    epochs: float | None = None
    batch_size: int | None = None
    model_dir: str | None = None
    image_size: int | None = None
    max_steps: int | None = None
    base_lr: float | None = None
    warmup_epochs: float | None = None
    checkpoint_every: int | None = None
    keep_checkpoints: int | None = None
    log_every: int | None = None
    mixed_precision: bool = False
    precision: str | None = None  # auto | fp32 | float16 | bfloat16 | mixed (the trainer's default: auto)
    fp16_allreduce: bool | None = None  # None: the GPU type's default (train/config.py)
    recipe: str | None = None  # nvidia | goyal (None: the trainer's default, nvidia)
    input: str | None = None  # auto | tfdata | dali (None: auto); `train` resolves auto before the launch
    eval_every: int | None = None  # epochs between evaluations during training
    fusion_threshold_mb: float | None = None  # Horovod's tensor fusion buffer (an environment variable, not a flag)
    cycle_time_ms: float | None = None  # Horovod's cycle time (likewise)
    xla: bool | None = None  # None: the GPU type's default (train/config.py)
    no_eval: bool = False
    eval_only: bool = False
    no_gpu: bool = False
    expect_size: int | None = None
    checkpoint_copy: str | None = None  # a second node (as the leader's ssh reaches it) keeping a copy
    checkpoint_to: str | None = None  # s3://bucket/prefix keeping a copy
    spot_poll: float | None = None  # seconds between polls of the spot interruption notice
    elastic: bool = False  # Elastic Horovod: the run goes on when a node is lost, and takes new ones
    min_np: int | None = None  # elastic: fewest processes to go on with (None: 1)
    max_np: int | None = None  # elastic: most processes (None: the slots at launch)
    commit_every: int | None = None  # elastic: steps between commits of the state (None: the trainer's 50)
    elastic_timeout: int | None = None  # elastic: seconds to wait for --min-np processes (None: ELASTIC_TIMEOUT_S)
    extra: tuple[str, ...] = ()  # more trainer flags, passed as they are
    allow_socket_transport: bool = False  # on an EFA type, go on when NCCL did not choose EFA (an env, not a flag)

    def __post_init__(self) -> None:
        """Every way in (the CLI, a playbook's train step, a job record read back) gets the same checks: each
        option's own (CHECKS), then the pairs that may not go together. A UsageError names the flag."""
        for name, check in CHECKS.items():
            value = getattr(self, name)
            if value is not None:
                check(FLAGS[name], value)
        if self.synthetic and self.data:
            raise UsageError("give --data DIR or --synthetic (one of them)", "not both")
        elastic_only = [FLAGS[n] for n in ELASTIC_ONLY if getattr(self, n) is not None]
        if elastic_only and not self.elastic:
            raise UsageError(f"{', '.join(elastic_only)}: for elastic runs only", "add --elastic")
        if self.elastic and (self.eval_every or self.eval_only):
            raise UsageError(
                "--elastic trains at a changing size: --eval-every and --eval-only do not apply",
                "evaluate at the end (the default) or afterwards with `clusterctl eval`",
            )
        if self.min_np is not None and self.max_np is not None and self.min_np > self.max_np:
            raise UsageError(f"--min-np {self.min_np} is more than --max-np {self.max_np}")
        if self.synthetic and self.input == "dali":
            raise UsageError("--input dali decodes records: it needs --data DIR", "drop --input or --synthetic")
        if self.mixed_precision and self.precision is not None:
            raise UsageError("--mixed-precision and --precision/--fp32 say different things", "give one of them")

    def require_source(self) -> TrainOptions:
        """A job's options: data or synthetic images (a record of neither is no job to start)."""
        if not self.synthetic and not self.data:
            raise UsageError("give --data DIR or --synthetic (one of them)")
        return self


_VALUE_FLAGS = (
    ("data", "--data"),
    ("model", "--model"),
    ("epochs", "--epochs"),
    ("batch_size", "--batch-size"),
    ("model_dir", "--model-dir"),
    ("image_size", "--image-size"),
    ("max_steps", "--max-steps"),
    ("base_lr", "--base-lr"),
    ("warmup_epochs", "--warmup-epochs"),
    ("checkpoint_every", "--checkpoint-every"),
    ("precision", "--precision"),
    ("recipe", "--recipe"),
    ("input", "--input"),
    ("eval_every", "--eval-every"),
    ("keep_checkpoints", "--keep-checkpoints"),
    ("log_every", "--log-every"),
    ("expect_size", "--expect-size"),
    ("checkpoint_copy", "--checkpoint-copy"),
    ("checkpoint_to", "--checkpoint-to"),
    ("spot_poll", "--spot-poll"),
    ("commit_every", "--commit-every"),
)
_SWITCHES = (
    ("synthetic", "--synthetic"),
    ("mixed_precision", "--mixed-precision"),
    ("xla", "--xla"),
    ("no_eval", "--no-eval"),
    ("eval_only", "--eval-only"),
    ("no_gpu", "--no-gpu"),
    ("fp16_allreduce", "--fp16-allreduce"),
    ("elastic", "--elastic"),
)
# horovodrun's, not the trainer's: workloads/train/plan.py passes them to horovod.Elastic
_ELASTIC_FLAGS = (("min_np", "--min-np"), ("max_np", "--max-np"), ("elastic_timeout", "--elastic-timeout"))
ELASTIC_ONLY = ("min_np", "max_np", "commit_every", "elastic_timeout")
FLAGS = dict(
    _VALUE_FLAGS + _ELASTIC_FLAGS, fusion_threshold_mb="--fusion-threshold-mb", cycle_time_ms="--cycle-time-ms"
)
# Horovod's own default for --elastic-timeout (runner/elastic/driver.py ELASTIC_TIMEOUT_SECS): how long an
# elastic job waits for --min-np processes' hosts before it stops.
ELASTIC_TIMEOUT_S = 600
MODELS = ("resnet50", "tiny")
RECIPES = tuple(_RECIPE_VALUES)  # the trainer's own: nvidia (its default), goyal
INPUTS = ("auto", *TRAINER_INPUTS)  # auto: train_feed.choose_input decides on the measured feed
# Horovod's tensor fusion buffer as its tensor-fusion docs give it (64 MB; 0.21+ builds default to 128 MB)
# and its cycle time (1 ms, its default since 0.21): set explicitly so every rank runs with the same.
FUSION_THRESHOLD_MB = 64.0
CYCLE_TIME_MS = 1.0


# ---- the checks, one per option (the trainer's own argparse checks the same, later and on the node) ----------
def _at_least(low: float) -> Callable[[str, Any], None]:
    return lambda flag, value: within(flag, value, low)


def _positive(flag: str, value: float) -> None:
    within(flag, value, above=0)


def _one_of(choices: tuple[str, ...]) -> Callable[[str, Any], None]:
    def check(flag: str, value: str) -> None:
        if value not in choices:
            raise UsageError(f"unknown {flag[2:]} {value!r}", f"use one of {', '.join(choices)}")

    return check


def _path(flag: str, value: str) -> None:
    if value.startswith("-"):
        raise UsageError(f"{flag} {value!r}: a path may not start with '-'", "write ./" + value)


def _s3(flag: str, value: str) -> None:
    check_s3_uri(value)


CHECKS: dict[str, Callable[[str, Any], None]] = {
    "data": _path,
    "model": _one_of(MODELS),
    "epochs": _positive,
    "batch_size": _at_least(1),
    "model_dir": _path,
    "image_size": _at_least(1),
    "max_steps": _at_least(1),
    "base_lr": _at_least(0),
    "warmup_epochs": _at_least(0),
    "checkpoint_every": _at_least(0),  # 0: at epoch ends only
    "keep_checkpoints": _at_least(1),
    "log_every": _at_least(1),
    "precision": _one_of(PRECISIONS),
    "recipe": _one_of(RECIPES),
    "input": _one_of(INPUTS),
    "eval_every": _at_least(1),
    "fusion_threshold_mb": _at_least(0),
    "cycle_time_ms": _positive,
    "expect_size": _at_least(1),
    "checkpoint_to": _s3,
    "spot_poll": _positive,
    "min_np": _at_least(1),
    "max_np": _at_least(1),
    "commit_every": _at_least(1),
    "elastic_timeout": _at_least(1),
}


def horovod_env(opts: TrainOptions) -> dict[str, str]:
    """HOROVOD_FUSION_THRESHOLD (bytes) and HOROVOD_CYCLE_TIME (ms) for every rank (both checked by TrainOptions)."""
    mb = FUSION_THRESHOLD_MB if opts.fusion_threshold_mb is None else opts.fusion_threshold_mb
    ms = CYCLE_TIME_MS if opts.cycle_time_ms is None else opts.cycle_time_ms
    return {"HOROVOD_FUSION_THRESHOLD": str(int(mb * 1024 * 1024)), "HOROVOD_CYCLE_TIME": f"{ms:g}"}


def check_s3_uri(uri: str) -> s3uri.S3Uri:
    """Where --checkpoint-to keeps a copy: a bucket and a prefix (the nodes may write there only);
    UsageError for anything else."""
    example = "give one like s3://my-bucket/checkpoints/run1"
    try:
        loc = s3uri.parse(uri)
    except ValueError as exc:
        raise UsageError(f"--checkpoint-to {uri!r} is not an S3 location ({exc})", example) from None
    if not loc.prefix:
        raise UsageError(f"--checkpoint-to {uri!r} needs a prefix (the nodes may write there only)", example)
    return loc


def trainer_argv(python: str, pyz: str, opts: TrainOptions) -> list[str]:
    """`python PYZ train --flag value ...`: the node package's trainer (clusterctl/node/train/), an argv (quote it
    with shlex.join)."""
    return [python, pyz, PROGRAM, *trainer_flags(opts)]


def trainer_flags(opts: TrainOptions) -> list[str]:
    """The trainer's flags for `opts` (what follows `python PYZ train`)."""
    opts.require_source()  # each option was checked when opts was made
    argv: list[str] = []
    for name, flag in _VALUE_FLAGS:
        value = getattr(opts, name)
        if value is None or (name == "data" and opts.synthetic) or (name == "input" and value == "auto"):
            continue
        text = f"{value:g}" if isinstance(value, float) else str(value)
        argv += [flag, text]
    argv += [flag for name, flag in _SWITCHES if getattr(opts, name)]
    return argv + list(opts.extra)
