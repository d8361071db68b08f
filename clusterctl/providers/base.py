"""The Provider protocol: what every place nodes come from (a cloud, this machine) must answer.

Providers return typed values only; their API responses never leave their module. Everything after
launch (waiting for ssh, pinning host keys, handing out the cluster key, the hosts file) is common
code in provision.py, the same for every provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from clusterctl.types import Cluster, ClusterSpec, Node


@dataclass(frozen=True)
class ClusterKeys:
    operator_public: str  # authorized on every node; its private half stays on the operator's machine
    internal_public: str  # authorized on every node; its private half is handed to every node
    operator_private_path: str


@dataclass(frozen=True)
class Launched:
    cluster: Cluster
    # Host keys known at creation, by address ("ssh-ed25519 AAAA..."). Hosts missing here are pinned at
    # first contact, recorded, and never re-accepted silently.
    host_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What `up` would create, said before anything is created (no mutating call)."""

    lines: tuple[str, ...]
    hourly_usd: float | None = 0.0  # the whole cluster; None when a price is unknown
    prices_date: str | None = None  # the date of the built-in price table, when prices come from it


@dataclass(frozen=True)
class NodeStatus:
    node: Node
    state: str  # "running", "pending", "stopped", ...
    zone: str = ""
    launched_at: float | None = None  # epoch seconds
    hourly_usd: float | None = None


@dataclass(frozen=True)
class ClusterStatus:
    """A cluster as the provider sees it now (for `ls` and `status`)."""

    name: str
    provider: str
    region: str
    instance_type: str
    nodes: tuple[NodeStatus, ...]
    other: tuple[str, ...] = ()  # resources without nodes (e.g. a VPC left by an interrupted `up`)

    @property
    def hourly_usd(self) -> float | None:
        running = [n for n in self.nodes if n.state in ("pending", "running")]
        if any(n.hourly_usd is None for n in running):
            return None
        return sum(n.hourly_usd or 0.0 for n in running)

    def cost_so_far(self, now: float) -> float | None:
        total = 0.0
        for n in self.nodes:
            if n.launched_at is None or n.hourly_usd is None:
                return None
            if n.state in ("pending", "running"):
                total += max(0.0, now - n.launched_at) / 3600.0 * n.hourly_usd
        return total


@dataclass(frozen=True)
class Found:
    """One resource a provider made for a cluster, found by its tag or name alone (for `gc`)."""

    cluster: str
    kind: str  # "instance", "VPC", "IAM role", "namespace" ...
    id: str
    created_at: float | None = None  # epoch seconds, where the provider says
    owner: str = ""  # user@host that made it, where known
    state: str = ""
    cluster_id: str = ""  # the cluster's random id (AWS `clusterctl:id`); "" for clusters made before ids

    def line(self) -> str:
        return f"{self.kind} {self.id}" + (f" ({self.state})" if self.state else "")


@dataclass(frozen=True)
class Teardown:
    removed: tuple[str, ...]  # one line per resource removed
    left: tuple[str, ...]  # what a final sweep still found (empty when all is gone)

    @property
    def clean(self) -> bool:
        return not self.left


class Provider(Protocol):
    name: str

    def plan(self, spec: ClusterSpec) -> Plan:
        """What `up` will create and what it costs per hour (read-only calls only)."""

    def dry_run(self, spec: ClusterSpec) -> list[str]:
        """Ask the provider whether `up` would be allowed, without creating anything (EC2 DryRun)."""

    def launch(self, spec: ClusterSpec, keys: ClusterKeys) -> Launched:
        """Create all nodes or none; found again by tags/names on re-run."""

    def host_keys(self, cluster: Cluster) -> Mapping[str, tuple[str, ...]]:
        """Host keys learned out of band once the nodes answer ssh (e.g. cloud-init's console output),
        by ssh address. Nodes missing here are pinned at first contact."""

    def find(self, name: str) -> Cluster | None:
        """The cluster as the provider sees it, from tags/names alone (no local state needed)."""

    def status(self, name: str) -> ClusterStatus | None:
        """Nodes, states, zones, launch times and prices, from the provider alone."""

    def resources(self, name: str) -> list[str]:
        """One line per resource the cluster holds (what `down` is about to remove)."""

    def terminate(self, name: str) -> Teardown:
        """Remove everything the cluster created, found by tags/names, and prove it is gone."""

    def all_clusters(self) -> list[str]:
        """Names of every cluster of this provider that still has resources."""
