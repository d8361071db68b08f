"""The trainer's lines for machines (rank 0): `CLUSTERCTL-TRAIN <kind> key=value ...` events, values
shell-quoted when needed, and the table (workloads/train/log.py reads both back)."""

from __future__ import annotations

import shlex
import time
from typing import Any

MARK = "CLUSTERCTL-TRAIN"
COLUMNS = ("Step", "Epoch", "img/s", "Loss", "TotalLoss", "LR", "Elapsed")
_WIDTHS = (7, 7, 10, 9, 10, 10, 9)
STARTED = time.time()  # "Elapsed": seconds since this process started


def _fmt(value: object) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}"
    return shlex.quote(str(value))


def emit(event: str, **fields: object) -> None:
    print(" ".join([MARK, event] + [f"{k}={_fmt(v)}" for k, v in fields.items()]), flush=True)


def table_header() -> None:
    print(" ".join([MARK, *(f"{c:>{w}}" for c, w in zip(COLUMNS, _WIDTHS))]), flush=True)


def table_row(step: int, epoch: float, img_per_sec: float, loss: float, total: float, lr: float) -> None:
    print(
        f"{MARK} {step:>7d} {epoch:>7.2f} {img_per_sec:>10.1f} {loss:>9.4f} {total:>10.4f} {lr:>10.6f} "
        f"{time.time() - STARTED:>9.1f}",
        flush=True,
    )


def mean_losses(tf: Any, hvd: Any, sums: Any) -> tuple[float, float]:
    """The loss and the total loss of every rank, averaged over the steps since the last table line, and `sums`
    (loss, total loss, steps) zeroed for the next. A collective: every rank calls it."""
    means = hvd.allreduce(sums.read_value(), op=hvd.Average, name="log_sums").numpy()
    sums.assign(tf.zeros(3, tf.float64))
    return means[0] / max(means[2], 1), means[1] / max(means[2], 1)
