"""Local nodes replaced, and removed, for `repair` and `up`'s resize: a fresh namespace node at a lost node's address
and name, the lost one's home kept aside until its replacement is verified (retire_nodes), put back when the
replacement is removed instead (remove_nodes).
"""

from __future__ import annotations

import ipaddress
import shutil
import time
from pathlib import Path
from typing import Sequence

from clusterctl.providers.base import ClusterKeys, Launched, LostNode
from clusterctl.providers.local import boot, netns
from clusterctl.providers.local.netns import node_index
from clusterctl.state import StateStore
from clusterctl.types import Cluster, Node


def replace_nodes(store: StateStore, cluster: Cluster, lost: Sequence[Node], keys: ClusterKeys) -> Launched:
    """A fresh namespace node (new home, new /opt, new host key) at each lost node's address and name; with
    autostop, the watchdog's settings in its home and, for a new leader, its supervisor, as `up` gives them.
    The old node's home is kept aside (NODES/INDEX.replaced-TIME) until retire_nodes, after its replacement is
    verified; remove_nodes of the replacement puts it back."""
    from clusterctl.autostop import watchdog
    from clusterctl.providers.local import supervisor

    netns.require_root()
    subnet = ipaddress.IPv4Network(cluster.extra["subnet"])
    bridge = cluster.extra["bridge"]
    everyone = [boot.NodeSpec(node_index(cluster.name, n), n.name, n.private_ip) for n in cluster.nodes]
    authorized = f"{keys.operator_public}\n{keys.internal_public}\n"
    nodes_root = store.ensure_dir(cluster.name) / "nodes"
    made: list[boot.NetNode] = []
    autostop = cluster.facts.autostop
    leader = autostop is not None and any(node_index(cluster.name, n) == 0 for n in lost)
    if leader:  # its supervisor would start a watchdog in the new leader before its settings are there
        supervisor.stop_supervisor(cluster.name)
    try:
        for node in lost:
            index = node_index(cluster.name, node)
            netns.destroy_node(cluster.name, index)
            if (nodes_root / str(index)).exists():  # a new machine: nothing of the old, which is kept aside
                (nodes_root / str(index)).rename(nodes_root / f"{index}.replaced-{time.time_ns()}")
            spec = boot.NodeSpec(index, node.name, node.private_ip)
            made.append(
                boot.create_node(
                    cluster.name, bridge, subnet, spec, everyone, nodes_root / str(index), authorized, node.ssh_port
                )
            )
        for n in made:
            netns.forget_address(cluster.name, bridge, n.address)  # the old node's MAC, cached here and in peers
        for n in made:
            boot.wait_port(n.address, 22, 60.0, n.pid, nodes_root / str(n.index) / "sshd.log")
        if autostop is not None:  # a new home has no watchdog settings; a new leader needs its supervisor
            watchdog.install_local(store, cluster.name, [n.index for n in made], autostop, cluster.created_at)
            if leader:
                supervisor.start_supervisor(store, cluster.name)
    except BaseException:
        for n in made:
            netns.destroy_node(cluster.name, n.index)
        raise
    return Launched(
        Cluster(cluster.name, cluster.provider, tuple(lost), cluster.region, cluster.instance_type, time.time()),
        {n.address: (n.host_public_key,) for n in made},
    )


def remove_nodes(store: StateStore, cluster: Cluster, nodes: Sequence[Node]) -> list[str]:
    """The nodes and their homes; where one replaced a lost node (a repair that failed), the lost node's home,
    kept aside, back in its place."""
    removed: list[str] = []
    for node in nodes:
        index = node_index(cluster.name, node)
        removed += netns.destroy_node(cluster.name, index)
        home = store.cluster_dir(cluster.name) / "nodes" / str(index)
        if home.exists():
            shutil.rmtree(home, ignore_errors=True)
            removed.append(f"node home {home}")
        aside = _aside(store, cluster, index)
        if aside:
            aside[-1].rename(home)
            removed.append(f"(the home of the node it replaced is back at {home})")
    return removed


def retire_nodes(store: StateStore, cluster: Cluster, lost: Sequence[LostNode]) -> list[str]:
    """The lost nodes' homes kept aside by replace_nodes, now that their replacements are verified."""
    removed = []
    for x in lost:
        for old in _aside(store, cluster, node_index(cluster.name, x.node)):
            shutil.rmtree(old, ignore_errors=True)
            removed.append(f"node home {old}")
    return removed


def _aside(store: StateStore, cluster: Cluster, index: int) -> list[Path]:
    """The homes of lost nodes at this index that replace_nodes kept aside, oldest first."""
    nodes = store.cluster_dir(cluster.name) / "nodes"
    found = nodes.glob(f"{index}.replaced-*") if nodes.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[1]))
