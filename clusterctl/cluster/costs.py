"""What a run costs, from the built-in price table and the img/s measured on the cluster.

Pure except for the small per-cluster file `measured.json` (the `bench` rates by configuration, for `train`'s estimate).
Prices are the provider's (Provider.hourly_price: AWS's dated on-demand table, instances only; disks are cents
an hour, and what a stopped cluster still costs per month): an estimate, not a bill.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from clusterctl.units import duration, money

if TYPE_CHECKING:
    from clusterctl.providers.base import ClusterStatus
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster

IMAGENET_TRAIN_IMAGES = 1_281_167


def hourly(cluster: Cluster | None) -> float | None:
    """The cluster's $/hour (instances, built-in table); 0 for local clusters; None when unknown."""
    if cluster is None:
        return None
    from clusterctl import providers

    return providers.of(cluster).hourly_price(cluster)


def stopped_line(monthly_usd: float | None) -> str:
    """What a stopped cluster still costs: its disks, per month (`ls`, `status`, `stop`)."""
    if monthly_usd is None:
        return "while stopped: its disks are billed (price unknown)"
    if monthly_usd == 0:
        return "while stopped: $0.00 (its homes are folders on this machine)"
    return f"while stopped: {money(monthly_usd)}/month for its disks (built-in prices; not a bill)"


def stopped_monthly(status: ClusterStatus | None, here: bool) -> float | None:
    """A cluster's disks per month, from its provider's status (`here`: a provider of this machine, whose
    stopped clusters are records only: nothing billed)."""
    if status is not None:
        return status.disks_monthly_usd
    return 0.0 if here else None


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
