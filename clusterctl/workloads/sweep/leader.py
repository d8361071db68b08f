"""`clusterctl sweep` on the leader: many independent experiments at once, one per GPU, across the cluster.

    the plan (sweep/plan.py, pure: trials, commands, SweepSpec)  ->  here: config.json + the scheduler staged
    on the leader, the user's files on every node, the node package's `sweep` program detached in tmux there
    (state in ~/clusterctl-sweeps/ID/state.json)  ->  here: that state read over ssh into a typed SweepState
    (sweep/state.py) for the live table, `sweep status` and `sweep attach`; cancel; the trials' logs copied back  ->
    sweep/results.py: results.json and metric_vs_params.png in sweep-results/<time>/.

The scheduler (node/sweep/) needs only the node package on the leader (the standard library, any python3):
it ssh-es from the leader to each node with the cluster's internal key and pinned known_hosts
(StrictHostKeyChecking=yes, BatchMode), as horovodrun does. See its docstring for the files on the nodes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Protocol, Sequence

from clusterctl.errors import ConfigError, RemoteCommandError, UnreachableError, UsageError
from clusterctl.node import ssh as node_ssh
from clusterctl.remote import jobfolder, nodepkg, tmux as jobs
from clusterctl.workloads.sweep.plan import SweepSpec, is_id, new_id, validate_id
from clusterctl.workloads.sweep.results import events, rows, summary
from clusterctl.workloads.sweep.state import ENDED, SweepState, parse_state

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.hostsfile import HostsFile
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.types import Cluster

SWEEPS = "clusterctl-sweeps"  # under the login home of every node
PROGRAM = "sweep"  # the scheduler's program in the node package
MARK = "\x1e"


class SweepView(Protocol):
    """What a watch draws on: the trials' rows, the summary line, the changes since the last state."""

    def update(self, rows: Sequence[dict[str, Any]], summary: str, lines: Sequence[str]) -> None: ...


OpenView = Callable[[list[str], str], ContextManager[SweepView]]  # (parameters, metric name) -> the view
# The scheduler's ssh from the leader to each node (it goes into config.json): the node package's one copy.
# ConnectTimeout and ServerAlive* set how soon a round notices a dead node.
SSH = tuple(node_ssh.argv(5, alive=(5, 2), quiet=True))


