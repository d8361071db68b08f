"""`up` before anything is made: the command line checked against the chosen provider's option schema (its
up_flags, providers/base.py) into a ClusterSpec, the node runtime asked for, and the provider's plan; then the
launch (cluster/provision.py). No provider is named here: what differs is the provider's capabilities."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from clusterctl.errors import UsageError, within
from clusterctl.units import money

if TYPE_CHECKING:
    from clusterctl.providers.base import Plan, Provider
    from clusterctl.runtime.install import RuntimeRequest
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster, ClusterSpec, Node, OnStep


@dataclass(frozen=True)
class UpRequest:
    """`up`'s flags as given; nothing checked yet."""

    provider: str
    nodes: int = 2
    instance_type: str = ""  # --type; a provider without "--type" in its schema names its nodes' type itself
    name: str | None = None
    slots: int | None = None
    region: str | None = None
    given: tuple[str, ...] = ()  # the flags given on the command line (refused when another provider's)
    # The provider's own settings (its option schema), by option name; dropped for a provider without any.
    options: Mapping[str, object] = field(default_factory=dict)
    idle_stop: str | None = "60m"
    max_lifetime: str | None = None
    idle_action: str | None = None
    runtime: str = "install"
    python: str | None = None
    runtime_cache: str | None = None
    runtime_wheels: str | None = None


@dataclass(frozen=True)
class Resize:
    """`up` again on a cluster that is up, asking for another number of nodes: what differs and what `up` does
    about it (more: added as `repair` adds nodes; fewer: the highest-index members removed)."""

    cluster: Cluster  # as recorded
    nodes: int  # asked

    @property
    def line(self) -> str:
        return f"nodes {len(self.cluster.nodes)} -> {self.nodes}"

    @property
    def add(self) -> int:
        return max(0, self.nodes - len(self.cluster.nodes))

    @property
    def remove(self) -> tuple[Node, ...]:
        """The members to remove: those with the highest indexes in their names (the newest), never the leader."""
        from clusterctl.types import node_index

        members = [n for n in self.cluster.nodes if n.role != "leader"]
        members.sort(key=lambda n: node_index(self.cluster.name, n.name) or 0, reverse=True)
        return tuple(members[: max(0, len(self.cluster.nodes) - self.nodes)])

    def question(self) -> str | None:
        """The confirmation removing nodes needs (None when adding)."""
        if not self.remove:
            return None
        names = ", ".join(n.name for n in self.remove)
        return f"Remove {names} from cluster {self.cluster.name} (what they hold is lost)?"


@dataclass(frozen=True)
class UpPlan:
    """What `up` will make (nothing made yet): the spec, its provider, the runtime and the provider's plan;
    for a cluster that is up already, `existing`, and `resize` when asked for another number of nodes."""

    request: UpRequest
    spec: ClusterSpec
    provider: Provider
    runtime: RuntimeRequest
    plan: Plan
    existing: bool = False
    resize: Resize | None = None

    def question(self, max_hourly: float) -> str | None:
        """The confirmation to ask before launching above `max_hourly` $/hour (or at an unknown price); none for a
        cluster that is up and found (nothing is launched: `up` says so and stops)."""
        if self.existing and self.provider.find(self.spec.name) is not None:
            return None
        hourly = self.plan.hourly_usd
        if hourly is not None and hourly <= max_hourly:
            return None
        cost = "an unknown price" if hourly is None else f"{money(hourly)}/hour"
        return f"Launch {self.spec.nodes} x {self.request.instance_type} at {cost}?"


