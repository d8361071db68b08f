"""`clusterctl sweep run | status | attach | cancel`: the sweep's table, its live view and its results."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, List, Mapping, Optional, Sequence

import typer

from clusterctl.cli.display import _esc, console, fitted_table, info
from clusterctl.cli.shared import (
    CURRENT_CLUSTER,
    DEFAULT_SSH,
    LOGIN,
    Ssh,
    _resolve_hosts,
    ssh_options,
)
from clusterctl.errors import UsageError

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import JustifyMethod
    from rich.live import Live
    from rich.table import Table
    from typer._click import Context

    from clusterctl.workloads.sweep.control import Finished
    from clusterctl.workloads.sweep.state import SweepState

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- parameter sweeps ------------------------------------------------------------------------------------
class _SweepGroup(typer.core.TyperGroup):
    """`clusterctl sweep --grid ... -- CMD` (options first, no subcommand) is `sweep run`, as before the
    subcommands; the old mode flags (--status, --attach, --cancel) are refused naming their subcommand."""

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        if not args or not args[0].startswith("-") or args[0] in ctx.help_option_names:
            return super().parse_args(ctx, args)  # a subcommand (or --help) first: as any group
        head = args[: args.index("--")] if "--" in args else args
        old = [a for a in head if a in ("--status", "--attach", "--cancel")]
        if old:  # parsing comes before the command's own error handling (app.command): the same line here
            from clusterctl.cli import display

            name = old[0][2:]
            refused = UsageError(
                f"`sweep --{name}` is now `clusterctl sweep {name}`", f"see `clusterctl sweep {name} --help`"
            )
            display.error(refused.one_line())
            raise typer.Exit(int(refused.exit_code))
        return super().parse_args(ctx, ["run", *args])


sweep_app = typer.Typer(
    cls=_SweepGroup,
    no_args_is_help=True,
    short_help="Parallel experiments: one trial per GPU, run detached.",
    help="Parallel experiments: one trial per GPU, run detached.\n\nA grid or random search across every node: "
    "`sweep run` starts one (and follows it unless --detach); `sweep status`, `sweep attach` and "
    "`sweep cancel` reach it from any terminal.",
)

app.add_typer(sweep_app, name="sweep")
# The options the sweep's subcommands share, each declared once.
SWEEP_ID = typer.Option(None, "--id", help="The sweep (default: the latest on the cluster).")
SWEEP_HOSTS = typer.Option(None, "--hosts", help="A hosts file instead of a cluster.")
SWEEP_PYTHON = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's).")
SWEEP_OUT = typer.Option(Path("sweep-results"), "--out", help="Folder for <time>/results.json, logs and the plot.")
SWEEP_POLL = typer.Option(1.0, "--poll", help="Seconds between the scheduler's rounds (and this watch's).")


@sweep_app.command("run", context_settings={"allow_interspersed_args": False})
@ssh_options(*LOGIN)
def sweep_run(
    cmd: Optional[List[str]] = typer.Argument(
        None,
        metavar="-- CMD ...",
        help="The trial's command: {NAME} takes each parameter's value, "
        "{python} the nodes' Python, {trial} the trial number.",
    ),
    grid: List[str] = typer.Option(
        [], "--grid", metavar="NAME=V1,V2", help="Values of one parameter (repeatable): every combination is a trial."
    ),
    range_: List[str] = typer.Option(
        [], "--range", metavar="NAME=LOW:HIGH[:log|int]", help="A range to sample with --random (repeatable)."
    ),
    random_k: Optional[int] = typer.Option(
        None, "--random", metavar="K", help="K random trials from --range (and --grid values) instead of the grid."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of --random."),
    gpus_per_trial: int = typer.Option(1, "--gpus-per-trial", help="GPUs (slots of one node) each trial gets."),
    metric: Optional[str] = typer.Option(
        None,
        "--metric",
        metavar="REGEX",
        help="The last output line matching REGEX gives the metric (its group 1, else the "
        'number in or after the match). Default: the last JSON line\'s "metric".',
    ),
    metric_key: str = typer.Option("metric", "--metric-key", help="The key of the metric in a JSON output line."),
    goal: str = typer.Option("max", "--goal", help="max or min: which metric is best."),
    files: List[str] = typer.Option(
        [],
        "--file",
        metavar="PATH",
        help="Copy to every node's sweep folder, where trials run (repeatable); a shipped "
        "template's name (train_imagenet.py) works too.",
    ),
    workdir: Optional[str] = typer.Option(None, "--workdir", help="Run trials in this folder on the nodes instead."),
    trial_timeout: Optional[float] = typer.Option(
        None, "--trial-timeout", help="Seconds a trial may run before it is killed."
    ),
    node_timeout: float = typer.Option(
        30.0, "--node-timeout", help="Seconds of failed ssh before a node is dead and its trials re-queued."
    ),
    detach: bool = typer.Option(
        False, "--detach", help="Start the sweep and return (then sweep status, attach, cancel)."
    ),
    out: Path = SWEEP_OUT,
    cluster: Optional[str] = CURRENT_CLUSTER,
    hostsfile: Optional[str] = SWEEP_HOSTS,
    python: Optional[str] = SWEEP_PYTHON,
    poll: float = SWEEP_POLL,
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Start a sweep, one trial per GPU, and follow it to its end.

    Its scheduler runs detached on the leader: --detach returns at once, and Ctrl-C stops only the watching."""
    from clusterctl.cli import display
    from clusterctl.workloads.sweep import control, plan as planlib

    spec = planlib.SweepSpec(  # every option checked here, before anything connects
        template=tuple(cmd or ()),
        grid=tuple(grid),
        ranges=tuple(range_),
        random_k=random_k,
        seed=seed,
        gpus_per_trial=gpus_per_trial,
        metric_regex=metric,
        metric_key=metric_key,
        goal=goal,
        file_paths=tuple(files),
        workdir=workdir,
        trial_timeout=trial_timeout,
        node_timeout=node_timeout,
        poll=poll,
    )
    done = control.run(
        lambda: _resolve_hosts(hostsfile, cluster, ssh),
        spec,
        python=python,
        detach=detach,
        out=out,
        open_view=SweepProgress,
        report=display.info,
        warn=display.warn,
    )
    if done is not None:
        _sweep_results(done)


