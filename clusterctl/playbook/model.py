"""A playbook as typed values: one frozen spec per step kind, what load.py builds and steps.py runs.

A spec's fields are the step's YAML fields: a field without a default is required, the annotation is
the type load.py converts the rendered value to (and refuses what does not convert), so adding a field
is one line here and one use in steps.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Union

from clusterctl.errors import ConfigError
from clusterctl.types import OnStep, no_steps

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.state import StateStore

Nodes = Literal["all", "leader", "members"]
OnFailure = Literal["stop", "continue"]


class PlaybookError(ConfigError):
    pass


@dataclass(frozen=True)
class Expect:
    exit: int = 0
    output: str | None = None  # a regular expression searched for in every host's stdout


@dataclass(frozen=True)
class RunSpec:
    command: str  # shell: variables go in shell-quoted ({{ v | raw }} opts out)
    nodes: Nodes = "all"
    timeout: float | None = None
    expect: Expect = Expect()


@dataclass(frozen=True)
class PutSpec:
    template: str
    dest: str
    nodes: Nodes = "all"
    mode: int = field(default=0o644, metadata={"octal": True})  # written 644, as chmod takes it
    vars: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DoctorSpec:
    python: str | None = None


@dataclass(frozen=True)
class BenchSpec:
    """None: bench.BenchOptions' default (the one place the bench defaults are written)."""

    model: str | None = None
    ladder: str = ""  # empty: 1 GPU, one full node, every node
    batch_size: int | None = None
    steps: int | None = None
    iters: int | None = None
    max_seconds: float | None = None
    warmup_steps: int | None = None
    threshold: float | None = None
    timeout: float | None = None
    out: str = "bench-results"


@dataclass(frozen=True)
class SyncSpec:
    src: str
    dst: str
    strategy: str = "chain"  # one of data.plan.STRATEGIES (load.py checks)
    fanout: int = 1
    delete: bool = False
    endpoint_url: str | None = None


@dataclass(frozen=True)
class TrainSpec:
    data: str | None = None
    epochs: float | None = None
    batch_size: int | None = None
    model: str = "resnet50"
    synthetic: bool = False
    wait: bool = True
    extra: tuple[str, ...] = ()


@dataclass(frozen=True)
class EvalSpec:
    """The latest checkpoint of the cluster's training job, on the leader: nothing to choose."""


@dataclass(frozen=True)
class CleanSpec:
    kill: bool | None = None  # None: kill unless the step only removes logs or shows disks
    all_user_processes: bool = (
        False  # kill: every python/horovodrun/mpirun tree of the user, not only clusterctl's jobs
    )
    logs: str | None = None  # a folder under the login home
    disk: bool = False
    force: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    """`clusterctl launch`: your own Horovod script, horovodrun on the leader in tmux."""

    command: str  # what every rank runs: python SCRIPT [ARGS] (split as the shell splits words)
    files: tuple[str, ...] = ()  # --file: more files for the job folder, relative to the file that names them
    np: int | None = None  # None: every slot
    wait: bool = False  # --attach: follow it to its end


@dataclass(frozen=True)
class PlaySpec:
    """`clusterctl play`: a playbook (a path beside the file that names it, or a shipped one's name)."""

    playbook: str
    vars: Mapping[str, Any] = field(default_factory=dict)


Spec = Union[RunSpec, PutSpec, DoctorSpec, BenchSpec, SyncSpec, TrainSpec, EvalSpec, CleanSpec, LaunchSpec, PlaySpec]
SPECS: dict[str, type] = {
    "run": RunSpec,
    "put": PutSpec,
    "doctor": DoctorSpec,
    "bench": BenchSpec,
    "sync": SyncSpec,
    "train": TrainSpec,
    "eval": EvalSpec,
    "clean": CleanSpec,
    "launch": LaunchSpec,
}
JOB_SPECS: dict[str, type] = {**SPECS, "play": PlaySpec}  # a spec file's job may be a whole playbook
_KIND = {spec: kind for kind, spec in JOB_SPECS.items()}


@dataclass(frozen=True)
class Step:
    name: str
    spec: Spec  # rendered: no template left in any string
    given: tuple[str, ...]  # the fields the file sets, in its order (what --dry-run shows)
    on_failure: OnFailure
    line: int

    @property
    def kind(self) -> str:
        return _KIND[type(self.spec)]


@dataclass(frozen=True)
class Playbook:
    name: str
    path: str
    steps: tuple[Step, ...]
    variables: Mapping[str, str]


@dataclass(frozen=True)
class StepResult:
    step: Step
    ok: bool
    detail: str
    skipped: bool = False


@dataclass
class Context:
    """What steps run against; built by the caller (the CLI) from the cluster."""

    inventory: Inventory
    store: StateStore
    report: Callable[[str], None] = lambda _: None
    on_step: OnStep = no_steps  # a doctor's or bench's long steps, for a progress line
    results: list[StepResult] = field(default_factory=list)
    base: Path = Path(".")  # the folder of the file the steps are in: a step's local paths are relative to it