def prepare(
    request: UpRequest,
    store: StateStore,
    make: Callable[[str, str | None], Provider],
    report: Callable[[str], None],
) -> UpPlan:
    """The request checked (every flag before any call to the provider), the spec built and planned; each plan
    line reported as it is known (the runtime's last: it may refuse the image the plan chose)."""
    from clusterctl import providers
    from clusterctl.autostop import settings as autostop
    from clusterctl.runtime.install import plan_line
    from clusterctl.state import validate_name
    from clusterctl.types import ClusterSpec

    kind = providers.provider_class(request.provider)
    providers.refuse_foreign_flags(request.provider, request.given)  # the provider's option schema
    name = validate_name(request.name or kind.default_cluster)
    spot = bool(request.options.get("spot", False))  # one-time spot instances can only be terminated
    stop_rules = autostop.settings(request.idle_stop, request.max_lifetime, request.idle_action, spot=spot)
    within("--slots", request.slots, 1, 1024)
    within("--nodes", request.nodes, 1)
    within("--nodes", request.nodes, 1, kind.max_nodes)
    spec = ClusterSpec(
        name=name,
        provider=request.provider,
        nodes=request.nodes,
        slots=request.slots,
        instance_type=request.instance_type if "--type" in kind.up_flags else request.provider,
        region=request.region or "",
        options=dict(request.options) if kind.up_flags else {},  # checked by the provider (AWS: AwsOptions)
        autostop=stop_rules,
    )
    spec, existing, resize = as_up(spec, request.given, store)
    impl = make(request.provider, request.region)
    runtime = runtime_request(request, impl.builds_runtime_locally)
    # A resize is planned on the cluster as it is (AWS's plan refuses a count other than the instances there);
    # the Resize line says what changes.
    plan = impl.plan(spec if resize is None else replace(spec, nodes=len(resize.cluster.nodes)))
    for line in plan.lines:
        report(line)
    report(f"autostop: {autostop.describe(stop_rules)}")
    report(f"node runtime: {plan_line(runtime, plan.image)}")  # may refuse the image
    if resize is not None:
        report(f"cluster {spec.name} is up: {resize.line}")
    return UpPlan(request, spec, impl, runtime, plan, existing, resize)


def as_up(spec: ClusterSpec, given: tuple[str, ...], store: StateStore) -> tuple[ClusterSpec, bool, Resize | None]:
    """`up` again on a cluster that is up: its plan is the cluster's own shape (not --nodes' default), and
    whether it is up. Asked (by flag or spec file) for another number of nodes, the Resize and the plan of the
    new size; asked for what `up` cannot change on a running cluster (provider, type, slots, region), refused
    before the plan, in one line, rather than planned and then ignored."""
    from clusterctl.errors import ConfigError

    if not store.exists(spec.name):
        return spec, False, None
    record = store.load(spec.name)
    if record.status != "up":
        return spec, False, None
    have = record.cluster
    slots = sorted({n.slots for n in have.nodes})
    differs = [
        f"{flag} {asked} (it has {has})"
        for flag, asked, has, same in (
            ("--provider", spec.provider, have.provider, spec.provider == have.provider),
            ("--slots", spec.slots, "/".join(map(str, slots)), slots == [spec.slots]),
            ("--type", spec.instance_type, have.instance_type, spec.instance_type == have.instance_type),
            ("--region", spec.region, have.region, spec.region == have.region),
        )
        if flag in given and not same
    ]
    if differs:
        raise ConfigError(
            f"cluster {spec.name} is up and `up` does not change its {', '.join(differs)}",
            f"use it as it is (drop those settings), `clusterctl down {spec.name} --yes` first to make it anew, "
            "or choose another --name",
        )
    if "--nodes" in given and spec.nodes != len(have.nodes):
        return spec, True, Resize(have, spec.nodes)
    return replace(spec, nodes=len(have.nodes)), True, None


def resize(
    up: UpPlan, store: StateStore, report: Callable[[str], None], hosts_out: Path, ssh_timeout: float
) -> tuple[Cluster, tuple[Node, ...]]:
    """The plan's Resize carried out (cluster/membership.py: grow, or shrink); the cluster as the record now says,
    and the nodes added."""
    from clusterctl.cluster import membership

    change = up.resize
    assert change is not None  # the caller asks only for a plan that resizes
    if change.add:
        grown = membership.grow(
            store, up.provider, change.cluster, change.add, report=report, hosts_out=hosts_out, ssh_timeout=ssh_timeout
        )
        return grown, grown.nodes[len(change.cluster.nodes) :]
    return membership.shrink(store, up.provider, change.cluster, change.remove, report=report, hosts_out=hosts_out), ()


