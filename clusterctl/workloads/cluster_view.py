"""What `status` shows of one cluster, gathered from its five sources into one typed value: the record here,
the provider's view (for a cloud provider), its lost nodes, autostop, the node runtime, and the jobs on it
(the training job, `launch` jobs). cli/ renders it; nothing here prints.

It sits in workloads/ because the jobs are: cluster/ is below workloads/ (tests/core/test_architecture.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from clusterctl.errors import ClusterctlError, StateError

if TYPE_CHECKING:
    from clusterctl.cluster.overview import Providers
    from clusterctl.providers.base import ClusterStatus, LostNode, Provider
    from clusterctl.state import Record, StateStore
    from clusterctl.types import Cluster, Node
    from clusterctl.workloads.train.job import TrainJob
    from clusterctl.workloads.train.status import TrainStatus


PROBE_TIMEOUT = 5.0  # seconds each node has to answer status's ssh probe (a node up answers in well under 1)


@dataclass(frozen=True)
class Training:
    """The cluster's training job: its status, or why it could not be read."""

    job: TrainJob
    status: TrainStatus | None
    error: str = ""  # set when status is None
    hourly_usd: float | None = None


@dataclass(frozen=True)
class Launches:
    """The cluster's `launch` jobs (running ones and the latest), or why they could not be read."""

    lines: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class ClusterView:
    """One cluster as `status` shows it, in the order shown. Exactly one of `nodes` (a provider whose records
    here are the whole truth: the record's nodes) and `cloud` (the provider's own view) is set."""

    name: str
    current: bool
    now: float
    nodes: Cluster | None = None
    cloud: ClusterStatus | None = None
    notes: tuple[str, ...] = ()  # where the record and the provider disagree
    lost: tuple[LostNode, ...] = ()
    autostop: tuple[str, ...] = ()
    runtime: str | None = None  # None: no record here
    training: Training | None = None
    launches: Launches | None = None
    stopped: Stopped | None = None  # set when the cluster is stopped


@dataclass(frozen=True)
class Stopped:
    """A stopped cluster: why (the record's note: who stopped it and when) and what its disks still cost."""

    note: str
    disks_monthly_usd: float | None

    def lines(self) -> tuple[str, ...]:
        from clusterctl.cluster import costs

        return ((f"stopped: {self.note}",) if self.note else ()) + (costs.stopped_line(self.disks_monthly_usd),)


def gather(
    store: StateStore, providers: Providers, name: str | None, provider: str | None, region: str | None
) -> ClusterView:
    """The cluster NAME (default: the current one) from its record here and its provider (--provider and
    --region say where to look when the record is gone)."""
    from clusterctl.cluster import overview
    from clusterctl.state import validate_name

    n = name or store.resolve(None).cluster.name
    validate_name(n)
    record = store.load(n) if store.exists(n) else None
    kind = provider or (record.cluster.provider if record is not None else overview.guess_provider(n, region))
    reg = region or (record.cluster.region if record is not None and record.cluster.provider == kind else None)
    impl = providers.get(kind, reg)
    current = n == store.current()
    if not impl.lists_from_cloud:  # the record here is the whole truth about this provider's clusters
        if record is None:
            record = store.load(n)  # raises "no cluster named ..."
        up = record.status == "up"
        kept = Stopped(record.note, 0.0) if record.disks_kept else None  # nothing of it billed here
        return ClusterView(
            n,
            current,
            time.time(),
            nodes=record.cluster,
            lost=_lost(store, impl, record),
            autostop=_autostop(store, record),
            runtime=_runtime(record),
            training=_training(store, n) if up else None,
            launches=_launches(store, n) if up else None,
            stopped=kept,
        )
    st = impl.status(n)
    if st is None:
        if record is None:
            raise StateError(f"no cluster named {n!r} here or in the cloud", "see `clusterctl ls --provider aws`")
        from clusterctl.providers.base import ClusterStatus

        st = ClusterStatus(n, kind, record.cluster.region, record.cluster.instance_type, ())
    notes = tuple(overview.disagreements(record, st if (st.nodes or st.other) else None))
    kept = Stopped(record.note if record is not None and record.disks_kept else "", st.disks_monthly_usd)
    if record is None:
        return ClusterView(n, current, time.time(), cloud=st, notes=notes, stopped=kept if st.stopped else None)
    return ClusterView(
        n,
        current,
        time.time(),
        cloud=st,
        notes=notes,
        lost=_lost(store, impl, record) if st.nodes else (),
        autostop=_autostop(store, record) if st.nodes or record.status == "stopped" else (),
        runtime=_runtime(record),
        training=_training(store, n),
        launches=_launches(store, n) if st.nodes else None,
        stopped=kept if st.stopped else None,
    )


