"""Which hosts a command talks to, and how: a hosts file of any cluster, or a cluster clusterctl made.

For a hosts file, ssh behaves as the user's own `ssh HOST` would (OpenSSH's reading of ~/.ssh/config or
--ssh-config: per host UserKnownHostsFile, HostKeyAlias, IdentityAgent, ...; the caller's ssh-agent);
for a cluster, only its own key and its pinned known_hosts are used (no agent).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.cluster import reach
from clusterctl.hostsfile import HostsFile
from clusterctl.remote.targets import SshSettings, SshTarget, targets_from_hosts, user_known_hosts
from clusterctl.state import StateStore
from clusterctl.types import Cluster


@dataclass(frozen=True)
class Inventory:
    hosts: HostsFile
    targets: tuple[SshTarget, ...]
    settings: SshSettings
    cluster: Cluster | None = None  # set when the hosts are a clusterctl cluster


@dataclass(frozen=True)
class SshOverrides:
    user: str | None = None
    identity: tuple[str, ...] = ()
    known_hosts: str | None = None
    ssh_config: str | None = None
    connect_timeout: float = 10.0
    connect_timeout_given: bool = True  # False: a ConnectTimeout in the ssh config applies


def resolve(
    hosts_path: str | None,
    cluster_name: str | None,
    store: StateStore,
    ssh: SshOverrides = SshOverrides(),
    warn: Callable[[str], None] | None = None,
) -> Inventory:
    if hosts_path is not None:
        hf = HostsFile.read(hosts_path)
        cluster = _cluster_owning(hf, store)
        if cluster is not None and not (ssh.user or ssh.identity or ssh.known_hosts or ssh.ssh_config):
            return _for_cluster(cluster, store, ssh, hf)
        notes: list[str] = []
        targets = targets_from_hosts(
            hf.hosts,
            user=ssh.user,
            identity=ssh.identity,
            ssh_config=ssh.ssh_config,
            known_hosts=ssh.known_hosts,
            warnings=notes,
        )
        if ssh.connect_timeout_given:
            targets = [_without_config_timeout(t) for t in targets]
        from clusterctl.remote import sshidentities

        sshidentities.check_keys_usable(targets)
        if notes and warn is not None:
            for note in notes:
                warn(note)
        settings = SshSettings(
            known_hosts=str(Path(ssh.known_hosts).expanduser()) if ssh.known_hosts else user_known_hosts(),
            connect_timeout=ssh.connect_timeout,
            allow_agent=True,
        )
        return Inventory(hf, tuple(targets), settings)
    record = store.resolve(cluster_name)
    return _for_cluster(record.cluster, store, ssh, reach.hosts_file(record.cluster))


def _without_config_timeout(t: SshTarget) -> SshTarget:
    jump = _without_config_timeout(t.proxy_jump) if t.proxy_jump is not None else None
    return replace(t, connect_timeout=None, proxy_jump=jump)


def _for_cluster(cluster: Cluster, store: StateStore, ssh: SshOverrides, hf: HostsFile) -> Inventory:
    targets = reach.ssh_targets(cluster, store)
    if ssh.user or ssh.identity:
        targets = [
            replace(t, user=ssh.user or t.user, identity_files=tuple(ssh.identity) or t.identity_files) for t in targets
        ]  # members behind the leader stay behind it
    settings = reach.ssh_settings(cluster, store, ssh.connect_timeout)
    by_ip = {n.private_ip: t for n, t in zip(cluster.nodes, targets)}
    return Inventory(hf, tuple(by_ip[h] for h in hf.hosts), settings, cluster)


def _cluster_owning(hf: HostsFile, store: StateStore) -> Cluster | None:
    """The cluster whose hosts file this is (the ./hosts that `up` wrote, or a part of it), so its
    pinned keys are used. The current cluster wins when several hold these addresses."""
    try:
        records, _ = store.list()  # a damaged record owns no hosts file: `ls` names it
        current = store.current()
    except Exception:
        return None
    wanted = set(hf.hosts)
    records.sort(key=lambda r: r.cluster.name != current)
    for record in records:
        if wanted <= {n.private_ip for n in record.cluster.nodes}:
            return record.cluster
    return None


def subset(inv: Inventory, hosts: Sequence[str]) -> Inventory:
    keep = set(hosts)
    return Inventory(
        HostsFile(tuple(e for e in inv.hosts.entries if e.host in keep)),
        tuple(t for t in inv.targets if t.label in keep),
        inv.settings,
        inv.cluster,
    )
