"""The training log read back: the trainer's `CLUSTERCTL-TRAIN` lines as typed values (train/status.py says
where the job is from them).

The trainer (the node package's train, rank 0) writes every line for machines with the `CLUSTERCTL-TRAIN` mark:
event lines `CLUSTERCTL-TRAIN <event> key=value ...` and the table

    CLUSTERCTL-TRAIN    Step   Epoch      img/s      Loss  TotalLoss         LR   Elapsed
    CLUSTERCTL-TRAIN      10    0.50     2735.0    1.7566     1.7588   0.125000       5.2

The mark may follow any prefix (horovodrun's `[0]<stdout>:`, a timestamp, tmux's log). One log may
hold several runs of one job (a crash, then a resumed run appended): each `start` line opens a run.
Pure: no TensorFlow, no ssh, no clock unless given one.
"""

from __future__ import annotations

import functools
import re
import shlex
import typing
from dataclasses import dataclass, field
from typing import Callable, Mapping, TypeVar

# The trainer's mark, columns and exit statuses, and horovodrun's exit when too few nodes are left: the node
# package's (what writes the log), imported, never restated.
from clusterctl.node.horovodrun import EXIT_TOO_FEW as EXIT_TOO_FEW
from clusterctl.node.train.log import COLUMNS as COLUMNS, MARK as MARK
from clusterctl.node.train.options import (
    EXIT_BAD_LABELS as EXIT_BAD_LABELS,
    EXIT_CHECKPOINT as EXIT_CHECKPOINT,
    EXIT_HPARAMS as EXIT_HPARAMS,
    EXIT_NO_DATA as EXIT_NO_DATA,
    EXIT_SIZE_MISMATCH as EXIT_SIZE_MISMATCH,
    EXIT_SPOT as EXIT_SPOT,
)

_MARKED = re.compile(rf".*{MARK}\s+(.*?)\s*$")  # the last mark of a line (two lines run together)
_HOROVOD_FAILED = re.compile(r"Horovod detected that one or more processes exited with non-zero status")
_PROCESS_NAME = re.compile(r"^\s*Process name:\s*(\S+)")
_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)")


# ---- the log ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrainRow:
    step: int
    epoch: float
    img_per_sec: float  # all processes together, over the steps since the previous row
    loss: float  # cross-entropy, mean over ranks and steps since the previous row
    total_loss: float  # with weight decay (the recipe's FinLoss)
    lr: float
    elapsed: float  # seconds since the trainer process started


@dataclass(frozen=True)
class CheckpointSaved:
    step: int
    epoch: int
    path: str  # .../ckpt-<images>
    images: int | None = None  # images seen, all ranks together: what orders checkpoints (None: not said)


@dataclass(frozen=True)
class EvalResult:
    step: int
    epoch: float
    top1: float  # percent
    top5: float  # percent (top-k with k = min(5, classes))
    loss: float
    examples: int
    checkpoint: str
    size: int  # processes that evaluated
    time: str  # UTC, ISO 8601


@dataclass(frozen=True)
class TrainStart:
    size: int
    model: str
    batch: int
    global_batch: int
    train_examples: int
    steps_per_epoch: int
    epochs: float
    total_steps: int
    stop_step: int
    start_step: int
    peak_lr: float
    fields: Mapping[str, str] = field(default_factory=dict)  # every field of the line, as text


@dataclass(frozen=True)
class TrainDone:
    step: int
    epoch: float
    complete: bool  # reached the last step of the schedule (not only --max-steps)
    elapsed: float
    img_per_sec: float


@dataclass(frozen=True)
class WorldSize:
    """An elastic run's change of size (node/train/elastic.py's `world_size` line)."""

    size: int
    was: int
    lost: tuple[str, ...]  # one entry per process lost (its host)
    joined: tuple[str, ...]
    images: int  # images seen when the run went on at the new size (its last commit)
    message: str  # `world size 3 -> 2 (lost 10.213.0.4)`


@dataclass(frozen=True)
class TrainEvent:
    kind: str  # warning / error
    fields: Mapping[str, str]


@dataclass(frozen=True)
class TrainRun:
    """One process lifetime of the job: from its `start` line to its end (or the end of the log)."""

    start: TrainStart | None  # None for an --eval-only run
    resumed_from: CheckpointSaved | None = None
    rows: tuple[TrainRow, ...] = ()
    checkpoints: tuple[CheckpointSaved, ...] = ()
    done: TrainDone | None = None
    eval: EvalResult | None = None
    warnings: tuple[TrainEvent, ...] = ()
    errors: tuple[TrainEvent, ...] = ()
    failure: str | None = None  # horovodrun's own verdict when a process died (e.g. "process 1 exited 137")
    evals: tuple[EvalResult, ...] = ()  # the --eval-every evaluations during training (final=0)
    resizes: tuple[WorldSize, ...] = ()  # an elastic run's changes of size, in order