def _lost(store: StateStore, impl: Provider, record: Record) -> tuple[LostNode, ...]:
    """The record's nodes the provider says are gone or that do not answer ssh (what `repair` replaces);
    none unless the record is up."""
    from clusterctl.cluster import repair

    return tuple(repair.lost_nodes(store, impl, record.cluster, PROBE_TIMEOUT)) if record.status == "up" else ()


def _autostop(store: StateStore, record: Record) -> tuple[str, ...]:
    from clusterctl.cluster import autostop_status

    return tuple(autostop_status.status_lines(store, record))


def _runtime(record: Record) -> str:
    from clusterctl.runtime.install import describe

    return describe(record.cluster.extra)


def _training(store: StateStore, name: str) -> Training | None:
    """The training job's place, when the cluster has one."""
    from clusterctl.cluster import costs, inventory
    from clusterctl.workloads.train import job as trainlib

    try:
        inv = inventory.resolve(None, name, store)
    except ClusterctlError:
        return None
    job = trainlib.load_job(store, inv)
    if job is None:
        return None
    try:
        st = trainlib.job_status(inv, job)
    except ClusterctlError as exc:
        return Training(job, None, exc.one_line())
    return Training(job, st, hourly_usd=costs.hourly(inv.cluster))


def _launches(store: StateStore, name: str) -> Launches:
    from clusterctl.cluster import inventory
    from clusterctl.workloads import userjob

    try:
        inv = inventory.resolve(None, name, store)
        return Launches(tuple(userjob.status_lines(store, inv)))
    except ClusterctlError as exc:
        return Launches(error=exc.one_line())


def as_json(view: ClusterView) -> dict[str, Any]:
    """`status --json`: the keys docs/hosts-and-state.md lists, stable for scripts (added to, never renamed)."""
    lost = {x.node.name: x for x in view.lost}
    if view.cloud is not None:
        c = view.cloud
        where = {"provider": c.provider, "region": c.region, "instance_type": c.instance_type}
        nodes = [_node_json(s.node, s.state, s.zone, lost) for s in c.nodes]
    else:
        assert view.nodes is not None  # exactly one of the two (ClusterView)
        k = view.nodes
        where = {"provider": k.provider, "region": k.region, "instance_type": k.instance_type}
        nodes = [_node_json(n, "recorded", "", lost) for n in k.nodes]
    training = None
    if view.training is not None:
        t, st = view.training, view.training.status
        training = {
            "job": t.job.job,
            "state": st.state if st is not None else None,
            "step": st.step if st is not None else None,
            "total_steps": st.total_steps if st is not None else None,
            "error": t.error or None,
        }
    return {
        "name": view.name,
        "current": view.current,
        **where,
        "nodes": nodes,
        "lost": [{"name": x.node.name, "private_ip": x.node.private_ip, "why": x.why} for x in view.lost],
        "notes": list(view.notes),
        "autostop": list(view.autostop),
        "runtime": view.runtime,
        "training": training,
        "launches": None if view.launches is None else list(view.launches.lines),
        "launches_error": None if view.launches is None or not view.launches.error else view.launches.error,
        "stopped": None
        if view.stopped is None
        else {"note": view.stopped.note or None, "disks_monthly_usd": view.stopped.disks_monthly_usd},
    }


def _node_json(node: Node, state: str, zone: str, lost: dict[str, LostNode]) -> dict[str, Any]:
    return {
        "name": node.name,
        "role": node.role,
        "private_ip": node.private_ip,
        "public_ip": node.public_ip,
        "slots": node.slots,
        "state": "lost" if node.name in lost else state,
        "zone": zone or None,
    }