@sweep_app.command("status")
@ssh_options(*LOGIN)
def sweep_status(
    sweep_id: Optional[str] = SWEEP_ID,
    json_: bool = typer.Option(False, "--json", help="The scheduler's whole state as JSON."),
    cluster: Optional[str] = CURRENT_CLUSTER,
    hostsfile: Optional[str] = SWEEP_HOSTS,
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Show a sweep's trials now (from another terminal too)."""
    import json as jsonlib

    from clusterctl.cli import display
    from clusterctl.workloads.sweep import control, results as resultlib

    found = control.status(lambda: _resolve_hosts(hostsfile, cluster, ssh), sweep_id)
    snap, sid = found.snapshot, found.id
    if json_:
        sys.stdout.write(jsonlib.dumps(found.as_json()) + "\n")
        return
    if snap.state is None:
        gone = f" and is not running; see ~/.clusterctl/jobs/{sid}.log on the leader"
        display.info(f"sweep {sid}: the scheduler has not written its state yet" + ("" if snap.alive else gone))
        return
    _sweep_show(snap.state, sort=snap.state.ended_for_good)
    stopped = not snap.alive and not snap.state.ended_for_good
    if stopped and snap.log_tail.strip():
        display.warn("the scheduler's last words: " + " / ".join(snap.log_tail.strip().splitlines()[-3:]))
    ending = "; the scheduler is not running (`clusterctl sweep cancel` ends its trials)" if stopped else ""
    display.info(resultlib.summary(snap.state) + ending)


@sweep_app.command("attach")
@ssh_options(*LOGIN)
def sweep_attach(
    sweep_id: Optional[str] = SWEEP_ID,
    out: Path = SWEEP_OUT,
    cluster: Optional[str] = CURRENT_CLUSTER,
    hostsfile: Optional[str] = SWEEP_HOSTS,
    poll: float = SWEEP_POLL,
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Watch a sweep until it ends, then write its results here."""
    from clusterctl.cli import display
    from clusterctl.workloads.sweep import control

    done = control.attach(
        lambda: _resolve_hosts(hostsfile, cluster, ssh),
        sweep_id,
        out=out,
        poll=poll,
        open_view=SweepProgress,
        report=display.info,
    )
    _sweep_results(done)


@sweep_app.command("cancel")
@ssh_options(*LOGIN)
def sweep_cancel(
    sweep_id: Optional[str] = SWEEP_ID,
    cluster: Optional[str] = CURRENT_CLUSTER,
    hostsfile: Optional[str] = SWEEP_HOSTS,
    python: Optional[str] = SWEEP_PYTHON,
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """End every trial of a sweep on every node, and its scheduler."""
    from clusterctl.cli import display
    from clusterctl.workloads.sweep import control, results as resultlib

    state = control.cancel(lambda: _resolve_hosts(hostsfile, cluster, ssh), sweep_id, python=python)
    _sweep_show(state, sort=False)
    display.info(resultlib.summary(state))


def _sweep_show(state: SweepState, sort: bool, title: Optional[str] = None) -> None:
    from clusterctl.workloads.sweep import results as resultlib

    sweep_table(resultlib.rows(state, state.params, state.meta.goal, sort), state.params, state.meta.metric, title)


def _sweep_results(done: Finished) -> None:
    """A finished sweep: the sorted table, the best trial, where its results are; its exit status."""
    from clusterctl.cli import display
    from clusterctl.workloads.sweep import results as resultlib

    state, metric, goal = done.state, done.state.meta.metric, done.state.meta.goal
    _sweep_show(state, sort=True, title=f"sweep {done.id}: {metric} ({goal}), best first")
    top = resultlib.best(state, goal)
    display.info(resultlib.summary(state))
    if state.error:
        display.warn(state.error)
    if top is not None:
        display.info(f"best: trial {top.id} ({top.params_text()}) {metric} {top.metric:.6g}")
    if done.missing:
        display.warn(f"no logs from {', '.join(done.missing)} (node dead or unreachable)")
    display.info(f"results: {done.folder}/results.json, logs/" + (", metric_vs_params.png" if done.plotted else ""))
    error = done.error()
    if error is not None:
        raise error


# ---- the trials' table, and the live view of a running sweep -----------------------------------------------
_SWEEP_STYLE = {
    "done": "green",
    "running": "cyan",
    "starting": "cyan",
    "queued": "dim",
    "failed": "red",
    "lost": "red",
    "cancelled": "yellow",
}


def sweep_tables(
    rows: Sequence[Mapping[str, Any]], params: Sequence[str], metric_name: str, title: str | None = None
) -> list[Table]:
    """The sweep's trials, fitted to the terminal (display.fitted_table), in the caller's order."""
    columns: list[tuple[str, JustifyMethod]] = [
        ("TRIAL", "right"),
        *((p.upper(), "right") for p in params),
        ("NODE/GPU", "left"),
        ("STATE", "left"),
        ("ELAPSED", "right"),
        (metric_name.upper(), "right"),
        ("", "left"),
    ]
    cells = []
    for r in rows:
        style = _SWEEP_STYLE.get(r["state"], "")
        mark = "[bold green]best[/]" if r["best"] else ""
        note = f"[dim]{_esc(r['note'])}[/]" if r["note"] else ""
        cells.append(
            [
                r["trial"],
                *(_esc(v) for v in r["params"]),
                _esc(r["node"]),
                f"[{style}]{_esc(r['state'])}[/]" if style else _esc(r["state"]),
                r["elapsed"],
                _esc(r["metric"]),
                " ".join(x for x in (mark, note) if x),
            ]
        )
    return fitted_table(columns, cells, title=title, prose=("",), show=False)


def sweep_table(
    rows: Sequence[Mapping[str, Any]], params: Sequence[str], metric_name: str, title: str | None = None
) -> None:
    """The sweep's trials as a table on stdout (the caller orders the rows)."""
    for t in sweep_tables(rows, params, metric_name, title):
        console().print(t)


class SweepProgress:
    """The live view of a running sweep: a table redrawn in place on a terminal; elsewhere, one line per
    change (trial started / finished / re-queued, node dead) on stderr."""

    def __init__(self, params: Sequence[str], metric_name: str):
        self.params, self.metric_name = list(params), metric_name
        self.live: Live | None = None
        self.tty = sys.stderr.isatty()

    def __enter__(self) -> "SweepProgress":
        if self.tty:
            from rich.live import Live

            self.live = Live(console=console(stderr=True), refresh_per_second=4, transient=True)
            self.live.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.live is not None:
            self.live.stop()

    def update(self, rows: Sequence[Mapping[str, Any]], summary: str, lines: Sequence[str]) -> None:
        if self.live is not None:
            from rich.console import Group
            from rich.text import Text

            self.live.update(Group(*sweep_tables(rows, self.params, self.metric_name), Text(summary)))
        else:
            for line in lines:
                info(line)