def runtime_request(request: UpRequest, builds_here: bool) -> RuntimeRequest:
    """--runtime, --python, --runtime-cache and --runtime-wheels as one RuntimeRequest (`builds_here`: this
    machine builds the runtime, so a cache or a wheel mirror for the leader makes no sense)."""
    from clusterctl.runtime.install import RuntimeRequest

    runtime, python = request.runtime, request.python
    cache, wheels = request.runtime_cache, request.runtime_wheels
    if runtime not in ("install", "dali", "none"):
        raise UsageError(f"unknown --runtime {runtime!r}", "use install, dali or none")
    if python is not None and runtime != "install":
        raise UsageError(f"--python and --runtime {runtime} together", "give one of them")
    if (cache or wheels) and builds_here:  # the leader builds (or fetches) it: a cache or wheels are for it
        raise UsageError(
            "--runtime-cache and --runtime-wheels are for AWS clusters",
            "local clusters build the runtime once on this machine and cache it here",
        )
    if python is not None:
        return RuntimeRequest("own", python=python)
    if runtime == "dali":
        return RuntimeRequest("install", cache=cache or "", wheels=wheels or "", dali=True)
    return RuntimeRequest(runtime, cache=cache or "", wheels=wheels or "")  # type: ignore[arg-type]  # checked above


def launch(
    up: UpPlan,
    store: StateStore,
    hosts_out: Path,
    report: Callable[[str], None],
    ssh_timeout: float,
    trust_first_contact: bool,
    on_step: OnStep | None = None,
    matches: str = "",
) -> tuple[Cluster, float]:
    """Make the planned cluster (provision.up); the cluster, and the seconds it took."""
    from clusterctl.cluster import provision
    from clusterctl.runtime.s3cache import S3Cache

    start = time.monotonic()
    cluster = provision.up(
        up.spec,
        store,
        up.provider,
        hosts_out=hosts_out,
        report=report,
        ssh_timeout=ssh_timeout,
        runtime=up.runtime,
        trust_first_contact=trust_first_contact,
        matches=matches,
        runtime_cache=S3Cache(up.runtime.cache, up.provider.object_store()) if up.runtime.cache else None,
        on_step=on_step,
    )
    return cluster, time.monotonic() - start


def plan_json(up: UpPlan, checks: Sequence[str]) -> dict[str, Any]:
    """`up --dry-run --json`: the plan, keys as docs/aws.md lists them (stable: added to, never renamed)."""
    import dataclasses

    from clusterctl.autostop import settings as autostop
    from clusterctl.runtime.install import plan_line

    s, p = up.spec, up.plan
    stop = s.autostop
    return {
        "name": s.name,
        "provider": s.provider,
        "region": s.region or up.provider.region,  # the one the plan was made in (given, or configured)
        "nodes": s.nodes,
        "slots": s.slots,
        "instance_type": s.instance_type,
        "options": {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in s.options.items()},
        "hourly_usd": p.hourly_usd,
        "prices_date": p.prices_date,
        "image": None if p.image is None else dataclasses.asdict(p.image),
        "autostop": None
        if stop is None
        else {
            "idle_stop_s": stop.idle_stop_s,
            "max_lifetime_s": stop.max_lifetime_s,
            "idle_action": stop.idle_action,
            "text": autostop.describe(stop),
        },
        "runtime": plan_line(up.runtime, p.image),
        "resize": None
        if up.resize is None
        else {
            "nodes": len(up.resize.cluster.nodes),
            "to": up.resize.nodes,
            "add": up.resize.add,
            "remove": [n.name for n in up.resize.remove],
        },
        "plan": list(p.lines),
        "checks": list(checks),
    }