def config(
    spec: SweepSpec, sweep_id: str, sweep_dir: str, hosts: HostsFile, user: str, python: str, workdir: str | None = None
) -> dict[str, object]:
    """config.json for the scheduler: everything it needs, nothing it must work out (`workdir`: the spec's
    with ~ expanded on the leader)."""
    from clusterctl.remote.session import TREE_FN

    biggest = max(e.slots for e in hosts.entries)
    if spec.gpus_per_trial > biggest:
        raise UsageError(f"--gpus-per-trial {spec.gpus_per_trial} is more than any node has ({biggest} slot(s))")
    return {
        "id": sweep_id,
        "nodes": [{"host": e.host, "slots": e.slots} for e in hosts.entries],
        "gpus_per_trial": spec.gpus_per_trial,
        "trials": [{"id": t.id, "params": t.params, "command": t.command} for t in spec.trials(python)],
        "metric": {"regex": spec.metric_regex, "key": spec.metric_key},
        "env": {"PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "2"},
        "path_prefix": os.path.dirname(python),
        "workdir": workdir or spec.workdir,
        "trial_timeout": spec.trial_timeout,
        "node_timeout": spec.node_timeout,
        "poll": spec.poll,
        "max_requeue": 1,
        "ssh": list(SSH),
        "user": user,
        "tree_fn": TREE_FN,
        # for whoever reads the state later (--status, --attach, results.json): how to show it
        "meta": {
            "template": list(spec.template),
            "params": list(spec.params),
            "metric": spec.metric_name,
            "metric_regex": spec.metric_regex,
            "metric_key": spec.metric_key,
            "goal": spec.goal,
            "log_scale": list(spec.log_scale),
            "gpus_per_trial": spec.gpus_per_trial,
        },
    }


# ---- on the leader -------------------------------------------------------------------------------------------
def leader_home(pool: SshPool, leader: SshTarget) -> str:
    result = pool.run_one(leader, 'printf %s "$HOME"', timeout=30)
    if not result.ok or not result.stdout.startswith("/"):
        raise UnreachableError(f"cannot reach the leader {leader.label}: {result.error or result.stderr.strip()}")
    return result.stdout.strip()


def sweep_dir(home: str, sweep_id: str) -> str:
    return f"{home}/{SWEEPS}/{validate_id(sweep_id)}"


def running_sweeps(pool: SshPool, leader: SshTarget) -> list[str]:
    """Sweeps whose scheduler still runs on the leader and has not ended (one that just wrote its final
    state may still be closing its connections)."""
    cmd = (
        "for s in $(tmux ls -F '#{session_name}' 2>/dev/null | grep '^sweep-'); do "
        f'printf "%s %s\\n" "$s" "$(grep -o \'"status": "[a-z]*"\' "$HOME/{SWEEPS}/$s/state.json" 2>/dev/null | head -n 1)"; '
        "done; true"
    )
    r = pool.run_one(leader, cmd, timeout=30)
    if not r.ok:
        raise UnreachableError(f"cannot reach the leader {leader.label}: {r.error or r.stderr.strip()}")
    busy = []
    for line in r.stdout.splitlines():
        name, _, status = line.partition(" ")
        if is_id(name) and not any(f'"{s}"' in status for s in ENDED):
            busy.append(name)
    return busy


def start(pool: SshPool, inv: Inventory, spec: SweepSpec, python: str, sweep_id: str | None = None) -> tuple[str, str]:
    """Stage and start the scheduler on the leader. Returns (sweep id, its folder on the nodes)."""
    leader = inv.targets[0]
    busy = running_sweeps(pool, leader)
    if busy:
        raise ConfigError(
            f"sweep {busy[0]} is still running on this cluster (its trials hold the GPUs)",
            f"wait for it (clusterctl sweep attach --id {busy[0]}) or cancel it (clusterctl sweep cancel --id {busy[0]})",
        )
    sweep_id = sweep_id or new_id()
    home = leader_home(pool, leader)
    d = sweep_dir(home, sweep_id)
    workdir = spec.workdir
    if workdir and (workdir == "~" or workdir.startswith("~/")):
        workdir = home + workdir[1:]
    spec_cfg = config(spec, sweep_id, d, inv.hosts, leader.user, python, workdir)
    if spec.files:
        report = pool.put(list(inv.targets), {f"{d}/{name}": (data, 0o644) for name, data in spec.files})
        if not report.all_ok:
            raise UnreachableError(
                "could not copy the files to every node: " + "; ".join(f"{r.host}: {r.error}" for r in report.failed)
            )
    pkg = nodepkg.package()
    put = pool.put([leader], {f"{d}/config.json": (json.dumps(spec_cfg, indent=1).encode(), 0o644)})
    staged = put.failed[0] if not put.all_ok else nodepkg.ship_one(pool, leader, pkg)
    if not staged.ok:
        raise UnreachableError(f"could not stage the sweep on the leader: {staged.error or staged.stderr.strip()}")
    cmd = jobs.detach_command(
        sweep_id, f"exec {shlex.quote(python)} {shlex.quote(pkg.at(home))} {PROGRAM} {shlex.quote(d)}", kind="sweep"
    )
    r = pool.run_one(leader, cmd, timeout=60)
    if not r.ok:
        raise RemoteCommandError(f"the scheduler did not start on the leader: {(r.error or r.stderr).strip()}")
    return sweep_id, d


def latest(pool: SshPool, leader: SshTarget) -> str:
    r = pool.run_one(leader, f'ls -1 "$HOME/{SWEEPS}" 2>/dev/null | grep "^sweep-" | sort | tail -n 1', timeout=30)
    if not r.ok:
        raise UnreachableError(f"cannot reach the leader {leader.label}: {r.error or r.stderr.strip()}")
    found = r.stdout.strip()
    if not found:
        raise ConfigError("no sweep on this cluster yet", "start one: clusterctl sweep run --grid lr=0.1,0.01 -- CMD")
    return validate_id(found)


@dataclass(frozen=True)
class Snapshot:
    state: SweepState | None  # None until the scheduler wrote its first state
    alive: bool  # its tmux session still exists
    log_tail: str = ""
    raw: dict[str, Any] | None = None  # state.json as the scheduler wrote it, for --status --json only

    @property
    def status(self) -> str:
        return self.state.status if self.state is not None else "not started"


def read_state(pool: SshPool, leader: SshTarget, sweep_id: str) -> Snapshot:
    n = validate_id(sweep_id)
    cmd = (
        f'd="$HOME/{SWEEPS}/{n}"; [ -d "$d" ] || {{ echo "no sweep {n} on this cluster" >&2; exit 3; }}; '
        f'cat "$d/state.json" 2>/dev/null; printf "\\n{MARK}"; '
        f"{jobs.has_session(n)} && echo alive || "
        f'{{ echo gone; tail -n 15 "{jobs.JOBS_DIR}/{n}.log" 2>/dev/null; }}; true'
    )
    r = pool.run_one(leader, cmd, timeout=30)
    if r.exit_code == 3:
        raise ConfigError(f"no sweep {n} on this cluster", "see `clusterctl sweep status` for the latest one")
    if not r.ok:
        raise UnreachableError(
            f"cannot read the sweep's state on the leader {leader.label}: {r.error or r.stderr.strip()}"
        )
    text, _, tail = r.stdout.partition(MARK)
    alive_line, _, log_tail = tail.partition("\n")
    try:
        raw = json.loads(text) if text.strip() else None
    except ValueError:  # written atomically, so only an empty or foreign file: as if not written yet
        raw = None
    state = None if raw is None else parse_state(raw)
    return Snapshot(state, alive_line.strip() == "alive", log_tail, raw)


RECONNECT_S = 300.0  # how long a watch re-dials a leader it lost (a reboot, a network blip) before it gives up


def follow(
    pool: SshPool,
    leader: SshTarget,
    sweep_id: str,
    on_state: Callable[[SweepState], None],
    poll: float = 1.0,
    start_timeout: float = 60.0,
    reconnect: float = RECONNECT_S,
) -> SweepState:
    """Read the state every `poll` seconds until the sweep ends; the final state. A leader that stops
    answering is re-dialled with backoff for `reconnect` seconds (the sweep goes on without us)."""
    from clusterctl import retry

    began = time.monotonic()
    lost: float | None = None
    delays = retry.backoff(poll, 15.0)
    while True:
        try:
            snap = read_state(pool, leader, sweep_id)
            lost, delays = None, retry.backoff(poll, 15.0)
        except UnreachableError as exc:
            lost = time.monotonic() if lost is None else lost
            if time.monotonic() - lost >= reconnect:
                raise UnreachableError(f"{exc} (re-dialled for {reconnect:.0f}s)") from None
            time.sleep(next(delays))
            continue
        if snap.state is not None:
            on_state(snap.state)
            if snap.state.ended_for_good:
                return snap.state
        if not snap.alive:
            raise RemoteCommandError(
                f"the scheduler of {sweep_id} stopped on the leader while the sweep was {snap.status}"
                + (f": {snap.log_tail.strip().splitlines()[-1]}" if snap.log_tail.strip() else ""),
                f"see ~/.clusterctl/jobs/{sweep_id}.log on the leader; end its trials with `clusterctl sweep cancel`",
            )
        if snap.state is None and time.monotonic() - began > start_timeout:
            raise RemoteCommandError(
                f"the scheduler of {sweep_id} wrote no state in {start_timeout:.0f}s",
                f"see ~/.clusterctl/jobs/{sweep_id}.log on the leader",
            )
        time.sleep(poll)


def cancel(pool: SshPool, leader: SshTarget, sweep_id: str, python: str, timeout: float = 60.0) -> SweepState:
    """Ask the scheduler to end every trial and wait until it did; with the scheduler gone, run its
    cancel on the leader directly. The final state."""
    n = validate_id(sweep_id)
    snap = read_state(pool, leader, n)
    if snap.state is not None and snap.state.ended_for_good:
        return snap.state
    d = f'"$HOME/{SWEEPS}/{n}"'
    if snap.alive:
        r = pool.run_one(leader, f"touch {d}/cancel", timeout=30)
        if not r.ok:
            raise UnreachableError(f"cannot reach the leader {leader.label}: {r.error or r.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = read_state(pool, leader, n)
            if snap.state is not None and snap.state.ended_for_good:
                return snap.state
            if not snap.alive:
                break
            time.sleep(0.5)
        else:
            raise RemoteCommandError(
                f"the scheduler of {n} did not finish cancelling in {timeout:.0f}s",
                f"see ~/.clusterctl/jobs/{n}.log on the leader",
            )
    pkg = nodepkg.package()  # this installation's scheduler ends the trials (the state file is its format)
    shipped = nodepkg.ship_one(pool, leader, pkg)
    if not shipped.ok:
        raise UnreachableError(f"cannot reach the leader {leader.label}: {shipped.error or shipped.stderr.strip()}")
    r = pool.run_one(leader, f"{shlex.quote(python)} {pkg.shell_path} {PROGRAM} {d} --cancel", timeout=120)
    if not r.ok:
        raise RemoteCommandError(f"cancelling {n} on the leader failed: {(r.error or r.stderr).strip()}")
    snap = read_state(pool, leader, n)
    if snap.state is None:  # the scheduler's --cancel writes one even for a sweep that never started
        raise RemoteCommandError(f"cancelling {n} left no state on the leader", f"see {d}/ on the leader")
    return snap.state


def collect_logs(pool: SshPool, inv: Inventory, state: SweepState, out_dir: Path, limit: int = 1048576) -> list[str]:
    """Copy each trial's log (of its last attempt, from its node) into out_dir/logs/. Returns the hosts
    that could not be read."""
    by_host: dict[str, list[str]] = {}
    for t in state.trials:
        if t.log and t.node:
            by_host.setdefault(t.node, []).append(t.log)
    alive = {n.host for n in state.nodes if n.alive}
    targets = {e.host: t for e, t in zip(inv.hosts.entries, inv.targets)}
    wanted = [targets[h] for h in by_host if h in alive and h in targets]
    logs = out_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not wanted:
        return sorted(set(by_host) - alive)
    host_of = {t.label: h for h, t in targets.items()}

    def command(target: SshTarget) -> str:
        paths = by_host[host_of[target.label]]
        return "; ".join(
            f"printf '{MARK}%s\\n' {shlex.quote(os.path.basename(p))}; tail -c {int(limit)} {shlex.quote(p)} 2>/dev/null"
            for p in paths
        )

    report = pool.run(wanted, command, timeout=120)
    missing = sorted(set(by_host) - alive)
    for r in report:
        if not r.ok:
            missing.append(host_of.get(r.host, r.host))
            continue
        for chunk in r.stdout.split(MARK)[1:]:
            name, _, text = chunk.partition("\n")
            if re.match(r"^trial-[0-9]{4,}\.log$", name):
                (logs / name).write_text(text)
    return missing


def python_for(cluster: Cluster | None, python: str | None) -> str:
    return python or jobfolder.node_python(cluster)


def watch(pool: SshPool, leader: SshTarget, sweep_id: str, open_view: OpenView, poll: float = 1.0) -> SweepState:
    """Follow a sweep to its end (follow()) and return its last state, shown in a view opened at the first
    state, when the parameters are known: open_view(params, metric name) is a context manager with
    update(rows, summary line, events); it is closed however the watch ends (Ctrl-C too)."""
    with contextlib.ExitStack() as stack:
        view: SweepView | None = None
        prev: SweepState | None = None

        def on_state(state: SweepState) -> None:
            nonlocal view, prev
            if view is None:
                view = stack.enter_context(open_view(list(state.params), state.meta.metric))
            view.update(
                rows(state, state.params, state.meta.goal, sort=False),
                summary(state),
                events(prev, state, state.meta.metric),
            )
            prev = state

        return follow(pool, leader, sweep_id, on_state, poll=poll)
