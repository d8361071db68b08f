"""`clusterctl data tfrecords` as one library call: the conversion's options checked as one typed value, then
the conversion here (data/tfrecords.py) or on the cluster's leader (data/tfrecords_leader.py) while autostop
waits (cluster/autostop_control.py's lease: above both data/ and cluster/, so here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from clusterctl.errors import UsageError, within

if TYPE_CHECKING:
    from clusterctl.state import StateStore


@dataclass(frozen=True, kw_only=True)
class Conversion:
    """Image folders to ImageNet-format TFRecords, checked whole on construction."""

    src: str  # a folder here; with on="leader", a folder there or s3://bucket/prefix
    dst: str
    validation_fraction: float = 0.1
    train_shards: int | None = None
    validation_shards: int | None = None
    seed: int = 0
    force: bool = False
    val_labels: Path | None = None
    val_synsets: Path | None = None
    on: str | None = None  # None: here; "leader": the cluster's leader
    endpoint_url: str | None = None  # the S3 endpoint the leader uses for an s3:// src
    resize: int | None = None  # images whose shorter side is longer are scaled down to it

    def __post_init__(self) -> None:
        within("--train-shards", self.train_shards, 1)
        within("--validation-shards", self.validation_shards, 1)
        within("--resize", self.resize, 1)
        if self.on is None and (self.src.startswith("s3://") or self.endpoint_url):
            raise UsageError(
                "an s3:// SRC (and --endpoint-url) needs --on leader", "the leader reads it with its instance profile"
            )
        if self.on is not None and self.on != "leader":
            raise UsageError(f"--on {self.on!r}: only `--on leader` is understood")
        if self.endpoint_url is not None and not re.match(r"^https?://[^\s'\"]+$", self.endpoint_url):
            raise UsageError(f"--endpoint-url {self.endpoint_url!r} is not an http(s) URL")


def convert(
    conv: Conversion,
    leader: Callable[[], Any],
    store: StateStore,
    report: Callable[[str], None],
    warn: Callable[[str], None],
) -> Any:
    """Run the conversion; the dataset's info (splits, shards). `leader` resolves the cluster's inventory,
    called only for on="leader"; the leader's output goes to `report`."""
    from clusterctl.data import tfrecords, tfrecords_leader

    common: dict[str, Any] = dict(
        train_shards=conv.train_shards,
        validation_shards=conv.validation_shards,
        validation_fraction=conv.validation_fraction,
        seed=conv.seed,
        force=conv.force,
        val_labels=conv.val_labels,
        val_synsets=conv.val_synsets,
        resize=conv.resize,
    )
    if conv.on is None:
        return tfrecords.convert_folder(conv.src, conv.dst, **common)
    from clusterctl.cluster import autostop_control as autostop

    inv = leader()
    with autostop.lease(store, inv.cluster, "data", warn=warn):  # autostop waits for the conversion
        return tfrecords_leader.convert_on_leader(
            inv, conv.src, conv.dst, on_line=report, endpoint_url=conv.endpoint_url, **common
        )
