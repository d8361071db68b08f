"""A sweep's state as typed values: the scheduler's state.json (node/sweep/scheduler.py writes it on the
leader every round) read ONCE, here, at the border; everything after it (the live table, --status, results.json,
the plot) reads attributes, never keys.

What a state must hold: the sweep's `id`, `status` and `trials`, each trial's `id` and `state`, each node's
`host`. Every other field has a documented default (below, on the dataclasses), so a state written by an older
scheduler still reads. A state that lacks a required field, or holds a wrong type or an unknown status, is
refused with one RemoteCommandError naming the field (never a KeyError).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, cast, get_args

from clusterctl.errors import RemoteCommandError

SweepStatus = Literal["running", "cancelling", "cancelled", "done", "failed"]
TrialStatus = Literal["queued", "starting", "running", "done", "failed", "lost", "cancelled"]
ENDED: tuple[SweepStatus, ...] = ("done", "cancelled", "failed")  # the sweep's final statuses
FINAL: tuple[TrialStatus, ...] = ("done", "failed", "lost", "cancelled")  # a trial in these never changes again


@dataclass(frozen=True)
class Attempt:
    """One start of a trial on a node (a trial re-queued after its node died has two)."""

    node: str
    gpus: tuple[int, ...] = ()
    started: float | None = None
    ended: float | None = None
    outcome: str | None = None  # done | failed | node died | vanished | cancelled; None while it runs
    log: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "gpus": list(self.gpus),
            "started": self.started,
            "ended": self.ended,
            "outcome": self.outcome,
            "log": self.log,
        }


@dataclass(frozen=True)
class TrialState:
    id: int
    state: TrialStatus
    params: Mapping[str, str] = field(default_factory=dict)
    command: str = ""
    node: str | None = None  # the host it runs or ran on (its last attempt's)
    gpus: tuple[int, ...] | None = None
    sid: int | None = None  # its session id on the node
    started: float | None = None  # the node's clock
    ended: float | None = None
    exit_code: int | None = None
    dispatched: float | None = None  # the leader's clock (for --trial-timeout)
    metric: float | None = None
    error: str | None = None
    requeued: int = 0
    log: str | None = None
    attempts: tuple[Attempt, ...] = ()
    timed_out: bool = False

    @property
    def done_with_metric(self) -> bool:
        return self.state == "done" and self.metric is not None

    def elapsed(self, now: float) -> float | None:
        if not self.started:
            return None
        return (self.ended or now) - self.started

    def where(self) -> str:
        """node/gpuN,M, or - before it started."""
        if not self.node:
            return "-"
        return f"{self.node}/gpu{','.join(str(g) for g in self.gpus or ())}"

    def params_text(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.params.items())

    def to_dict(self) -> dict[str, Any]:
        """As the scheduler writes it, keys in its order (results.json)."""
        out: dict[str, Any] = {
            "id": self.id,
            "params": dict(self.params),
            "command": self.command,
            "state": self.state,
            "node": self.node,
            "gpus": None if self.gpus is None else list(self.gpus),
            "sid": self.sid,
            "started": self.started,
            "ended": self.ended,
            "exit_code": self.exit_code,
            "dispatched": self.dispatched,
            "metric": self.metric,
            "error": self.error,
            "requeued": self.requeued,
            "log": self.log,
            "attempts": [a.to_dict() for a in self.attempts],
        }
        if self.timed_out:
            out["timed_out"] = True
        return out


@dataclass(frozen=True)
class NodeState:
    host: str
    slots: int = 1
    alive: bool = True
    why: str | None = None  # its last ssh failure
    failing_since: float | None = None
    failures: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "slots": self.slots,
            "alive": self.alive,
            "why": self.why,
            "failing_since": self.failing_since,
            "failures": self.failures,
        }


@dataclass(frozen=True)
class SweepMeta:
    """How to show the sweep (config.json's `meta`, copied into the state by the scheduler)."""

    template: tuple[str, ...] = ()
    params: tuple[str, ...] = ()  # empty: the first trial's parameters (SweepState.params)
    metric: str = "metric"  # the metric's name
    metric_regex: str | None = None
    metric_key: str = "metric"
    goal: Literal["max", "min"] = "max"
    log_scale: tuple[str, ...] = ()
    gpus_per_trial: int = 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "template": list(self.template),
            "params": list(self.params),
            "metric": self.metric,
            "metric_regex": self.metric_regex,
            "metric_key": self.metric_key,
            "goal": self.goal,
            "log_scale": list(self.log_scale),
            "gpus_per_trial": self.gpus_per_trial,
        }


@dataclass(frozen=True)
class SweepState:
    id: str
    status: SweepStatus
    trials: tuple[TrialState, ...]
    nodes: tuple[NodeState, ...] = ()
    meta: SweepMeta = SweepMeta()
    pid: int | None = None  # the scheduler's, on the leader
    started: float | None = None
    ended: float | None = None
    updated: float | None = None  # the leader's clock at the last write
    error: str | None = None  # why the scheduler failed
    dir: str | None = None  # the sweep's folder on the nodes

    @property
    def ended_for_good(self) -> bool:
        return self.status in ENDED

    @property
    def params(self) -> tuple[str, ...]:
        """The swept parameters, in the order given (older states without meta: the first trial's)."""
        if self.meta.params:
            return self.meta.params
        return tuple(self.trials[0].params) if self.trials else ()


# ---- reading state.json ---------------------------------------------------------------------------------------
_MISSING = object()


def _damaged(where: str, what: str) -> RemoteCommandError:
    return RemoteCommandError(
        f"the sweep's state on the leader is damaged: {where} {what}",
        "the scheduler writes it (~/clusterctl-sweeps/ID/state.json); --cancel ends the sweep's trials",
    )


