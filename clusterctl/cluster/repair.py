"""`repair`: the cluster's lost nodes found and replaced (or, with --drop, removed from the cluster).

    plan:  the provider's lost nodes (terminated, missing; a namespace gone) + ssh probes of the rest, spread over
           a window (--unreachable-for): a node that runs is never lost by a probe. A stopped one (its disks kept)
           or a running one that does not answer over the whole window is reported and kept as it is (held), and
           nothing is carried out while one is, unless the user names it (--node): then it is replaced
    carry out: the plan's lost nodes replaced or dropped (cluster/membership.py: a failed replacement leaves the
           cluster as it found it)

The live-hosts file (cluster/live_hosts.py, `host:slots` lines) on the leader lists the nodes that answer ssh with the runtime
and the datasets in place: what a Horovod host-discovery script prints (`cat ~/.clusterctl/live-hosts`), so an
elastic job picks a repaired node up. `repair` runs on the operator's machine (it holds the cloud credentials,
which never go to the nodes); a spot cluster's keep-repairing loop is `repair --yes` run again there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.cluster import membership, reach
from clusterctl.cluster.membership import RepairPlan
from clusterctl.errors import ProvisionError, StateError, UnreachableError, UsageError, within
from clusterctl.providers.base import LostNode, Provider
from clusterctl.remote.ssh import SshPool
from clusterctl.state import StateStore
from clusterctl.types import Cluster, Node
from clusterctl.units import duration

Report = Callable[[str], None]
PROBE = "true"
UNREACHABLE_FOR = 180.0  # seconds a running node must not answer ssh before it is reported (never replaced unnamed)
PROBES = 4  # ssh probes spread over that window: at its start, its end and evenly between


@dataclass(frozen=True)
class Probing:
    """How long a running node must not answer ssh before it is reported, and the probes spread over that."""

    window: float = UNREACHABLE_FOR
    probes: int = PROBES

    def __post_init__(self) -> None:
        within("--unreachable-for", self.window, above=0)
        within("probes", self.probes, 2)

    @property
    def timeout(self) -> float:
        """Each probe's connect timeout: 10 s, less in a short window, never under 2 s (a busy node's handshake)."""
        return min(10.0, max(2.0, self.window / self.probes))


def lost_nodes(store: StateStore, provider: Provider, cluster: Cluster, probe_timeout: float = 10.0) -> list[LostNode]:
    """`status`'s view: the provider's lost nodes, then the others that answer neither of two ssh probes within
    `probe_timeout`, in the cluster's order (repair itself holds those: plan)."""
    lost = list(provider.lost_nodes(cluster))
    gone = {x.node.name for x in lost}
    rest = [n for n in cluster.nodes if n.name not in gone]
    silent = _silent(store, cluster, rest, Probing(window=probe_timeout, probes=2), lambda _: None)
    lost += [LostNode(n, f"no ssh answer ({silent[n.name]})", billed=True) for n in rest if n.name in silent]
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    return sorted(lost, key=lambda x: order[x.node.name])


def plan(
    store: StateStore,
    provider: Provider,
    name: str,
    drop: bool,
    *,
    named: Sequence[str] = (),
    probing: Probing = Probing(),
    report: Report = lambda _: None,
) -> RepairPlan:
    """The lost nodes: the provider's word (gone, not running), and the nodes the user names. A stopped node (its
    disks kept) and a running one that answers no ssh probe over the whole window are held: reported, kept."""
    record = store.load(name)
    if record.status != "up":
        raise StateError(
            f"cluster {name} is {record.status}, not up",
            f"start it with `clusterctl start {name}` first"
            if record.disks_kept
            else f"bring it up with `clusterctl up --name {name}` first",
        )
    cluster = record.cluster
    unknown = [x for x in named if x not in {n.name for n in cluster.nodes}]
    if unknown:
        raise UsageError(
            f"--node {unknown[0]}: cluster {name} has no such node",
            f"name one of {', '.join(n.name for n in cluster.nodes)}",
        )
    said = provider.lost_nodes(cluster)
    lost = [x for x in said if not x.disks_kept or x.node.name in named]
    held = [x for x in said if x not in lost]
    gone = {x.node.name for x in said}
    rest = [n for n in cluster.nodes if n.name not in gone]
    lost += [LostNode(n, "named (--node), though it runs", billed=True) for n in rest if n.name in named]
    silent = _silent(store, cluster, [n for n in rest if n.name not in named], probing, report)
    held += [
        LostNode(n, f"runs, but answered no ssh probe over {duration(probing.window)} ({why})", billed=True)
        for n in rest
        if n.name in silent
        for why in [silent[n.name]]
    ]
    order = {n.name: i for i, n in enumerate(cluster.nodes)}
    lost.sort(key=lambda x: order[x.node.name])
    held.sort(key=lambda x: order[x.node.name])
    if lost and len(lost) == len(cluster.nodes):
        raise ProvisionError(
            f"every node of cluster {name} is lost: no peer to copy the runtime and data from",
            f"bring it down and up again: `clusterctl down {name} --yes`, then `clusterctl up`",
        )
    price = None
    if lost:
        st = provider.status(name)
        prices = [s.hourly_usd for s in (st.nodes if st else ()) if s.hourly_usd is not None]
        price = prices[0] if prices else None
    return RepairPlan(cluster, tuple(lost), drop, price, tuple(held))


