"""`clusterctl gc`: everything clusterctl made, wherever it looks, whether or not this machine remembers it.

AWS: every resource of the region (and IAM) tagged `clusterctl:cluster` (AwsProvider.everything_made); this
machine: every local cluster's namespaces and config folders (LocalProvider.everything_made). Each cluster is
shown with its age (its oldest resource) and owner (AWS: the `clusterctl:owner` tag; local: the CLUSTERCTL_HOME
that made it); it is the caller's when the provider owns() that owner (its me(); on AWS also this machine's user as
tagged before owners were AWS identities, user@host). On AWS a
cluster is one identity (its name and `clusterctl:id`; before ids, name and owner), and what is removed is
exactly the resource ids listed and confirmed (AwsProvider.remove), never a search by tag value (EC2 reads `*`
in one as a wildcard); another owner's clusters (another home's, locally) are kept unless --force. Without
--older-than, a cluster this machine has no record of is removed only once it is UNRECORDED_AGE old: one made a
moment ago on another machine (or by a colleague on the same role) may be in use; --force does not change that.
Local clusters are removed by
their provider's terminate, as `down` does. scan() finds and chooses (nothing changes); remove() removes
what the user confirmed, each provider's remove(), and the record with it (collect(): with the connection agent
stopped first, and an error naming what is left).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

from clusterctl.providers.base import Found, Provider

UNRECORDED_AGE = 3600.0  # without --older-than: how old a cluster this machine has no record of must be to go

if TYPE_CHECKING:
    from clusterctl.state import Record, StateStore
    from clusterctl.types import Cluster


class Providers(Protocol):
    """One provider per (name, region): overview.Providers (not imported: overview imports gc)."""

    def get(self, kind: str, region: str | None) -> Provider: ...


@dataclass(frozen=True)
class Leftover:
    """One cluster's resources, as found."""

    name: str
    provider: str  # "aws" | "local"
    region: str
    found: tuple[Found, ...]
    record: str  # the local record's status here ("up", "stopped" ...), "" when this machine has none
    cluster_id: str = ""  # AWS: its `clusterctl:id` ("" for clusters made before ids: name + owner)
    mine: bool = True  # made by this caller (provider.owns(); another owner's is removed only with --force)
    elsewhere: bool = False  # its provider is shared with other machines (a cloud account): one made there has
    # no record here, young or old (locally every cluster is this machine's and carries its owner's mark)

    @property
    def created_at(self) -> float | None:
        known = [f.created_at for f in self.found if f.created_at]
        return min(known) if known else None

    @property
    def owner(self) -> str:
        owners = Counter(f.owner for f in self.found if f.owner)
        return owners.most_common(1)[0][0] if owners else ""

    @property
    def where(self) -> str:
        return self.provider if self.region in ("", self.provider) else f"{self.provider} {self.region}"

    def kinds(self) -> str:
        counts = Counter(f.kind for f in self.found)
        return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def group(
    found: list[Found],
    provider: str,
    region: str,
    records: dict[str, Record],
    owns: Callable[[str], bool] = lambda owner: False,
    elsewhere: bool = False,
) -> list[Leftover]:
    """One Leftover per identity: name and cluster id (before ids: name and owner); `mine` when `owns` its owner
    (the provider's owns(): the caller as that provider records owners; the default makes none the caller's)."""
    by: dict[tuple[str, str, str], list[Found]] = {}
    for f in found:
        by.setdefault((f.cluster, f.cluster_id, "" if f.cluster_id else f.owner), []).append(f)
    out = []
    for (name, cid, _), items in sorted(by.items()):
        rec = records.get(name)
        status = rec.status if rec is not None and _same(rec.cluster, provider, cid) else ""
        c = Leftover(name, provider, region, tuple(items), status, cid, elsewhere=elsewhere)
        out.append(dataclasses.replace(c, mine=owns(c.owner)))
    return out


def _same(cluster: Cluster, provider: str, cluster_id: str) -> bool:
    """The local record is this identity's (a record made before ids matches the id-less identity)."""
    return cluster.provider == provider and cluster.facts.cluster_id == cluster_id


def record_of(c: Leftover, records: dict[str, Record]) -> Record | None:
    """The local record that belongs to this leftover (removed with it), or None."""
    rec = records.get(c.name)
    return rec if rec is not None and _same(rec.cluster, c.provider, c.cluster_id) else None


def select(leftovers: list[Leftover], older_than: float | None, now: float | None = None) -> list[Leftover]:
    """The clusters at least `older_than` seconds old (an unknown age never passes a limit). Without a limit: the
    ones this machine has a record of, and the others once UNRECORDED_AGE old (nothing here proves one younger is
    forgotten: another machine may have made it a moment ago)."""
    now = now or time.time()

    def old(c: Leftover, limit: float) -> bool:
        return c.created_at is not None and now - c.created_at >= limit

    if older_than is None:
        return [c for c in leftovers if c.record or not c.elsewhere or old(c, UNRECORDED_AGE)]
    return [c for c in leftovers if old(c, older_than)]