def _get(doc: Mapping[str, Any], key: str, kinds: tuple[type, ...], where: str, default: Any = _MISSING) -> Any:
    """doc[key] checked against kinds (bool is no number); absent or null: the default, or refused when required."""
    value = doc.get(key)
    if value is None:
        if default is _MISSING:
            raise _damaged(f"{where}.{key}", "is missing")
        return default
    numeric = float in kinds or int in kinds
    if not isinstance(value, kinds) or (numeric and isinstance(value, bool) and bool not in kinds):
        raise _damaged(
            f"{where}.{key}", f"is {type(value).__name__} {value!r}, not {'/'.join(k.__name__ for k in kinds)}"
        )
    return float(value) if kinds == (float, int) and isinstance(value, (int, float)) else value


def _num(doc: Mapping[str, Any], key: str, where: str) -> float | None:
    return cast("float | None", _get(doc, key, (float, int), where, None))


def _ints(values: list[Any], where: str) -> tuple[int, ...]:
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise _damaged(where, f"holds something that is not a whole number: {values!r}")
    return tuple(values)


def _strs(values: list[Any], where: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in values):
        raise _damaged(where, f"holds something that is not text: {values!r}")
    return tuple(values)


def _choice(doc: Mapping[str, Any], key: str, allowed: tuple[str, ...], where: str, default: Any = _MISSING) -> Any:
    value = _get(doc, key, (str,), where, default)
    if value not in allowed:
        raise _damaged(f"{where}.{key}", f"is {value!r}, not one of {', '.join(allowed)}")
    return value


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise _damaged(where, f"is {type(value).__name__}, not an object")
    return value


def _attempt(doc: Any, where: str) -> Attempt:
    d = _object(doc, where)
    return Attempt(
        node=_get(d, "node", (str,), where),
        gpus=_ints(_get(d, "gpus", (list,), where, []), f"{where}.gpus"),
        started=_num(d, "started", where),
        ended=_num(d, "ended", where),
        outcome=_get(d, "outcome", (str,), where, None),
        log=_get(d, "log", (str,), where, None),
    )


def parse_trial(doc: Any, where: str = "trial") -> TrialState:
    d = _object(doc, where)
    gpus = _get(d, "gpus", (list,), where, None)
    params = _object(_get(d, "params", (dict,), where, {}), f"{where}.params")
    return TrialState(
        id=_get(d, "id", (int,), where),
        state=_choice(d, "state", get_args(TrialStatus), where),
        params={str(k): str(v) for k, v in params.items()},
        command=_get(d, "command", (str,), where, ""),
        node=_get(d, "node", (str,), where, None),
        gpus=None if gpus is None else _ints(gpus, f"{where}.gpus"),
        sid=_get(d, "sid", (int,), where, None),
        started=_num(d, "started", where),
        ended=_num(d, "ended", where),
        exit_code=_get(d, "exit_code", (int,), where, None),
        dispatched=_num(d, "dispatched", where),
        metric=_num(d, "metric", where),
        error=_get(d, "error", (str,), where, None),
        requeued=_get(d, "requeued", (int,), where, 0),
        log=_get(d, "log", (str,), where, None),
        attempts=tuple(
            _attempt(a, f"{where}.attempts[{i}]") for i, a in enumerate(_get(d, "attempts", (list,), where, []))
        ),
        timed_out=_get(d, "timed_out", (bool,), where, False),
    )


def _node(doc: Any, where: str) -> NodeState:
    d = _object(doc, where)
    return NodeState(
        host=_get(d, "host", (str,), where),
        slots=_get(d, "slots", (int,), where, 1),
        alive=_get(d, "alive", (bool,), where, True),
        why=_get(d, "why", (str,), where, None),
        failing_since=_num(d, "failing_since", where),
        failures=_get(d, "failures", (int,), where, 0),
    )


def _meta(doc: Any) -> SweepMeta:
    d = _object(doc, "meta")
    return SweepMeta(
        template=_strs(_get(d, "template", (list,), "meta", []), "meta.template"),
        params=_strs(_get(d, "params", (list,), "meta", []), "meta.params"),
        metric=_get(d, "metric", (str,), "meta", "metric"),
        metric_regex=_get(d, "metric_regex", (str,), "meta", None),
        metric_key=_get(d, "metric_key", (str,), "meta", "metric"),
        goal=_choice(d, "goal", ("max", "min"), "meta", "max"),
        log_scale=_strs(_get(d, "log_scale", (list,), "meta", []), "meta.log_scale"),
        gpus_per_trial=_get(d, "gpus_per_trial", (int,), "meta", 1),
    )


def parse_state(doc: Any) -> SweepState:
    """state.json (already JSON-decoded) as a SweepState; RemoteCommandError naming the first bad field."""
    d = _object(doc, "state")
    trials = _get(d, "trials", (list,), "state")
    return SweepState(
        id=_get(d, "id", (str,), "state"),
        status=_choice(d, "status", get_args(SweepStatus), "state"),
        trials=tuple(parse_trial(t, f"trials[{i}]") for i, t in enumerate(trials)),
        nodes=tuple(_node(n, f"nodes[{i}]") for i, n in enumerate(_get(d, "nodes", (list,), "state", []))),
        meta=_meta(_get(d, "meta", (dict,), "state", {})),
        pid=_get(d, "pid", (int,), "state", None),
        started=_num(d, "started", "state"),
        ended=_num(d, "ended", "state"),
        updated=_num(d, "updated", "state"),
        error=_get(d, "error", (str,), "state", None),
        dir=_get(d, "dir", (str,), "state", None),
    )
