"""The Provider protocol: what every place nodes come from (a cloud, this machine) must answer.

Providers return typed values only; their API responses never leave their module. Everything after
launch (waiting for ssh, pinning host keys, handing out the cluster key, the hosts file) is common
code in provision.py, the same for every provider.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

from clusterctl.types import Cluster, ClusterSpec


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
class Teardown:
    removed: tuple[str, ...]  # one line per resource removed
    left: tuple[str, ...]  # what a final sweep still found (empty when all is gone)

    @property
    def clean(self) -> bool:
        return not self.left


class Provider(Protocol):
    name: str

    def plan(self, spec: ClusterSpec) -> list[str]:
        """Human lines saying what `up` will create (no mutation)."""

    def launch(self, spec: ClusterSpec, keys: ClusterKeys) -> Launched:
        """Create all nodes or none; found again by tags/names on re-run."""

    def find(self, name: str) -> Cluster | None:
        """The cluster as the provider sees it, from tags/names alone (no local state needed)."""

    def terminate(self, name: str) -> Teardown:
        """Remove everything the cluster created, found by tags/names, and prove it is gone."""

    def all_clusters(self) -> list[str]:
        """Names of every cluster of this provider that still has resources."""
