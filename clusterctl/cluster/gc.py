"""`clusterctl gc`: everything clusterctl made, wherever it looks, whether or not this machine remembers it.

AWS: every resource of the region (and IAM) tagged `clusterctl:cluster` (AwsProvider.inventory); this
machine: every local cluster's namespaces and config folders (providers/netns.py). Each cluster is shown
with its age (its oldest resource) and owner (the `clusterctl:owner` tag: user@host that made it). On AWS a
cluster is one identity (its name and `clusterctl:id`; before ids, name and owner), and what is removed is
exactly the resource ids listed and confirmed (AwsProvider.remove), never a search by tag value (EC2 reads `*`
in one as a wildcard); another owner's clusters are kept unless --force. Local clusters are removed by
their provider's terminate, as `down` does (nothing here deletes anything).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from clusterctl.providers.base import Found


@dataclass(frozen=True)
class Leftover:
    """One cluster's resources, as found."""

    name: str
    provider: str  # "aws" | "local"
    region: str
    found: tuple[Found, ...]
    record: str  # the local record's status here ("up", "stopped" ...), "" when this machine has none
    cluster_id: str = ""  # AWS: its `clusterctl:id` ("" for clusters made before ids: name + owner)
    mine: bool = True  # made by this user@host (another owner's is removed only with --force)

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
        return f"aws {self.region}" if self.provider == "aws" else "local"

    def kinds(self) -> str:
        counts = Counter(f.kind for f in self.found)
        return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def local_found() -> list[Found]:
    """Namespaces (and their config folders) of every local cluster on this machine."""
    from clusterctl.proc import owner
    from clusterctl.providers.local import netns

    names = set(netns.all_clusters())
    etc = Path("/etc/netns")
    if etc.is_dir():
        for d in etc.iterdir():
            if d.name.startswith(netns.NETNS_PREFIX) and d.name.rsplit("-", 1)[-1].isdigit():
                names.add(d.name[len(netns.NETNS_PREFIX):].rsplit("-", 1)[0])
    me = owner()
    out = []
    for name in sorted(names):
        left = netns.leftovers(name)
        for ns in left.netns:
            out.append(Found(name, "namespace", ns, _mtime(Path("/run/netns") / ns), me,
                             f"{len(netns.netns_pids(ns))} process(es)"))
        out += [Found(name, "link", link, None, me) for link in left.links]
        out += [Found(name, "config folder", d, _mtime(Path(d)), me) for d in left.etc_dirs
                if not any(d.endswith("/" + ns) for ns in left.netns)]
    return out


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def group(found: list[Found], provider: str, region: str, records: dict, me: str | None = None) -> list[Leftover]:
    """One Leftover per identity: name and cluster id (before ids: name and owner)."""
    if me is None:
        from clusterctl.proc import owner

        me = owner()
    by: dict[tuple[str, str, str], list[Found]] = {}
    for f in found:
        by.setdefault((f.cluster, f.cluster_id, "" if f.cluster_id else f.owner), []).append(f)
    out = []
    for (name, cid, _), items in sorted(by.items()):
        rec = records.get(name)
        status = rec.status if rec is not None and _same(rec.cluster, provider, cid) else ""
        c = Leftover(name, provider, region, tuple(items), status, cid)
        out.append(dataclasses.replace(c, mine=provider == "local" or c.owner == me))
    return out


def _same(cluster, provider: str, cluster_id: str) -> bool:
    """The local record is this identity's (a record made before ids matches the id-less identity)."""
    return cluster.provider == provider and (provider != "aws" or cluster.extra.get("cluster_id", "") == cluster_id)


def record_of(c: Leftover, records: dict):
    """The local record that belongs to this leftover (removed with it), or None."""
    rec = records.get(c.name)
    return rec if rec is not None and _same(rec.cluster, c.provider, c.cluster_id) else None


def select(leftovers: list[Leftover], older_than: float | None, now: float | None = None) -> list[Leftover]:
    """The clusters at least `older_than` seconds old (all of them without a limit; an unknown age never
    passes a limit)."""
    if older_than is None:
        return list(leftovers)
    now = now or time.time()
    return [c for c in leftovers if c.created_at is not None and now - c.created_at >= older_than]
