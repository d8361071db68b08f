"""The built-in cluster: N namespace nodes with real sshd on this machine (see netns.py).

It proves the provider interface covers fixed machines and gives every user a cluster to try with
no cloud account. Resources are found by name (the local equivalent of tags). A cluster belongs to the
CLUSTERCTL_HOME that made it (netns.write_owner's mark: user@host:HOME, its real path): `down`, `gc` and `down
--all` from another home (another user's, a test's) leave it alone unless --force.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from clusterctl.errors import ConfigError, UsageError
from clusterctl.providers.base import (
    ClusterKeys,
    ClusterStatus,
    Found,
    Launched,
    LostNode,
    NodeFacts,
    NodeStatus,
    ObjectStore,
    Plan,
    Provider,
    Teardown,
)
from clusterctl.providers.local import boot, netns
from clusterctl.providers.local.netns import node_index
from clusterctl.providers.local.replace import remove_nodes, replace_nodes, retire_nodes
from clusterctl.state import StateStore, validate_name
from clusterctl.types import Cluster, ClusterSpec, Node, node_names

MAX_NODES = 250


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


@contextlib.contextmanager
def _net_lock() -> Iterator[None]:
    """One `up` at a time picks a subnet and makes its bridge, so two clusters never take the same one."""
    fd = os.open(netns.NET_LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class LocalProvider(Provider):
    name = "local"
    region = "local"
    builds_runtime_locally = True  # the nodes have this machine's OS: it builds their runtime
    lists_from_cloud = False  # its clusters are this machine's: the records here list them all
    shares_this_machine = True  # one kernel, these cores, no GPUs; the watchdog's files are here
    node_own_roots = ("$HOME", "/tmp", "/opt")  # the rest (/srv, /data, /mnt ...) is this machine's, shared by all
    up_flags = frozenset()  # nothing beyond the flags every provider takes
    title = "local"
    about = "namespace nodes on this machine"
    default_cluster = "local"

    def __init__(
        self,
        store: StateStore | None = None,
        region: str | None = None,
        report: Callable[[str], None] | None = None,
        force: bool = False,
    ) -> None:
        self.store = store or StateStore()  # region, report: the contract's, nothing here is regional or slow
        self.force = force  # down/gc may remove another CLUSTERCTL_HOME's cluster

    def me(self) -> str:
        """This caller as an owner: user@host and the real path of its CLUSTERCTL_HOME (two homes of one user
        on one machine, a test's and the user's, are two owners)."""
        from clusterctl.proc import owner

        return f"{owner()}:{os.path.realpath(self.store.root)}"

    def whose(self, name: str) -> str:
        """Who made local cluster `name`: its mark; a cluster made before marks is this home's when the record
        here is of it; "" when nobody is known."""
        owner = netns.read_owner(name)
        if owner:
            return owner
        try:
            mine = self.store.exists(name) and self.store.load(name).cluster.provider == self.name
        except Exception:  # a damaged record vouches for nothing
            mine = False
        return self.me() if mine else ""

    def _foreign(self, name: str) -> str:
        """ "" when this caller may remove the cluster (its own, or --force), else whose it is."""
        owner = self.whose(name)
        if self.force or owner == self.me():
            return ""
        if not owner and netns.leftovers(name).empty:
            return ""  # nothing of it on this machine: nobody's cluster to protect
        return owner or "an unknown owner (no mark, no record here)"

    def refresh_access(self, spec: ClusterSpec, cluster: Cluster) -> None:
        pass  # the nodes' bridge has no route out: nobody else can reach them

    def grant_checkpoint_write(self, cluster: Cluster, uri: str) -> None:
        pass  # local nodes have no role of their own: they use the credentials they are given

    def node_facts(self, cluster: Cluster) -> dict[str, NodeFacts]:
        """Every node of the record on this machine and its cluster's bridge (the local placement)."""
        bridge = cluster.extra.get("bridge", "")
        return {n.name: NodeFacts(cluster.instance_type, cluster.region, bridge) for n in cluster.nodes}

    def plan(self, spec: ClusterSpec) -> Plan:
        slots = spec.slots or 1
        return Plan(
            (
                f"{spec.nodes} namespace nodes on this machine ({slots} slot(s) each), each with its own sshd and home",
                "a private bridge with no route out; a per-cluster ssh key; host keys pinned at creation",
                "cost: $0.00/hour",
            ),
            hourly_usd=0.0,
        )

    def dry_run(self, spec: ClusterSpec) -> list[str]:
        return ["local nodes need root, ip and sshd: " + ("present" if os.geteuid() == 0 else "not root")]

    def host_keys(self, cluster: Cluster) -> dict[str, tuple[str, ...]]:
        return {}  # every node's key is known at creation (Launched.host_keys)

    def status(self, name: str) -> ClusterStatus | None:
        cluster = self.find(name)
        if cluster is None:
            return None
        up = self.store.exists(name) and self.store.load(name).status == "up"  # a stopped cluster's nodes are not lost
        lost = {x.node.name for x in self.lost_nodes(cluster)} if up else set()
        return ClusterStatus(
            name,
            self.name,
            cluster.region,
            cluster.instance_type,
            tuple(
                NodeStatus(n, "lost" if n.name in lost else "running", "local", cluster.created_at or None, 0.0)
                for n in cluster.nodes
            ),
            recorded=True,  # found from this machine's record
            disks_monthly_usd=0.0,  # the homes are folders on this machine
        )

    def statuses(self) -> list[ClusterStatus]:
        return [st for st in map(self.status, sorted(self.all_clusters())) if st is not None]

    def owners(self, name: str) -> list[str]:
        return [self.whose(name) or "unknown"]

    def resources(self, name: str) -> list[str]:
        other = self._foreign(name)
        if other:
            from clusterctl.errors import UsageError

            raise UsageError(
                f"local cluster {name} belongs to another owner ({other}), not this CLUSTERCTL_HOME "
                f"({os.path.realpath(self.store.root)})",
                "run clusterctl with that CLUSTERCTL_HOME, or pass --force to remove it anyway",
            )
        left = netns.leftovers(name)
        return [f"namespace {ns}" for ns in left.netns] + [f"link {link}" for link in left.links]

    def launch(self, spec: ClusterSpec, keys: ClusterKeys) -> Launched:
        netns.require_root()
        if not 1 <= spec.nodes <= MAX_NODES:
            raise ConfigError(f"--nodes must be 1..{MAX_NODES} for the local provider, not {spec.nodes}")
        slots = spec.slots or 1
        names = node_names(spec.name, spec.nodes)
        opts: Mapping[str, Any] = spec.options  # this provider's own free-form options
        with _net_lock():
            if netns.cluster_netns(spec.name) or netns.cluster_links(spec.name):
                raise ConfigError(
                    f"local cluster {spec.name!r} already has namespaces on this machine",
                    f"run `clusterctl down {spec.name} --yes` first",
                )
            if opts.get("addresses"):
                addresses = [str(a) for a in opts["addresses"]]
                subnet = ipaddress.IPv4Network(str(opts["subnet"]), strict=False)  # the bridge is IPv4
                gateway = str(opts.get("gateway") or next(subnet.hosts()))
            else:
                subnet = ipaddress.IPv4Network(str(opts["subnet"])) if opts.get("subnet") else netns.pick_subnet()
                hosts = list(subnet.hosts())
                gateway, addresses = str(hosts[0]), [str(h) for h in hosts[1 : 1 + spec.nodes]]
            if len(addresses) != spec.nodes:
                raise ConfigError(f"subnet {subnet} has room for {len(addresses)} nodes, not {spec.nodes}")
            netns.check_subnet_free(subnet)
            netns.write_owner(spec.name, self.me())  # before anything of it exists: a half-made one is ours too
            bridge = boot.create_bridge(spec.name, subnet, gateway)

        specs = [boot.NodeSpec(i, names[i], addresses[i]) for i in range(spec.nodes)]
        authorized = f"{keys.operator_public}\n{keys.internal_public}\n"
        nodes_root = self.store.ensure_dir(spec.name) / "nodes"
        made: list[boot.NetNode] = []
        for s in specs:
            made.append(boot.create_node(spec.name, bridge, subnet, s, specs, nodes_root / str(s.index), authorized))
        with ThreadPoolExecutor(max_workers=min(32, len(made))) as pool:
            list(
                pool.map(
                    lambda n: boot.wait_port(n.address, 22, 30.0, n.pid, nodes_root / str(n.index) / "sshd.log"), made
                )
            )
        created = time.time()
        if spec.autostop is not None:  # the watchdog in the leader, and its host-side supervisor (supervisor.py)
            from clusterctl.autostop import watchdog
            from clusterctl.providers.local import supervisor

            watchdog.install_local(self.store, spec.name, range(len(made)), spec.autostop, created)
            supervisor.start_supervisor(self.store, spec.name)

        cluster = Cluster(
            name=spec.name,
            provider=self.name,
            nodes=tuple(
                Node(name=n.hostname, private_ip=n.address, slots=slots, role="leader" if n.index == 0 else "member")
                for n in made
            ),
            region="local",
            instance_type="local",
            created_at=created,
            extra={
                "bridge": bridge,
                "subnet": str(subnet),
                "gateway": gateway,
                **(spec.autostop.extra() if spec.autostop else {}),
            },
        )
        return Launched(cluster, {n.address: (n.host_public_key,) for n in made})

    def find(self, name: str) -> Cluster | None:
        if not netns.cluster_netns(name):
            return None
        if self.store.exists(name):
            return self.store.load(name).cluster
        return None

    def terminate(self, name: str) -> Teardown:
        """Everything of the cluster, when it is this caller's (or --force); another owner's is kept and said
        so (an `up` that finds the name taken by another home rolls back through here)."""
        other = self._foreign(name)
        if other:
            return Teardown((), (f"local cluster {name}: another owner's ({other}), kept (--force removes it)",))
        return self._end(name, keep_homes=False)

    def stop(self, name: str) -> Teardown:
        """Autostop's --idle-action stop (the supervisor's, never `down`'s): the nodes end as a stopped instance
        does, their homes (the disks: what jobs wrote under /root) are kept for the next `up` of this name. /opt
        and /tmp are memory (tmpfs), like an instance store: gone."""
        return self._end(name, keep_homes=True)

    def stop_nodes(self, cluster: Cluster) -> Teardown:
        """`clusterctl stop`: autostop's stop (the one copy), on demand."""
        return self.stop(cluster.name)

    def start_nodes(self, cluster: Cluster, keys: ClusterKeys) -> Launched:
        """The stopped cluster's nodes made again at their addresses, on its bridge and subnet, each with the home
        and host key it kept; the watchdog's supervisor back when the homes hold its settings. What a failed
        start left is ended first (the homes kept)."""
        from clusterctl.autostop import watchdog
        from clusterctl.providers.local import supervisor

        netns.require_root()
        name = cluster.name
        if not netns.leftovers(name).empty:
            self._end(name, keep_homes=True)
        subnet = ipaddress.IPv4Network(cluster.extra["subnet"])
        with _net_lock():
            netns.check_subnet_free(subnet)
            netns.write_owner(name, self.me())
            bridge = boot.create_bridge(name, subnet, cluster.extra["gateway"])
        everyone = [boot.NodeSpec(node_index(name, n), n.name, n.private_ip) for n in cluster.nodes]
        authorized = f"{keys.operator_public}\n{keys.internal_public}\n"
        nodes_root = self.store.ensure_dir(name) / "nodes"
        made = [
            boot.create_node(name, bridge, subnet, s, everyone, nodes_root / str(s.index), authorized, n.ssh_port)
            for s, n in zip(everyone, cluster.nodes)
        ]
        for m, n in zip(made, cluster.nodes):
            boot.wait_port(m.address, n.ssh_port, 30.0, m.pid, nodes_root / str(m.index) / "sshd.log")
        started = time.time()
        if watchdog.restart_local(self.store, name, [m.index for m in made], started):
            supervisor.start_supervisor(self.store, name)
        return Launched(
            replace(cluster, extra={**cluster.extra, "bridge": bridge}), {m.address: (m.host_public_key,) for m in made}
        )

    def _end(self, name: str, keep_homes: bool) -> Teardown:
        from clusterctl.providers.local import supervisor

        supervisor.stop_supervisor(name)  # first: it must not take the nodes' end for the watchdog's power-off
        before = netns.leftovers(name)
        left = netns.destroy(name)
        removed = [f"namespace {ns}" for ns in before.netns if ns not in left.netns]
        removed += [f"link {link}" for link in before.links if link not in left.links]
        removed += [f"process {pid}" for pid in before.pids if pid not in left.pids]
        removed += [f"node /opt {m}" for m in before.mounts if m not in left.mounts]
        nodes_dir = self.store.cluster_dir(name) / "nodes"
        if nodes_dir.exists() and not keep_homes:
            import shutil

            shutil.rmtree(nodes_dir, ignore_errors=True)
            removed.append(f"node homes {nodes_dir}")
        return Teardown(tuple(removed), () if left.empty else (left.describe(),))

    def all_clusters(self) -> list[str]:
        return netns.all_clusters()

    def everything_made(self) -> list[Found]:
        """Namespaces (and their config folders) of every local cluster on this machine, each with its owner
        (whose(): the home that made it)."""
        names = set(netns.all_clusters())
        etc = Path("/etc/netns")
        if etc.is_dir():
            for d in etc.iterdir():
                if d.name.startswith(netns.NETNS_PREFIX) and d.name.rsplit("-", 1)[-1].isdigit():
                    names.add(d.name[len(netns.NETNS_PREFIX) :].rsplit("-", 1)[0])
        out = []
        for name in sorted(names):
            owner = self.whose(name)
            left = netns.leftovers(name)
            for ns in left.netns:
                out.append(
                    Found(
                        name,
                        "namespace",
                        ns,
                        _mtime(Path("/run/netns") / ns),
                        owner,
                        f"{len(netns.netns_pids(ns))} process(es)",
                    )
                )
            out += [Found(name, "link", link, None, owner) for link in left.links]
            out += [
                Found(name, "config folder", d, _mtime(Path(d)), owner)
                for d in left.etc_dirs
                if not any(d.endswith("/" + ns) for ns in left.netns)
            ]
        return out

    def remove(self, found: Iterable[Found]) -> Teardown:
        """Local resources go by cluster (a namespace without its sshd is no use): each named cluster's terminate."""
        removed: list[str] = []
        left: list[str] = []
        for name in sorted({f.cluster for f in found}):
            t = self.terminate(validate_name(name))
            removed += t.removed
            left += t.left
        return Teardown(tuple(removed), tuple(left))

    def reboot(self, cluster: Cluster, hosts: Iterable[str], timeout: float = 60.0) -> dict[str, str | None]:
        """Reboot nodes the local way (a namespace node has no kernel of its own, and `reboot` inside one
        would reach the host's init): kill every process in the node, then start its sshd again with
        the same host key, address and home and a fresh /tmp. ssh address -> None, or why it failed."""
        wanted = set(hosts)
        nodes_root = self.store.cluster_dir(cluster.name) / "nodes"
        todo = [(i, n) for i, n in enumerate(cluster.nodes) if n.ssh_host in wanted]

        def one(item: tuple[int, Node]) -> tuple[str, str | None]:
            i, node = item
            try:
                boot.restart_node(
                    netns.netns_name(cluster.name, i),
                    node.name,
                    node.private_ip,
                    nodes_root / str(i),
                    port=node.ssh_port,
                    timeout=timeout,
                )
                return node.ssh_host, None
            except Exception as exc:
                return node.ssh_host, getattr(exc, "message", None) or str(exc)

        with ThreadPoolExecutor(max_workers=max(1, min(16, len(todo)))) as pool:
            return dict(pool.map(one, todo))

    # ---- a recorded cluster's facts -------------------------------------------------------------------
    def hourly_price(self, cluster: Cluster) -> float | None:
        return 0.0  # nothing billed

    def gpus_per_node(self, cluster: Cluster) -> int:
        return 0  # namespace nodes see the host's GPUs, if any, but none is theirs to check

    def gpu_model(self, cluster: Cluster) -> str:
        return ""

    def watchdog_running(self, cluster: Cluster) -> bool | None:
        from clusterctl.providers.local import supervisor

        return supervisor.watchdog_running(cluster.name)

    def object_store(self) -> ObjectStore:
        raise UsageError(
            "local clusters have no object store",
            "local clusters build the runtime once on this machine and cache it here",
        )

    # ---- repair (cluster/repair.py) ---------------------------------------------------------------------
    def lost_nodes(self, cluster: Cluster) -> list[LostNode]:
        """Nodes whose namespace, or every process in it (sshd is its PID 1), is gone."""
        out = []
        for node in cluster.nodes:
            why = netns.node_alive(cluster.name, node_index(cluster.name, node))
            if why is not None:
                out.append(LostNode(node, why))
        return out

    def replace_nodes(self, cluster: Cluster, lost: Sequence[Node], keys: ClusterKeys) -> Launched:
        """A fresh namespace node at each lost node's address and name (replace.py)."""
        return replace_nodes(self.store, cluster, lost, keys)

    def remove_nodes(self, cluster: Cluster, nodes: Sequence[Node]) -> list[str]:
        return remove_nodes(self.store, cluster, nodes)

    def new_nodes(self, cluster: Cluster, count: int) -> list[Node]:
        """More members at the next free addresses of the cluster's subnet (its bridge's and nodes' excluded)."""
        subnet = ipaddress.IPv4Network(cluster.extra["subnet"])
        hosts = [str(h) for h in subnet.hosts()]
        taken = {cluster.extra.get("gateway") or hosts[0], *(n.private_ip for n in cluster.nodes)}
        free = [h for h in hosts if h not in taken]
        if len(free) < count:
            raise ConfigError(f"subnet {subnet} has room for {len(free)} more node(s), not {count}")
        return [
            dataclasses.replace(n, private_ip=address) for n, address in zip(super().new_nodes(cluster, count), free)
        ]

    def retire_nodes(self, cluster: Cluster, lost: Sequence[LostNode]) -> list[str]:
        return retire_nodes(self.store, cluster, lost)
