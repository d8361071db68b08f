"""What `ls` lists and what `down` removes: typed rows and plans, chosen here, rendered by cli/.

Providers are made by the caller's factory (the CLI's reports progress on stderr), one per provider and
region (Providers). Which providers are asked where follows each one's `lists_from_cloud` (providers/base.py,
"Where clusters are listed from"); no provider is named here. Clusters of this machine are listed from their
records (their state is the record's: up, stopped by autostop ...); clusters of a cloud provider are asked
of the provider in every region a record names (or the one given), so a cluster without a record here is
listed too, and a record the cloud no longer knows says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Callable, Iterable

from clusterctl.cluster import costs
from clusterctl.errors import UsageError
from clusterctl.providers.base import Provider
from clusterctl.units import duration

if TYPE_CHECKING:
    from clusterctl.providers.base import ClusterStatus
    from clusterctl.state import Record, StateStore
    from clusterctl.types import Cluster


@dataclass(frozen=True)
class Target:
    """One cluster `down` removes: its name, its provider, and the region to ask (None: the default)."""

    name: str
    provider: str
    region: str | None = None


class Providers:
    """One provider per (name, region), made once by `make(name, region)`; --force is set on each."""

    def __init__(self, make: Callable[[str, str | None], Provider], force: bool = False):
        self._make, self._force = make, force
        self._made: dict[tuple[str, str], Provider] = {}

    def get(self, kind: str, region: str | None) -> Provider:
        key = (kind, region or "")
        if key not in self._made:
            impl = self._made[key] = self._make(kind, region or None)
            impl.force = self._force
        return self._made[key]

    def split(self, kinds: Iterable[str] | None = None) -> tuple[list[str], list[str]]:
        """These providers (default: every registered one; unknown names dropped) as (those whose clusters are
        asked of a cloud, those whose records here list them all), by each one's `lists_from_cloud`. Only
        these are made (a provider module costs `ls` its import), and making one calls nothing remote."""
        from clusterctl import providers as registry

        known = sorted(set(registry.names()) & set(registry.names() if kinds is None else kinds))
        cloud = [k for k in known if self.get(k, None).lists_from_cloud]
        return cloud, [k for k in known if k not in cloud]


def _region(cluster: Cluster, here: list[str]) -> str | None:
    """The region to ask a record's provider in (None for a provider of this machine: it has one)."""
    return None if cluster.provider in here else cluster.region


def guess_provider(name: str, region: str | None) -> str:
    """The provider of a cluster that has no local record: one of this machine's that holds it (local: its
    namespaces are here), else a cloud provider that can be asked (a region given or configured), else the
    first of this machine's (no cloud to look it up in)."""
    from clusterctl import providers as registry
    from clusterctl.errors import ConfigError

    made = [registry.get(kind, region=region) for kind in registry.names()]
    here = [p for p in made if not p.lists_from_cloud]
    for p in here:
        if name in p.all_clusters():
            return p.name
    for p in made:
        try:
            if p.lists_from_cloud and p.region:  # reading region raises ConfigError when none is configured
                return p.name
        except ConfigError:
            continue
    return here[0].name


def down_targets(
    store: StateStore,
    providers: Providers,
    name: str | None,
    all_: bool,
    provider: str | None,
    region: str | None,
    warn: Callable[[str], None],
) -> list[Target]:
    """The clusters `down` is about: NAME (or the current one), or with --all every cluster the providers
    still hold resources of, and every record here (of --provider only, when given)."""
    from clusterctl.state import validate_name

    targets: list[Target] = []
    if all_:
        cloud, here = providers.split()
        listed, damaged = store.list()
        for line in damaged:
            warn(line)
        records = {r.cluster.name: r.cluster for r in listed}
        asked = set(cloud) if region else set()  # no record, no flag: no cloud call
        kinds = [provider] if provider else sorted({c.provider for c in records.values()} | set(here) | asked)
        for kind in kinds:
            regions = (
                {region}
                if region and kind not in here
                else ({_region(c, here) for c in records.values() if c.provider == kind} or {None})
            )
            for reg in sorted(regions, key=str):
                for n in providers.get(kind, reg).all_clusters():
                    targets.append(Target(n, kind, reg))
        for n, c in records.items():
            if (not provider or c.provider == provider) and not any(t.name == n for t in targets):
                targets.append(Target(n, c.provider, _region(c, here)))
        return targets
    n = validate_name(name or store.current() or "") if (name or store.current()) else ""
    if not n:
        raise UsageError("no cluster given and none is current", "name the cluster: clusterctl down NAME")
    record = store.load(n).cluster if store.exists(n) else None
    kind = provider or (record.provider if record else None) or guess_provider(n, region)
    return [
        Target(
            n, kind, region or (_region(record, providers.split([record.provider])[1]) if record is not None else None)
        )
    ]


@dataclass(frozen=True)
class Removal:
    """One cluster `down` will remove: where it is (as shown), what it has left, and who made it."""

    target: Target
    where: str  # "aws, us-east-1, age 2h05m, owner alice@laptop"
    found: tuple[str, ...]  # one line per resource
    owners: tuple[str, ...]


