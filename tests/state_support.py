"""A cluster record as `up` writes it, for the tests that need one without bringing nodes up."""

from __future__ import annotations

from pathlib import Path

from clusterctl.state import Record, StateStore
from clusterctl.types import Cluster, Node


def sample(name: str = "alpha", nodes: int = 2, slots: int = 2, public: bool = False) -> Cluster:
    """A local cluster of `nodes` (leader first) at 10.9.0.2...; with `public`, each with a public address."""
    roles = ["leader", *(f"member-{i}" for i in range(1, nodes))]
    return Cluster(
        name=name,
        provider="local",
        created_at=1000.0,
        extra={"bridge": "ccbx"},
        nodes=tuple(
            Node(
                f"{name}-{role}",
                f"10.9.0.{2 + i}",
                slots,
                "leader" if i == 0 else "member",
                public_ip=f"198.51.100.{10 + i}" if public else None,
            )
            for i, role in enumerate(roles)
        ),
    )


def save_record(home: Path, cluster: Cluster) -> None:
    StateStore(home).save(Record(cluster, "up", 1.0))