@dataclass(frozen=True)
class Scan:
    """What `gc` found and what it would remove (nothing changed yet)."""

    found: tuple[Leftover, ...]
    chosen: tuple[Leftover, ...]  # old enough, and the user's (or --force)
    others: tuple[Leftover, ...]  # old enough, but another owner's: kept without --force
    not_looked: tuple[str, ...]  # one line per provider that was not asked, and why
    young: tuple[Leftover, ...] = ()  # without --older-than: no record here and younger than UNRECORDED_AGE

    def notes(self, older_than: str | None) -> list[str]:
        """What is kept and why (no record here and young, another owner's), and why nothing is to be removed, when nothing is
        (`older_than`: the --older-than text given, if any)."""
        lines = []
        if self.young:
            kept = ", ".join(c.name if c.mine else f"{c.name} of {c.owner or 'unknown'}" for c in self.young)
            lines.append(
                f"kept: {len(self.young)} cluster(s) this machine has no record of, younger than "
                f"{UNRECORDED_AGE / 3600:g}h or of unknown age ({kept}): they may be in use elsewhere; "
                "--older-than AGE removes those at least that old"
            )
        if self.others:
            kept = ", ".join(f"{c.name} of {c.owner or 'unknown'}" for c in self.others)
            lines.append(f"kept: {len(self.others)} cluster(s) of other owners ({kept}); --force removes them")
        if not self.chosen:
            lines.append(
                f"nothing is older than {older_than}"
                if older_than and not self.others
                else "nothing to remove now"
                if self.young
                else "nothing of yours to remove"
            )
        return lines

    def question(self) -> str:
        """The confirmation asked before the chosen clusters are removed."""
        named = ", ".join(c.name + ("" if c.mine else f" (owner {c.owner or 'unknown'})") for c in self.chosen)
        total = sum(len(c.found) for c in self.chosen)
        return f"Remove {total} resource(s) of {len(self.chosen)} cluster(s) ({named})?"


def scan(
    store: StateStore,
    providers: Providers,
    provider: str | None,
    region: str | None,
    older_than: float | None,
    force: bool,
    warn: Callable[[str], None],
    now: float | None = None,
) -> Scan:
    """Every provider's inventory (or --provider's), grouped by cluster identity, chosen by age and owner.
    A provider without a region (AWS, none configured) is skipped with a line, or refused when named."""
    from clusterctl import providers as registry
    from clusterctl.errors import ConfigError, UsageError

    if provider is not None and provider not in registry.names():
        raise UsageError(f"unknown provider {provider!r}", f"use {' or '.join(registry.names())}")
    listed, damaged = store.list()
    for line in damaged:
        warn(line)
    records = {r.cluster.name: r for r in listed}
    found: list[Leftover] = []
    not_looked = []
    for kind in [provider] if provider else registry.names():
        impl = providers.get(kind, region)
        try:
            where = impl.region
        except ConfigError:
            if provider is not None:
                raise UsageError("no AWS region given", "pass --region or set AWS_REGION") from None
            not_looked.append(f"{kind}: no region configured, not looked at (--region R looks there)")
            continue
        found += group(impl.everything_made(), kind, where, records, impl.owns, impl.lists_from_cloud)
    now = time.time() if now is None else now
    old = select(found, older_than, now)
    chosen = [c for c in old if force or c.mine]
    others = [c for c in old if not c.mine and c not in chosen]
    young = [c for c in found if older_than is None and c not in old]
    return Scan(tuple(found), tuple(chosen), tuple(others), tuple(not_looked), tuple(young))


def collect(store: StateStore, providers: Providers, chosen: Iterable[Leftover], report: Callable[[str], None]) -> None:
    """Remove the chosen clusters (the connection agent stopped first: it may hold connections to them);
    raises ProvisionError naming what is left."""
    from clusterctl.errors import ProvisionError
    from clusterctl.remote import agent

    agent.stop(store.root)
    failed = remove(store, providers, chosen, report)
    if failed:
        raise ProvisionError(f"some resources remain ({' | '.join(failed)})", "run `clusterctl gc` again")


def remove(
    store: StateStore, providers: Providers, chosen: Iterable[Leftover], report: Callable[[str], None]
) -> list[str]:
    """Remove exactly what each chosen cluster's provider found (and the cluster's record here, when it is
    this identity's and nothing is left); one "name: what is left" line per cluster not wholly gone."""
    records = {r.cluster.name: r for r in store.list()[0]}
    failed = []
    for c in chosen:
        teardown = providers.get(c.provider, c.region).remove(c.found)
        for line in teardown.removed:
            report(f"removed {line}")
        if teardown.clean and record_of(c, records) is not None:
            with store.lock(c.name):
                store.delete(c.name)
        if teardown.clean:
            report(f"cluster {c.name} ({c.where}) is gone: nothing of it is left")
        else:
            failed.append(f"{c.name}: {'; '.join(teardown.left)}")
    return failed
