"""Typed values that cross module borders. Frozen: nothing downstream edits a cluster in place."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterator, Literal, Mapping

from clusterctl.errors import exit_status

Role = Literal["leader", "member"]


@dataclass(frozen=True)
class Node:
    name: str  # e.g. "demo-leader", "demo-member-1"
    private_ip: str  # what the nodes use among themselves; goes into the hosts file
    slots: int  # processes (GPUs) per node
    role: Role
    ssh_user: str = "root"
    ssh_port: int = 22
    public_ip: str | None = None  # what the operator connects to, when it differs
    instance_id: str | None = None

    @property
    def ssh_host(self) -> str:
        """The address the operator's machine dials."""
        return self.public_ip or self.private_ip

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Node":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class ClusterFacts:
    """Typed reads of Cluster.extra, the string map a record keeps (its JSON stays as it was). Every key read
    outside the provider that writes it is here, so a caller never spells one."""

    extra: Mapping[str, str]

    def _flag(self, key: str) -> bool:
        return self.extra.get(key) == "true"

    @property
    def gpus(self) -> int | None:
        """GPUs per node as the provider recorded them (AWS: DescribeInstanceTypes); None when not recorded."""
        got = str(self.extra.get("gpus", ""))
        return int(got) if got.isdigit() else None

    @property
    def gpu_model(self) -> str:
        return str(self.extra.get("gpu_model", ""))

    @property
    def python(self) -> str:  # the interpreter jobs run with on the nodes (the runtime's, or --python's)
        return self.extra.get("python", "")

    @property
    def runtime(self) -> str:  # the node runtime's id ("" when none was installed)
        return self.extra.get("runtime", "")

    @property
    def runtime_dali(self) -> bool:  # the runtime was asked with DALI on CPU nodes too (`up --runtime dali`)
        return self._flag("runtime_dali")

    @property
    def cuda_home(self) -> str:  # the CUDA 12 toolkit a GPU runtime was built with ("" elsewhere)
        return self.extra.get("cuda_home", "")

    @property
    def efa(self) -> bool:
        return self._flag("efa")

    @property
    def efa_rdma(self) -> bool:  # p4d/p5: device RDMA; p3dn's EFA has none
        return self._flag("efa_rdma")

    @property
    def spot(self) -> bool:
        return self._flag("spot")

    @property
    def cluster_id(self) -> str:  # the provider's random id of the cluster ("" for clusters made before ids)
        return self.extra.get("cluster_id", "")

    @property
    def owner(self) -> str:
        return self.extra.get("owner", "")

    @property
    def zone(self) -> str:
        return self.extra.get("az", "")

    @property
    def datasets(self) -> tuple[str, ...]:
        """The DSTs `sync` put on the nodes and verified (as the nodes read them: relative ones in the login home),
        in the order first synced: what `repair` copies to a new node."""
        return tuple(d for d in self.extra.get("datasets", "").split("\n") if d)

    @property
    def autostop(self) -> Autostop | None:
        """The watchdog's settings as `up` recorded them; None when the cluster has none."""
        if "autostop_idle_stop" not in self.extra:
            return None

        def seconds(key: str) -> int | None:
            value = self.extra.get(key, "")
            return int(value) if value.isdigit() else None

        # a record from before --idle-action names none: terminate, what the watchdog did then
        action = "stop" if self.extra.get("autostop_idle_action") == "stop" else "terminate"
        return Autostop(seconds("autostop_idle_stop"), seconds("autostop_max_lifetime"), action)


@dataclass(frozen=True)
class NodeRuntime:
    """What a cluster's jobs run with on the nodes: the runtime's id ("none", "own" for `up --python`, or a
    built runtime's id), its Python ("" when jobs use the nodes' own python3) and, for a GPU runtime, the
    CUDA 12 toolkit folder it was built with (its ptxas and libdevice are the ones XLA must use)."""

    id: str
    python: str = ""
    cuda_home: str = ""
    dali: bool = False  # `up --runtime dali` asked for it (GPU runtimes carry DALI anyway): `start` asks the same

    def extra(self) -> dict[str, str]:
        """The record's fields (Cluster.extra) for it."""
        return {
            "runtime": self.id,
            **({"python": self.python} if self.python else {}),
            **({"cuda_home": self.cuda_home} if self.cuda_home else {}),
            **({"runtime_dali": "true"} if self.dali else {}),
        }


@dataclass(frozen=True)
class Cluster:
    name: str
    provider: str  # "local" | "aws"
    nodes: tuple[Node, ...]  # leader first, then members in stable order
    region: str = "local"
    instance_type: str = "local"
    created_at: float = 0.0
    extra: Mapping[str, str] = field(default_factory=dict)  # provider facts (bridge, vpc id, ...): read via .facts

    @property
    def leader(self) -> Node:
        return self.nodes[0]

    @property
    def members(self) -> tuple[Node, ...]:
        return self.nodes[1:]

    @property
    def total_slots(self) -> int:
        return sum(n.slots for n in self.nodes)

    @property
    def facts(self) -> ClusterFacts:
        """The record's provider facts, typed (the record keeps them as strings in `extra`)."""
        return ClusterFacts(self.extra)

    def with_runtime(self, runtime: NodeRuntime) -> Cluster:
        return replace(self, extra={**self.extra, **runtime.extra()})

    def with_dataset(self, dst: str) -> Cluster:
        """The record with `dst` among its datasets (ClusterFacts.datasets; a DST holds no control character)."""
        if "\n" in dst or not dst or dst in self.facts.datasets:
            return self
        return replace(self, extra={**self.extra, "datasets": "\n".join((*self.facts.datasets, dst))})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["extra"] = dict(self.extra)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Cluster":
        return cls(
            name=data["name"],
            provider=data["provider"],
            nodes=tuple(Node.from_dict(n) for n in data["nodes"]),
            region=data.get("region", "local"),
            instance_type=data.get("instance_type", "local"),
            created_at=float(data.get("created_at", 0.0)),
            extra=dict(data.get("extra", {})),
        )


