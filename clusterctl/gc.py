"""`clusterctl gc`: everything clusterctl made, wherever it looks, whether or not this machine remembers it.

AWS: every resource of the region (and IAM) tagged `clusterctl:cluster` (AwsProvider.inventory); this
machine: every local cluster's namespaces and config folders (providers/netns.py). Each cluster is shown
with its age (its oldest resource) and owner (the `clusterctl:owner` tag: user@host that made it), and is
removed by its provider's own terminate, the same as `clusterctl down` (nothing here deletes anything).
"""

from __future__ import annotations

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
    from clusterctl import autostop
    from clusterctl.providers import netns

    names = set(netns.all_clusters())
    etc = Path("/etc/netns")
    if etc.is_dir():
        for d in etc.iterdir():
            if d.name.startswith(netns.NETNS_PREFIX) and d.name.rsplit("-", 1)[-1].isdigit():
                names.add(d.name[len(netns.NETNS_PREFIX):].rsplit("-", 1)[0])
    me = autostop.owner()
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


def group(found: list[Found], provider: str, region: str, records: dict) -> list[Leftover]:
    by: dict[str, list[Found]] = {}
    for f in found:
        by.setdefault(f.cluster, []).append(f)
    out = []
    for name, items in sorted(by.items()):
        rec = records.get(name)
        status = rec.status if rec is not None and rec.cluster.provider == provider else ""
        out.append(Leftover(name, provider, region, tuple(items), status))
    return out


def select(leftovers: list[Leftover], older_than: float | None, now: float | None = None) -> list[Leftover]:
    """The clusters at least `older_than` seconds old (all of them without a limit; an unknown age never
    passes a limit)."""
    if older_than is None:
        return list(leftovers)
    now = now or time.time()
    return [c for c in leftovers if c.created_at is not None and now - c.created_at >= older_than]