@dataclass(frozen=True)
class TrainLog:
    runs: tuple[TrainRun, ...]

    @property
    def current(self) -> TrainRun | None:
        return self.runs[-1] if self.runs else None

    @property
    def eval(self) -> EvalResult | None:
        """The latest evaluation in the log."""
        for run in reversed(self.runs):
            if run.eval is not None:
                return run.eval
        return None


class _RunBuilder:
    def __init__(self, start: TrainStart | None):
        self.start = start
        self.resumed_from: CheckpointSaved | None = None
        self.rows: list[TrainRow] = []
        self.checkpoints: list[CheckpointSaved] = []
        self.done: TrainDone | None = None
        self.eval: EvalResult | None = None
        self.warnings: list[TrainEvent] = []
        self.errors: list[TrainEvent] = []
        self.failure: str | None = None
        self.evals: list[EvalResult] = []
        self.resizes: list[WorldSize] = []

    def build(self) -> TrainRun:
        return TrainRun(
            self.start,
            self.resumed_from,
            tuple(self.rows),
            tuple(self.checkpoints),
            self.done,
            self.eval,
            tuple(self.warnings),
            tuple(self.errors),
            self.failure,
            tuple(self.evals),
            tuple(self.resizes),
        )


def _kv(body: str, lineno: int) -> dict[str, str]:
    try:
        tokens = shlex.split(body)
    except ValueError as exc:
        raise ValueError(f"train log line {lineno}: {exc}: {body!r}") from None
    out: dict[str, str] = {}
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep or not key:
            raise ValueError(f"train log line {lineno}: {tok!r} is not key=value")
        out[key] = value
    return out


R = TypeVar("R")


@functools.cache
def _field_types(record: object) -> tuple[tuple[str, object], ...]:
    return tuple(typing.get_type_hints(record).items())


@dataclass(frozen=True)
class _Line:
    """One marked line's key=value fields, each read as the type it has."""

    fields: Mapping[str, str]
    lineno: int
    kind: str

    def _raw(self, key: str) -> str:
        if key not in self.fields:
            raise ValueError(f"train log line {self.lineno}: {self.kind} line has no {key}=")
        return self.fields[key]

    def _bad(self, key: str, what: str) -> ValueError:
        return ValueError(f"train log line {self.lineno}: {key}={self.fields[key]!r} is not a {what}")

    def text(self, key: str) -> str:
        return self._raw(key)

    def flag(self, key: str) -> bool:
        return self._raw(key) not in ("0", "false", "False", "")

    def whole(self, key: str) -> int:
        raw = self._raw(key)
        try:
            return int(float(raw)) if re.fullmatch(r"-?\d+(\.0*)?", raw) else int(raw)
        except ValueError:
            raise self._bad(key, "int") from None

    def real(self, key: str) -> float:
        raw = self._raw(key)
        try:
            return float(raw)
        except ValueError:
            raise self._bad(key, "float") from None

    def record(self, record: Callable[..., R], **given: object) -> R:
        """`record` (one of this module's) with every field not `given` read from the key of its name as its
        annotation says: int, float, str or bool, required; `int | None` is None when the line has no such key."""
        read: dict[object, Callable[[str], object]] = {
            int: self.whole,
            float: self.real,
            str: self.text,
            bool: self.flag,
        }
        values = dict(given)
        for name, hint in _field_types(record):
            if name in values:
                continue
            optional = [a for a in typing.get_args(hint) if a is not type(None)]
            if optional and name not in self.fields:
                values[name] = None
                continue
            values[name] = read[optional[0] if optional else hint](name)
        return record(**values)


