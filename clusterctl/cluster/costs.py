"""What a run costs, from the built-in price table and the img/s measured on the cluster.

Pure except for the small per-cluster file `measured.json` (the last `bench` rate, for `train`'s estimate).
Prices are the dated on-demand table of providers/aws/catalog.py (instances only; disks are cents): an
estimate, not a bill.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster

if TYPE_CHECKING:
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster

IMAGENET_TRAIN_IMAGES = 1_281_167


def hourly(cluster: Cluster | None) -> float | None:
    """The cluster's $/hour (instances, built-in table); 0 for local clusters; None when unknown."""
    if cluster is None:
        return None
    if cluster.shares_this_machine:  # nothing billed
        return 0.0
    from clusterctl.providers.aws import catalog as aws_catalog

    each = aws_catalog.instance_price(cluster.instance_type)
    return None if each is None else each * len(cluster.nodes)


def run_cost(seconds: float, per_hour: float | None) -> float | None:
    return None if per_hour is None else per_hour * seconds / 3600.0


def epoch_line(
    img_per_sec: float,
    per_hour: float | None,
    images: int = IMAGENET_TRAIN_IMAGES,
    epochs: float = 1.0,
    what: str = "one ImageNet epoch",
) -> str:
    """'at 1,234 img/s, one ImageNet epoch (1,281,167 images) takes 17m18s and costs about $X'."""
    seconds = images * epochs / img_per_sec if img_per_sec > 0 else None
    cost = run_cost(seconds, per_hour) if seconds is not None else None
    return f"at {img_per_sec:,.0f} img/s, {what} ({int(images * epochs):,} images) takes {duration(seconds)}" + (
        f" and costs about {money(cost)}" if cost is not None else " (price unknown)"
    )


def save_measured(store: StateStore, cluster_name: str, img_per_sec: float, np: int, model: str) -> None:
    from clusterctl.state import atomic_write

    if img_per_sec <= 0:
        return
    atomic_write(
        store.ensure_dir(cluster_name) / "measured.json",
        json.dumps({"img_per_sec": img_per_sec, "np": np, "model": model, "at": time.time()}) + "\n",
    )


def load_measured(store: StateStore, cluster_name: str) -> dict[str, Any] | None:
    try:
        measured = json.loads((store.cluster_dir(cluster_name) / "measured.json").read_text())
    except (OSError, ValueError):
        return None
    return measured if isinstance(measured, dict) else None