@dataclass(frozen=True)
class DownPlan:
    removals: tuple[Removal, ...]
    kept: tuple[tuple[Target, str], ...]  # --all without --force: another owner's clusters, with why


def plan_down(targets: list[Target], providers: Providers, all_: bool, now: float | None = None) -> DownPlan:
    """What `down` will remove of its targets (down_targets), found and listed once per cluster; nothing is
    changed here. The provider refuses to list another owner's cluster (a UsageError) unless --force was
    given to Providers: for NAME that refusal is the answer, for --all the cluster is kept and it says why."""
    shown: dict[tuple[str, str], str] = {}
    if all_ and targets:
        now = time.time() if now is None else now
        for key, (created, owner) in ages_and_owners(targets, providers).items():
            shown[key] = (f", age {duration(now - created)}" if created else "") + (f", owner {owner}" if owner else "")
    removals: list[Removal] = []
    kept: list[tuple[Target, str]] = []
    for t in targets:
        impl = providers.get(t.provider, t.region)
        try:
            found = impl.resources(t.name)
        except UsageError as exc:
            if not all_:
                raise
            kept.append((t, exc.message))
            continue
        where = t.provider if impl.region == t.provider else f"{t.provider}, {impl.region}"
        removals.append(
            Removal(t, where + shown.get((t.name, t.provider), ""), tuple(found), tuple(impl.owners(t.name)))
        )
    return DownPlan(tuple(removals), tuple(kept))


def take_down(plan: DownPlan, store: StateStore, providers: Providers, report: Callable[[str], None]) -> list[str]:
    """Remove what the plan lists (the connection agent first: it holds ssh connections to these nodes);
    a cluster left clean loses its record and ssh config entry. Returns what remains, one line per cluster."""
    from clusterctl.cluster import provision, sshentry
    from clusterctl.remote import agent

    agent.stop(store.root)
    failed = []
    for r in plan.removals:
        t = r.target
        teardown = provision.down(t.name, store, providers.get(t.provider, t.region), report=report)
        if teardown.clean:
            report(f"cluster {t.name} is gone: nothing tagged for it is left")
            sshentry.remove(t.name)
        else:
            failed.append(f"{t.name}: {'; '.join(teardown.left)}")
    return failed


def ages_and_owners(targets: list[Target], providers: Providers) -> dict[tuple[str, str], tuple[float | None, str]]:
    """(name, provider) -> (created_at, owner), from the same search as `gc` (for `down --all`'s listing)."""
    from clusterctl.cluster import gc as gclib

    out = {}
    for kind, reg in sorted({(t.provider, t.region or "") for t in targets}):
        impl = providers.get(kind, reg or None)
        for c in gclib.group(impl.everything_made(), kind, reg, {}, impl.owns):
            out[(c.name, kind)] = (c.created_at, c.owner)
    return out


@dataclass(frozen=True)
class Row:
    """One line of `ls`. Money: None is an unknown price; uptime None is not running."""

    name: str
    current: bool
    provider: str
    region: str
    nodes: int
    instance_type: str
    zones: str  # "" when unknown
    state: str
    uptime_s: float | None
    hourly_usd: float | None
    so_far_usd: float | None
    note: str
    priced: bool = True  # False: no price to show at all (a record the cloud no longer knows)
    stopped_monthly_usd: float | None = None  # a stopped cluster's disks per month (None: not stopped, or unknown)


@dataclass(frozen=True)
class Listing:
    rows: tuple[Row, ...]
    hourly_usd: float  # of the rows with a known price
    so_far_usd: float
    unknown: int  # rows whose price is unknown (not in the totals)
    stopped_monthly_usd: float = 0.0  # the disks of the stopped clusters, per month (of those with a known price)


def listing_json(found: Listing) -> dict[str, Any]:
    """`ls --json`: the keys docs/hosts-and-state.md lists, stable for scripts (added to, never renamed)."""
    rows = [{f.name: getattr(r, f.name) for f in fields(r) if f.name != "priced"} for r in found.rows]
    for row, r in zip(rows, found.rows):
        if not r.priced:
            row["hourly_usd"] = row["so_far_usd"] = None
    totals = {
        "hourly_usd": found.hourly_usd,
        "so_far_usd": found.so_far_usd,
        "unpriced": found.unknown,
        "stopped_monthly_usd": found.stopped_monthly_usd,
    }
    return {"clusters": rows, "total": totals}