@dataclass(frozen=True)
class Autostop:
    """When the cluster stops itself (see autostop.py): after `idle_stop_s` seconds with nothing busy, and
    `max_lifetime_s` seconds after it was made; None turns either off."""

    idle_stop_s: int | None = 3600
    max_lifetime_s: int | None = None
    # What firing does (--idle-action): "stop" keeps the disks (`clusterctl start NAME` starts the cluster again),
    # "terminate" removes the nodes and their disks (autostop/settings.py says more).
    idle_action: str = "stop"

    @property
    def enabled(self) -> bool:
        return bool(self.idle_stop_s or self.max_lifetime_s)

    def extra(self) -> dict[str, str]:
        """The record's fields (Cluster.extra) for these settings: ClusterFacts.autostop reads them back."""
        return {
            "autostop_idle_stop": str(self.idle_stop_s or ""),
            "autostop_max_lifetime": str(self.max_lifetime_s or ""),
            "autostop_idle_action": self.idle_action,
        }


def node_names(cluster: str, count: int) -> list[str]:
    """Every provider names a cluster's nodes the same way: NAME-leader, NAME-member-1, ..."""
    return [f"{cluster}-leader"] + [f"{cluster}-member-{i}" for i in range(1, count)]


def node_index(cluster: str, name: str) -> int | None:
    """A node's index from its name as node_names gives it (NAME-leader 0, NAME-member-K K); None for another."""
    if name == f"{cluster}-leader":
        return 0
    tail = name.removeprefix(f"{cluster}-member-")
    return int(tail) if tail != name and tail.isdigit() else None


def next_members(cluster: Cluster, count: int) -> list[str]:
    """The names of `count` more members: after the highest index the cluster's names hold (a gap left by
    `repair --drop` is not reused, so a name never means two machines)."""
    top = max((node_index(cluster.name, n.name) or 0 for n in cluster.nodes), default=0)
    return [f"{cluster.name}-member-{i}" for i in range(top + 1, top + 1 + count)]


@dataclass(frozen=True)
class ClusterSpec:
    """What the user asked for; providers turn it into a Cluster."""

    name: str
    provider: str
    nodes: int
    slots: int | None = None  # None: from the instance type (AWS) or 1 (local)
    instance_type: str = "local"
    region: str = "local"
    options: Mapping[str, object] = field(default_factory=dict)  # provider-specific settings
    autostop: Autostop | None = None  # None: no watchdog on the nodes


@dataclass(frozen=True)
class Step:
    """News of a step that can take a while (doctor's probe, a bench rung, the runtime relay), for the CLI's
    progress line. phase: "begin", then any "advance", then "end"; `name` tells the step's news apart."""

    name: str  # what is being done: "allreduce over 3 node(s)"
    phase: Literal["begin", "advance", "end"] = "begin"
    done: int = 0
    total: int | None = None  # an amount known in advance (a bar); None: the time it has taken so far
    unit: Literal["", "bytes"] = ""
    detail: str = ""  # at "end": how it went ("3 of 3 verified"), shown with the time it took


OnStep = Callable[[Step], None]


def no_steps(step: Step) -> None:
    """An OnStep that shows nothing (tests, playbooks)."""


def step_lines(report: Callable[[str], None]) -> OnStep:
    """Steps as report lines, where each begins and how it ended (for a caller with no progress line: repair)."""

    def said(step: Step) -> None:
        if step.phase == "begin":
            report(f"{step.name} ...")
        elif step.phase == "end":
            report(f"{step.name}: {step.detail or 'done'}")

    return said


HostStatus = Literal["ok", "failed", "unreachable", "timeout"]


@dataclass(frozen=True)
class HostResult:
    host: str
    exit_code: int | None  # None when the command never finished (unreachable, timeout)
    stdout: str = ""
    stderr: str = ""
    error: str | None = None  # why the host was unreachable, in one line
    timed_out: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    @property
    def status(self) -> HostStatus:
        if self.timed_out:
            return "timeout"
        if self.error is not None and self.exit_code is None:
            return "unreachable"
        return "ok" if self.exit_code == 0 else "failed"

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status
        return data


# Remote exit codes are passed through but capped below 124, so they never read as timeout/Ctrl-C.
MAX_PASSED_EXIT = 123


@dataclass(frozen=True)
class RunReport:
    """One HostResult per host, in the order of the hosts given. Never raised: the caller decides."""

    results: tuple[HostResult, ...]

    def __iter__(self) -> Iterator[HostResult]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __getitem__(self, host: str) -> HostResult:
        for r in self.results:
            if r.host == host:
                return r
        raise KeyError(host)

    def by_status(self, status: HostStatus) -> tuple[HostResult, ...]:
        return tuple(r for r in self.results if r.status == status)

    @property
    def succeeded(self) -> tuple[HostResult, ...]:
        return self.by_status("ok")

    @property
    def failed(self) -> tuple[HostResult, ...]:
        return tuple(r for r in self.results if not r.ok)

    @property
    def all_ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def exit_code(self) -> int:
        """The tool's exit status for this run: timeout beats unreachable beats the worst remote code."""
        worst = max((r.exit_code or 0 for r in self.results), default=0)
        return exit_status(
            bool(self.by_status("timeout")), bool(self.by_status("unreachable")), min(worst, MAX_PASSED_EXIT)
        )