def _silent(
    store: StateStore, cluster: Cluster, nodes: Sequence[Node], probing: Probing, report: Report
) -> dict[str, str]:
    """The nodes that answer none of the ssh probes spread over the window (fresh connections each time), with the
    last probe's error. Every node that answers the first probe is done at once."""
    pending = {n.name: n for n in nodes}
    why: dict[str, str] = {}
    start = time.monotonic()
    for k in range(probing.probes):
        if k:
            report(
                f"{', '.join(pending)}: no ssh answer; probe {k + 1} of {probing.probes} "
                f"({duration(probing.window)} in all) before it is reported"
            )
            time.sleep(max(0.0, start + probing.window * k / (probing.probes - 1) - time.monotonic()))
        targets = {t.label: t for t in reach.ssh_targets(cluster, store)}
        with SshPool(reach.ssh_settings(cluster, store, connect_timeout=probing.timeout)) as pool:
            results = pool.run([targets[n.ssh_host] for n in pending.values()], PROBE, timeout=probing.timeout * 2)
        for n, r in zip(list(pending.values()), results):
            if r.ok:
                del pending[n.name]
            else:
                why[n.name] = (r.error or r.stderr.strip() or f"exit {r.exit_code}").splitlines()[-1][:120]
        if not pending:
            break
    return {name: why[name] for name in pending}


def check(p: RepairPlan) -> None:
    """Raises when the plan holds a node it keeps as it is: it cannot take part in a repair (its hosts file and
    keys), and nothing of it is touched unless the user names it."""
    if p.held:
        names = ", ".join(x.node.name for x in p.held)
        flags = " ".join(f"--node {x.node.name}" for x in p.held)
        raise UnreachableError(
            f"cluster {p.cluster.name}: {names} not lost but not answering; nothing "
            + ("repaired while it is" if p.lost else "to repair"),
            f"start it or wait until it answers, or replace it too: `clusterctl repair {p.cluster.name} {flags}`",
        )


def carry_out(
    store: StateStore,
    provider: Provider,
    p: RepairPlan,
    *,
    report: Report = lambda _: None,
    data: Sequence[str] = (),
    hosts_out: Path | None = Path("hosts"),
    ssh_timeout: float = 300.0,
) -> Cluster:
    """Replace (or drop) the plan's lost nodes; the cluster as the record now says."""
    name = p.cluster.name
    check(p)
    with store.lock(name):
        membership.unchanged(store, p.cluster)
        if not p.lost:
            return p.cluster
        if p.drop:
            return membership.drop(store, provider, p, report, hosts_out)
        return membership.replace(store, provider, p, report, data, hosts_out, ssh_timeout)


def watch(
    store: StateStore,
    provider: Provider,
    name: str,
    *,
    drop: bool,
    interval: float,
    report: Report = lambda _: None,
    data: Sequence[str] = (),
    named: Sequence[str] = (),
    probing: Probing = Probing(),
    rounds: int | None = None,
) -> None:
    """plan + carry_out every `interval` seconds until Ctrl-C (or `rounds` rounds): a spot cluster kept whole from the
    operator's machine, where the cloud credentials are. The same rule as one repair: a node held (stopped, or
    running without an answer) is reported each round and kept. A round that fails is reported and the next one
    tries again (its launches already removed by carry_out)."""
    from clusterctl.errors import ClusterctlError, UsageError

    if interval < 1:
        raise UsageError(f"--watch {interval:g} is too short", "give the seconds between checks, e.g. --watch 300")
    done = 0
    while rounds is None or done < rounds:
        done += 1
        try:
            p = plan(store, provider, name, drop, named=named, probing=probing, report=report)
            if p.lost or p.held:
                for line in p.lines():
                    report(line)
                carry_out(store, provider, p, report=report, data=data)
        except ClusterctlError as exc:
            report(f"repair failed: {exc.message}; trying again in {interval:.0f}s")
        if rounds is None or done < rounds:
            time.sleep(interval)