def listing(
    store: StateStore,
    providers: Providers,
    provider: str | None,
    region: str | None,
    warn: Callable[[str], None],
    now: float | None = None,
) -> Listing:
    """Every cluster: the cloud's view of every region a record names (or the one given) and every record."""
    now = time.time() if now is None else now
    current = store.current()
    listed, damaged = store.list()
    for line in damaged:
        warn(line)
    records = {r.cluster.name: r for r in listed}
    # only the providers that can have something to say: those of a record and --provider's (every one with --region)
    cloud, here = providers.split(
        None if region else {r.cluster.provider for r in records.values()} | ({provider} if provider else set())
    )
    asked: dict[str, set[str | None]] = {}  # cloud provider -> the regions asked of it
    for kind in cloud:
        regions: set[str | None] = {r.cluster.region for r in records.values() if r.cluster.provider == kind}
        if provider == kind or region:
            regions = {region} if region else (regions or {None})
        asked[kind] = regions
    rows, seen = [], set()
    hourly_sum, so_far_sum, unknown, stopped_sum = 0.0, 0.0, 0, 0.0
    for kind, reg in sorted(((k, r) for k, regs in asked.items() for r in regs), key=lambda kr: (kr[0], str(kr[1]))):
        impl = providers.get(kind, reg)
        for st in impl.statuses():
            cname = st.name
            hourly, so_far = st.hourly_usd, st.cost_so_far(now)
            hourly_sum += hourly or 0.0
            so_far_sum += so_far or 0.0
            unknown += hourly is None or so_far is None
            rec = records.get(cname)
            rec = rec if rec is not None and rec.cluster.provider == impl.name else None
            if rec is not None and not st.recorded:  # another owner's of the same name: not the one recorded
                note = f"not this machine's: {st.owner or 'another owner'}'s cluster of the same name"
            else:
                note = "; ".join(disagreements(rec, st))
                seen.add(cname)
            states: dict[str, int] = {}
            for ns in st.nodes:
                states[ns.state] = states.get(ns.state, 0) + 1
            started = [ns.launched_at for ns in st.nodes if ns.launched_at]
            monthly = st.disks_monthly_usd if st.stopped else None
            if st.stopped:  # who stopped it and when (`clusterctl stop`'s record), and what it costs now
                said = rec.note if rec is not None and rec.disks_kept and st.recorded else ""
                note = "; ".join(x for x in (said, note, costs.stopped_line(monthly)) if x)
                stopped_sum += monthly or 0.0
            rows.append(
                Row(
                    cname,
                    cname == current and (rec is None or st.recorded),
                    impl.name,
                    impl.region,
                    len(st.nodes),
                    st.instance_type,
                    ",".join(sorted({ns.zone for ns in st.nodes if ns.zone})),
                    ", ".join(f"{v} {k}" for k, v in sorted(states.items())) or "no nodes",
                    now - min(started) if started else None,
                    hourly,
                    so_far,
                    note,
                    stopped_monthly_usd=monthly,
                )
            )
    for cname, r in records.items():
        if cname in seen:
            continue
        c = r.cluster
        gone = c.region in asked.get(c.provider, set())  # its cloud was asked and no longer has it
        free = c.provider in here  # this machine's clusters cost nothing
        monthly = 0.0 if free and r.disks_kept else None
        note = "; ".join(disagreements(r, None)) if gone else r.note
        if free and r.disks_kept:
            note = "; ".join(x for x in (note, costs.stopped_line(monthly)) if x)
        rows.append(
            Row(
                cname,
                cname == current,
                c.provider,
                c.region,
                len(c.nodes),
                c.instance_type,
                c.facts.zone if gone else "",
                "not in the cloud" if gone else r.status,
                now - c.created_at if r.status == "up" and not gone else None,
                0.0 if free else None,
                0.0 if free else None,
                note,
                priced=free,
                stopped_monthly_usd=monthly,
            )
        )
    return Listing(tuple(rows), hourly_sum, so_far_sum, unknown, stopped_sum)


def disagreements(record: Record | None, status: ClusterStatus | None) -> list[str]:
    """Where the local record and the provider's view (a ClusterStatus, or None) of one cluster differ."""
    notes = []
    if record is None:
        if status is not None:
            notes.append(
                "no local record on this machine (its keys are elsewhere or lost); "
                f"`clusterctl down {status.name}` still removes it"
            )
        return notes
    name = record.cluster.name
    if status is None or (not status.nodes and not status.other):
        notes.append(
            f"the local record says {record.status}, but the provider has nothing for it "
            f"(`clusterctl down {name}` removes the stale record)"
        )
        return notes
    if not status.nodes:
        notes.append(f"no nodes, but {len(status.other)} resource(s) remain (`clusterctl down {name}` removes them)")
        return notes
    if record.status == "creating":
        notes.append("the local record says creating (an `up` did not finish)")
    elif record.status == "stopped" and not status.stopped:
        notes.append(f"the local record says stopped, but nodes run (`clusterctl stop {name}` stops them)")
    mine = {n.instance_id or n.private_ip for n in record.cluster.nodes}
    theirs = {s.node.instance_id or s.node.private_ip for s in status.nodes}
    if mine != theirs:
        notes.append(
            f"nodes differ: the record has {len(mine)}, the provider {len(theirs)} "
            f"({len(mine - theirs)} only in the record, {len(theirs - mine)} only in the provider)"
        )
    gone = [n.name for n in record.cluster.nodes if (n.instance_id or n.private_ip) not in theirs]
    if gone and record.status == "up":
        notes.append(f"lost: {', '.join(gone)} (`clusterctl repair {name}` replaces them, --drop removes them)")
    stopped = [s.node.name for s in status.nodes if s.state not in ("running",)]
    if stopped and not status.stopped:  # a whole cluster stopped says so in its state
        notes.append(f"not running: {', '.join(stopped)}")
    return notes
