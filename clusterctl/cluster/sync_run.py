"""`clusterctl sync` on a cluster: its options checked into one value before anything connects, the plan it
would follow (--plan), and the copy itself with autostop told the cluster is busy (data/ does the copying); a DST
verified on a node is then in the cluster's record (ClusterFacts.datasets): what `repair` copies to a new node."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from clusterctl.errors import UsageError, within

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.data.outcome import Events, SyncReport
    from clusterctl.data.plan import FanoutChoice, Source
    from clusterctl.state import StateStore


@dataclass(frozen=True)
class SyncOptions:
    source: Source
    dst: str
    strategy: str = "chain"
    fanout: int | None = None  # chains after the first node; None: measured when the chain starts (auto)
    delete: bool = False
    endpoint_url: str | None = None
    stall_timeout: float = 120.0
    verify: str = "stream"


def options(
    src: str,
    dst: str,
    strategy: str = "chain",
    fanout: str = "auto",
    delete: bool = False,
    endpoint_url: str | None = None,
    stall_timeout: float = 120.0,
    verify: str = "stream",
) -> SyncOptions:
    """The command line's values checked (UsageError on the first that is wrong), SRC parsed."""
    from clusterctl.data import plan as syncplan, session as syncsession

    syncplan.check_strategy(strategy)
    chains = parse_fanout(fanout)
    within("--stall-timeout", stall_timeout, above=0)
    if verify not in syncsession.VERIFY:
        raise UsageError(f"unknown --verify {verify!r}", "use stream (the default) or disk")
    syncplan.check_dst(dst)
    source = syncplan.parse_source(src)
    return SyncOptions(source, dst, strategy, chains, delete, endpoint_url, stall_timeout, verify)


def parse_fanout(text: str) -> int | None:
    """--fanout: a number of chains (>= 1), or auto (None: measured when the chain starts)."""
    if text == "auto":
        return None
    from clusterctl.data import plan as syncplan

    try:
        k = int(text)
    except ValueError:
        raise UsageError(f"--fanout must be auto or a whole number, not {text!r}") from None
    return syncplan.check_fanout(k)


def plan_lines(inv: Inventory, opts: SyncOptions) -> list[str]:
    """--plan: who sends to whom; with --fanout auto on a chain, the probe runs first (no data moves)."""
    from clusterctl.data import plan as syncplan

    labels = [t.label for t in inv.targets]
    chosen = None
    if opts.fanout is None and opts.strategy == "chain" and opts.source.kind != "s3":
        chosen = _probe(inv, opts)
    k = chosen.k if chosen else opts.fanout or 1
    return syncplan.render_plan(opts.strategy, labels, opts.source, k, labels[0] if labels else None, chosen)


def _probe(inv: Inventory, opts: SyncOptions) -> FanoutChoice:
    from clusterctl.data import probe, session as syncsession
    from clusterctl.remote import jobfolder
    from clusterctl.remote.ssh import SshPool

    with SshPool(inv.settings) as pool:
        return probe.for_plan(
            syncsession.SyncSession.over(
                inv, pool, opts.source, opts.dst, fanout=None, node_python=jobfolder.node_python(inv.cluster)
            )
        )


def run(
    inv: Inventory, store: StateStore, opts: SyncOptions, events: Events, warn: Callable[[str], None]
) -> SyncReport:
    """The copy to every node, under a lease (autostop counts the copy as activity)."""
    from clusterctl.cluster import autostop_control as autostop
    from clusterctl.data import sync as transfer
    from clusterctl.remote import jobfolder
    from clusterctl.remote.ssh import SshPool

    with autostop.lease(store, inv.cluster, "sync", warn=warn), SshPool(inv.settings) as pool:
        syncer = transfer.Syncer.over(
            inv,
            pool,
            opts.source,
            opts.dst,
            strategy=opts.strategy,
            fanout=opts.fanout,
            delete=opts.delete,
            endpoint_url=opts.endpoint_url,
            events=events,
            node_python=jobfolder.node_python(inv.cluster),
            stall_timeout=opts.stall_timeout,
            verify=opts.verify,
        )
        report = syncer.run()
    if inv.cluster is not None and any(o.status == "ok" for o in report.outcomes):
        remember(store, inv.cluster.name, plan_dst(opts.dst), warn)
    return report


def plan_dst(dst: str) -> str:
    """DST as the nodes read it (data/plan.py check_dst: relative paths are in the login home)."""
    from clusterctl.data import plan as syncplan

    return syncplan.check_dst(dst)


def remember(store: StateStore, name: str, dst: str, warn: Callable[[str], None], tries: int = 20) -> None:
    """`dst` among the datasets of the cluster's record (what `repair` copies to a new node); the record's lock is
    waited for a few seconds (another command may be changing it), then the line says how to do without."""
    import dataclasses
    import time

    from clusterctl.errors import StateError

    for attempt in range(tries):
        try:
            with store.lock(name):
                if store.exists(name):
                    record = store.load(name)
                    updated = record.cluster.with_dataset(dst)
                    if updated != record.cluster:
                        store.save(dataclasses.replace(record, cluster=updated))
                return
        except StateError:
            if attempt + 1 < tries:
                time.sleep(0.5)
    warn(f"cluster {name}'s record was busy: {dst} is not among its datasets; `repair --data {dst}` copies it")