def parse_train_log(text: str, strict: bool = True) -> TrainLog:  # noqa: C901 (one pass over the log, one branch per kind of marked line)
    """Read the trainer's output (horovodrun's, or rank 0's own). Lines without the mark are noise and
    skipped. A last line without its newline is still being written and is ignored. A marked line that
    does not parse raises ValueError naming its line number (strict), or is skipped (not strict: for
    watching a live job, whose log a crash may have cut anywhere)."""
    lines = text.splitlines()
    if lines and not text.endswith(("\n", "\r")):
        lines = lines[:-1]
    runs: list[TrainRun] = []
    cur: _RunBuilder | None = None
    failed_at: int | None = None
    for lineno, raw in enumerate(lines, start=1):
        line = raw.replace("\r", "")
        if failed_at is not None and cur is not None:
            m = _PROCESS_NAME.match(line)
            if m:
                cur.failure = f"process {m.group(1)} exited"
                continue
            m = _EXIT_CODE.match(line)
            if m and cur.failure and cur.failure.endswith("exited"):
                code = int(m.group(1))
                why = {137: " (killed: SIGKILL or out of memory)", 143: " (SIGTERM)", 139: " (segfault)"}.get(code, "")
                cur.failure += f" {code}{why}"
                continue
        if _HOROVOD_FAILED.search(line):
            if cur is None:
                cur = _RunBuilder(None)
            cur.failure = cur.failure or "a process exited with non-zero status"
            failed_at = lineno
            continue
        m = _MARKED.search(line)
        if not m:
            continue
        try:
            body = m.group(1)
            head = body.split(None, 1)[0] if body else ""
            if head == "Step":
                if tuple(body.split()) != COLUMNS:
                    raise ValueError(f"train log line {lineno}: table header {body.split()} is not {list(COLUMNS)}")
                continue
            if head[:1].isdigit():
                parts = body.split()
                if len(parts) != len(COLUMNS):
                    raise ValueError(f"train log line {lineno}: a table row needs {len(COLUMNS)} columns: {body!r}")
                try:
                    row = TrainRow(int(parts[0]), *(float(p) for p in parts[1:]))
                except ValueError:
                    raise ValueError(f"train log line {lineno}: not a table row: {body!r}") from None
                if cur is None:
                    cur = _RunBuilder(None)
                cur.rows.append(row)
                continue
            kind, _, rest = body.partition(" ")
            f = _kv(rest, lineno)
            g = _Line(f, lineno, kind)
            if kind == "device":
                continue  # which GPU each rank has: printed before `start`, read by horovod.parse_devices
            if kind == "start":
                started = g.record(TrainStart, fields=dict(f))
                if cur is not None:
                    runs.append(cur.build())
                failed_at = None
                cur = _RunBuilder(started)
                continue
            periodic = kind == "eval" and f.get("final") == "0"
            if kind == "eval" and not periodic and (cur is None or cur.eval is not None or cur.failure):
                # an --eval-only run (no start line), or a second evaluation after a finished one
                if cur is not None:
                    runs.append(cur.build())
                cur = _RunBuilder(None)
            if cur is None:
                cur = _RunBuilder(None)
            if kind == "resume":
                cur.resumed_from = g.record(CheckpointSaved, path=g.text("checkpoint"))
            elif kind == "checkpoint":
                cur.checkpoints.append(g.record(CheckpointSaved))
            elif kind == "done":
                cur.done = g.record(TrainDone)
            elif kind == "eval":
                result = g.record(
                    EvalResult, checkpoint=f.get("checkpoint", ""), size=int(f.get("size", "1")), time=f.get("time", "")
                )
                if periodic:
                    cur.evals.append(result)
                else:
                    cur.eval = result
            elif kind == "world_size":
                cur.resizes.append(
                    g.record(
                        WorldSize,
                        lost=tuple(h for h in f.get("lost", "").split(",") if h),
                        joined=tuple(h for h in f.get("joined", "").split(",") if h),
                        message=f.get("message", ""),
                    )
                )
            elif kind == "error":
                cur.errors.append(TrainEvent(kind, dict(f)))
            elif kind == "warning":
                cur.warnings.append(TrainEvent(kind, dict(f)))
            # other kinds: newer trainers may add some; nothing here needs them
        except ValueError:
            if strict:
                raise
    if cur is not None:
        runs.append(cur.build())
    return TrainLog(tuple(runs))


def parse_eval(text: str) -> EvalResult:
    """The latest top-1/top-5 in a trainer's output; ValueError (saying why, when it can) if there is none."""
    log = parse_train_log(text if text.endswith("\n") else text + "\n")
    result = log.eval
    if result is not None:
        return result
    for run in reversed(log.runs):
        if run.errors:
            e = run.errors[-1].fields
            raise ValueError(
                f"no evaluation: the trainer reported {e.get('kind', 'an error')}"
                + (f" ({e['message']})" if e.get("message") else "")
            )
        if run.failure:
            raise ValueError(f"no evaluation: {run.failure}")
    raise ValueError(f"no '{MARK} eval' line in the output")
