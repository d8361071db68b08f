"""How clusterctl reaches a cluster it made: the cluster's files here (its keys, pinned known_hosts, hosts
file), one ssh target per node (a member without a public address through the leader) and the ssh settings
(its own key and known_hosts only, no agent). Every command that talks to a cluster reads these; only
`up`/`down` load cluster/provision.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.hostsfile import HostsFile
from clusterctl.remote.targets import SshSettings, SshTarget
from clusterctl.state import StateStore
from clusterctl.types import Cluster, Node


@dataclass(frozen=True)
class ClusterPaths:
    dir: Path

    @property
    def operator_key(self) -> Path:
        return self.dir / "id_ed25519"

    @property
    def internal_key(self) -> Path:
        return self.dir / "internal_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "known_hosts"

    @property
    def hosts(self) -> Path:
        return self.dir / "hosts"


def paths(store: StateStore, name: str) -> ClusterPaths:
    return ClusterPaths(store.cluster_dir(name))


def hosts_file(cluster: Cluster) -> HostsFile:
    return HostsFile.from_pairs((n.private_ip, n.slots) for n in cluster.nodes)


def behind_leader(cluster: Cluster, node: Node) -> bool:
    """A member without a public address in a cluster whose leader has one (EC2 gives none to instances with
    several network interfaces; the leader has an Elastic IP): reached through the leader."""
    return node.role != "leader" and not node.public_ip and bool(cluster.nodes and cluster.leader.public_ip)


def ssh_targets(cluster: Cluster, store: StateStore) -> list[SshTarget]:
    key = str(paths(store, cluster.name).operator_key)
    direct = [
        SshTarget(label=n.ssh_host, hostname=n.ssh_host, port=n.ssh_port, user=n.ssh_user, identity_files=(key,))
        for n in cluster.nodes
    ]
    leader = direct[0] if direct else None
    return [
        SshTarget(t.label, t.hostname, t.port, t.user, t.identity_files, proxy_jump=leader)
        if behind_leader(cluster, n)
        else t
        for n, t in zip(cluster.nodes, direct)
    ]


def ssh_settings(cluster: Cluster, store: StateStore, connect_timeout: float = 10.0) -> SshSettings:
    return SshSettings(known_hosts=str(paths(store, cluster.name).known_hosts), connect_timeout=connect_timeout)
