"""What a run costs, from the built-in price table and the img/s measured on the cluster.

Pure except for the small per-cluster file `measured.json` (the `bench` rates by configuration, for `train`'s estimate).
Prices are the dated on-demand table of providers/aws/catalog.py (instances only; disks are cents): an
estimate, not a bill.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

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


def save_measured(
    store: StateStore, cluster_name: str, img_per_sec: float, np: int, model: str, config: Mapping[str, Any]
) -> None:
    """Keep a measured rate under its configuration's key (train_config.TrainConfig.key()): `train` estimates
    only from a rate of the configuration it runs. Rates of other configurations stay beside it."""
    from clusterctl.state import atomic_write

    if img_per_sec <= 0:
        return
    path = store.ensure_dir(cluster_name) / "measured.json"
    rates = _rates(path)
    rates[str(config["key"])] = {
        "img_per_sec": img_per_sec,
        "np": np,
        "model": model,
        "config": dict(config),
        "at": time.time(),
    }
    atomic_write(path, json.dumps({"rates": rates}, indent=1, sort_keys=True) + "\n")


def load_measured(store: StateStore, cluster_name: str, key: str) -> dict[str, Any] | None:
    """The rate measured for the configuration `key`, or None (a file of an older clusterctl kept one rate
    without its configuration: never used)."""
    measured = _rates(store.cluster_dir(cluster_name) / "measured.json").get(key)
    return measured if isinstance(measured, dict) else None


def _rates(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    rates = data.get("rates") if isinstance(data, dict) else None
    return dict(rates) if isinstance(rates, dict) else {}
