"""`clusterctl sweep run | status | attach | cancel` as library calls over an inventory: each opens the ssh
pool, finds the sweep (the latest when no id is given), does its one thing and returns a typed value the
caller shows (the CLI renders, a test asserts). `hosts` resolves the inventory, called once the arguments
are checked (a bad --id fails before any cluster is looked up). The plan is sweep/plan.py, the leader's side
sweep.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from clusterctl.errors import ClusterctlError, RemoteCommandError, within
from clusterctl.workloads.sweep import leader as sweeplib, results as resultlib
from clusterctl.workloads.sweep.plan import SweepSpec, validate_id
from clusterctl.workloads.sweep.state import SweepState

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.remote.ssh import SshPool

Hosts = Callable[[], Any]  # the inventory (cluster/inventory.py's), resolved when called
_SCHEDULER_HOPS = "the sweep scheduler (ssh from the leader to each node)"


@dataclass(frozen=True)
class Started:
    id: str
    folder: str  # on every node: the trials' logs
    trials: int
    nodes: int
    slots: int  # trials at once
    leader: str

    def line(self) -> str:
        return (
            f"sweep {self.id}: {self.trials} trial(s) on {self.nodes} node(s), up to {self.slots} at once; "
            f"scheduler detached on the leader {self.leader} (tmux {self.id}), trials' logs in {self.folder}"
        )


@dataclass(frozen=True)
class Finished:
    """A sweep followed to its end, its results written here."""

    id: str
    state: SweepState
    folder: Path  # sweep-results/<time>/
    missing: tuple[str, ...]  # hosts whose trials' logs could not be read
    plotted: bool

    def error(self) -> ClusterctlError | None:
        """Why the exit status is not 0: the sweep was cancelled, or a trial ended without a metric."""
        if self.state.status == "cancelled":
            return RemoteCommandError(f"sweep {self.id} was cancelled", f"results so far are in {self.folder}")
        bad = [t for t in self.state.trials if not t.done_with_metric]
        if bad:
            return RemoteCommandError(
                f"{len(bad)} of {len(self.state.trials)} trial(s) did not finish with a metric "
                f"({', '.join(str(t.id) for t in bad[:10])})",
                f"see their logs in {self.folder}/logs",
            )
        return None


@dataclass(frozen=True)
class Status:
    id: str
    snapshot: sweeplib.Snapshot

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "scheduler": "running" if self.snapshot.alive else "stopped", "state": self.snapshot.raw}


def _pool(inv: Inventory) -> SshPool:
    from clusterctl.remote.ssh import SshPool

    inv.hosts.check_launchable(_SCHEDULER_HOPS)
    return SshPool(inv.settings)


def _which(pool: SshPool, inv: Inventory, sweep_id: str | None) -> str:
    return sweep_id or sweeplib.latest(pool, inv.targets[0])  # an id given was checked before connecting


def run(
    hosts: Hosts,
    spec: SweepSpec,
    *,
    python: str | None,
    detach: bool,
    out: Path,
    open_view: sweeplib.OpenView,
    report: Callable[[str], None],
    warn: Callable[[str], None],
) -> Finished | None:
    """Start the sweep's scheduler on the leader (report says so); unless `detach`, follow it to its end and
    write its results under `out` (None when detached)."""
    inv = hosts()
    py = sweeplib.python_for(inv.cluster, python)
    for name in spec.unused():
        warn(f"parameter {name} is not used in the command (no {{{name}}} in it)")
    with _pool(inv) as pool:
        sid, folder = sweeplib.start(pool, inv, spec, py)
        slots = sum(e.slots for e in inv.hosts.entries) // spec.gpus_per_trial
        report(Started(sid, folder, len(spec.combos), len(inv.hosts.entries), slots, inv.targets[0].label).line())
        if detach:
            report(f"follow it with: clusterctl sweep attach --id {sid}  (or sweep status, sweep cancel)")
            return None
        return _follow(pool, inv, sid, out, spec.poll, open_view, report)


def attach(
    hosts: Hosts,
    sweep_id: str | None,
    *,
    out: Path,
    poll: float,
    open_view: sweeplib.OpenView,
    report: Callable[[str], None],
) -> Finished:
    """Follow a running sweep (the latest by default) to its end and write its results under `out`."""
    within("--poll", poll, 0.1, 60, unit="seconds")
    _check_id(sweep_id)
    inv = hosts()
    with _pool(inv) as pool:
        return _follow(pool, inv, _which(pool, inv, sweep_id), out, poll, open_view, report)


def status(hosts: Hosts, sweep_id: str | None) -> Status:
    """The sweep's state now (the latest by default), read from the leader."""
    _check_id(sweep_id)
    inv = hosts()
    with _pool(inv) as pool:
        sid = _which(pool, inv, sweep_id)
        return Status(sid, sweeplib.read_state(pool, inv.targets[0], sid))


def cancel(hosts: Hosts, sweep_id: str | None, *, python: str | None) -> SweepState:
    """End every trial of the sweep (the latest by default) on every node, and its scheduler; the last state."""
    _check_id(sweep_id)
    inv = hosts()
    with _pool(inv) as pool:
        sid = _which(pool, inv, sweep_id)
        return sweeplib.cancel(pool, inv.targets[0], sid, sweeplib.python_for(inv.cluster, python))


def _check_id(sweep_id: str | None) -> None:
    if sweep_id is not None:
        validate_id(sweep_id)


def _follow(
    pool: SshPool,
    inv: Inventory,
    sid: str,
    out: Path,
    poll: float,
    open_view: sweeplib.OpenView,
    report: Callable[[str], None],
) -> Finished:
    try:
        state = sweeplib.watch(pool, inv.targets[0], sid, open_view, poll=poll)
    except KeyboardInterrupt:
        report(
            f"stopped watching; sweep {sid} goes on on the leader: clusterctl sweep status | attach | cancel  (--id {sid})"
        )
        raise
    folder = resultlib.results_dir(out)
    missing = sweeplib.collect_logs(pool, inv, state, folder)
    resultlib.write_results(folder, state, inv.cluster.name if inv.cluster else None)
    plotted = resultlib.plot(state, folder / "metric_vs_params.png")
    return Finished(sid, state, folder, tuple(missing), plotted)
