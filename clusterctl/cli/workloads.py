"""Commands that check and explore the cluster: bench doctor play sweep (training is cli/train.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import typer

from clusterctl.cli.shared import (
    CLUSTER,
    CURRENT_CLUSTER,
    DEFAULT_SSH,
    HOSTS,
    LOGIN,
    Ssh,
    _provider,
    _resolve_hosts,
    _store,
    ssh_options,
    within,
)
from clusterctl.errors import ExitCode, UsageError
from clusterctl.node.nccl_report import ALLOW_FLAG as ALLOW_SOCKET

if TYPE_CHECKING:
    from typer._click import Context  # the click typer carries, which its group's methods take

    from clusterctl.cluster.inventory import Inventory
    from clusterctl.state import StateStore
    from clusterctl.types import Cluster
    from clusterctl.workloads.bench.verdict import Ladder
    from clusterctl.workloads.sweep.control import Finished
    from clusterctl.workloads.sweep.state import SweepState

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- the synthetic benchmark -----------------------------------------------------------------------------
@app.command()
@ssh_options(*LOGIN)
def bench(
    hostsfile: Optional[str] = HOSTS,
    synthetic: bool = typer.Option(
        False, "--synthetic", help="Synthetic images (the only kind; real data is `train`)."
    ),
    cluster: Optional[str] = CLUSTER,
    model: str = typer.Option("resnet50", "--model", help="resnet50, or tiny for CPU smoke runs."),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Images per process per step (default: the GPU type's, as `train`)."
    ),
    steps: int = typer.Option(10, "--steps", help="Steps per timed batch."),
    iters: int = typer.Option(
        10, "--iters", help="Timed batches per rung at least; exactly this many with --max-seconds 0."
    ),
    max_seconds: float = typer.Option(
        300.0,
        "--max-seconds",
        help="Each rung times batches until its verdict is decided, at most this many seconds (0: --iters).",
    ),
    warmup: int = typer.Option(10, "--warmup-steps", help="Untimed steps first (at least 10)."),
    input_only: bool = typer.Option(False, "--input-only", help="Time the input pipeline alone (no model)."),
    ladder: Optional[str] = typer.Option(
        None, "--ladder", help="Process counts, e.g. 1,8,16,32 (default: 1, one node, all)."
    ),
    threshold: float = typer.Option(0.90, "--threshold", help="Scaling efficiency required per added node."),
    mixed_precision: bool = typer.Option(
        False, "--mixed-precision", help="float16 on GPUs, bfloat16 on CPUs (--precision mixed)."
    ),
    precision: Optional[str] = typer.Option(
        None, "--precision", help="fp32, float16, bfloat16, mixed or auto (default: the GPU type's, as `train`)."
    ),
    fp32: bool = typer.Option(False, "--fp32", help="No mixed precision (--precision fp32)."),
    xla: Optional[bool] = typer.Option(None, "--xla/--no-xla", help="Compile the model with XLA (default: on GPUs)."),
    fp16_allreduce: Optional[bool] = typer.Option(
        None,
        "--fp16-allreduce/--no-fp16-allreduce",
        help="Gradients compressed to float16 for the allreduce (default: on GPUs).",
    ),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds each rung may take."),
    allow_socket_transport: bool = typer.Option(
        False, ALLOW_SOCKET, help="On an EFA type, run even when NCCL did not choose EFA (default: stop)."
    ),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    out: Path = typer.Option(Path("bench-results"), "--out", help="Folder for results.json, logs and scaling.png."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Synthetic Horovod ladder: 1 GPU, 1 node, all; a verdict."""
    from clusterctl.cli import display, tables
    from clusterctl.workloads.bench import ladder as benchlib
    from clusterctl.workloads.train import run as train_run

    if not synthetic:
        raise UsageError(
            "only --synthetic is supported", "run `clusterctl bench --synthetic`; real data is `clusterctl train`"
        )
    precision = train_run.precision_of(precision, fp32, mixed_precision)  # one precision from its synonyms
    opts = benchlib.BenchOptions(  # every option checked here, as a playbook's bench step is
        model=model,
        batch_size=batch_size,
        steps=steps,
        iters=iters,
        max_seconds=max_seconds,
        warmup_steps=warmup,
        xla=xla,
        input_only=input_only,
        threshold=threshold,
        timeout=timeout,
        precision=precision,
        fp16_allreduce=fp16_allreduce,
        allow_socket_transport=allow_socket_transport,
    )
    inv = _resolve_hosts(hostsfile, cluster, ssh)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    rungs = benchlib.parse_ladder(ladder, inv.hosts) if ladder else benchlib.default_ladder(inv.hosts)
    config = opts.config(inv.cluster)
    display.info(
        f"ladder: {', '.join(map(str, rungs))} process(es) on {len(inv.hosts.entries)} node(s), "
        f"configuration for {config.describe()} ({config.source}); {opts.stopping()}"
    )
    with display.StepLine() as step_line:
        result = benchlib.run_ladder(inv, rungs, opts, out, python, display.BenchProgress(), step_line)
    tables.ladder_table(result)
    _bench_cost(inv, result, "input-pipeline" if input_only else model)
    if result.judged and result.status == "INCONCLUSIVE":
        raise typer.Exit(int(ExitCode.INCONCLUSIVE))
    if result.judged and not result.passed:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _bench_cost(inv: Inventory, ladder: Ladder, model: str) -> None:
    """What the ladder cost, and what ImageNet costs at the rate measured on the top rung (bench.cost_lines)."""
    from clusterctl.cli import display
    from clusterctl.cluster import costs
    from clusterctl.workloads.bench import ladder as benchlib

    per_hour = costs.hourly(inv.cluster)
    for line in benchlib.cost_lines(ladder, per_hour, model):
        display.info(line)
    top = max(ladder.rungs, key=lambda r: r.np, default=None)
    if top is not None and top.img_per_sec > 0 and inv.cluster is not None and model != "input-pipeline":
        costs.save_measured(_store(), inv.cluster.name, top.img_per_sec, top.np, model, ladder.config)


# ---- the preflight check ---------------------------------------------------------------------------------
@app.command()
@ssh_options(*LOGIN)
def doctor(
    hostsfile: Optional[str] = HOSTS,
    cluster: Optional[str] = CLUSTER,
    json_: bool = typer.Option(False, "--json", help="The report as JSON."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds the probe may take on each node."),
    fabric: bool = typer.Option(
        False, "--fabric", help="Also measure allreduce bandwidth: the cluster, and ring neighbours."
    ),
    fabric_mb: float = typer.Option(64.0, "--fabric-mb", help="MiB per allreduce in the --fabric test."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Preflight checks that silently ruin multi-node training.

    ssh mesh, versions, GPUs, disk, memory, clock, stale processes, cloud placement; with --fabric, the
    allreduce bandwidth of the cluster and of each node's ring neighbours, the slow node named.
    """
    import json as jsonlib

    from clusterctl.cli import display, tables
    from clusterctl.workloads.doctor import preflight as doctorlib

    if fabric:
        within("--fabric-mb", fabric_mb, above=0, high=4096)
    store = _store()
    inv = _resolve_hosts(hostsfile, cluster, ssh, store=store)
    if fabric:
        inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    with display.StepLine() as steps:
        report = doctorlib.run(inv, python, timeout, _cloud_facts(inv.cluster, store), steps)
        if fabric:
            report = doctorlib.with_fabric(
                report, doctorlib.fabric(inv, python=python, mb=fabric_mb, timeout=max(timeout, 300.0), on_step=steps)
            )
    if json_:
        sys.stdout.write(jsonlib.dumps(report.to_dict()) + "\n")
    else:
        tables.doctor_table(report)
    if any(n.cells["reachable"].status == "fail" for n in report.nodes):
        raise typer.Exit(int(ExitCode.UNREACHABLE))
    if not report.ok:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _cloud_facts(cluster: Cluster | None, store: StateStore) -> dict[str, dict[str, str]] | None:
    """Instance type / zone / placement per node, as the cluster's provider sees them (None for a hosts file)."""
    if cluster is None:
        return None
    from clusterctl.workloads.doctor import preflight as doctorlib

    impl = _provider(cluster.provider, store, cluster.region)
    return doctorlib.placement_facts(cluster, impl.node_facts(cluster))


# ---- playbooks -------------------------------------------------------------------------------------------
@app.command()
def play(
    playbook: str = typer.Argument(..., help="A playbook file, or the name of a shipped one (smoke, cleanup ...)."),
    hostsfile: Optional[str] = typer.Option(None, "--hosts", help="A hosts file (default: the current cluster)."),
    cluster: Optional[str] = CLUSTER,
    var: List[str] = typer.Option([], "--var", help="Override a variable: --var name=value (repeatable)."),
    start_from: Optional[str] = typer.Option(None, "--from", help="Resume from this step."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what each step would run; run nothing."),
) -> None:
    """Run a playbook of named steps (run, put, sync, bench ...)."""
    from clusterctl.cli import display, tables
    from clusterctl.cluster import inventory
    from clusterctl.playbook import load as pbload, model as pbmodel, run as pb

    book = pbload.load(pbload.find(playbook), pbload.parse_vars(var))
    if dry_run:
        for step in book.steps:
            display.info(
                f"{step.name}: {pb.describe(step)}" + ("" if step.on_failure == "stop" else "  [on_failure: continue]")
            )
        return
    store = _store()
    with display.StepLine() as on_step:
        ctx = pbmodel.Context(
            inventory.resolve(hostsfile, cluster, store),
            store,
            report=display.info,
            on_step=on_step,
            base=Path(book.path).parent,
        )
        results = pb.execute(book, ctx, start_from)
    tables.play_summary(results)
    if not all(r.ok for r in results):
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


@app.command("run-job", short_help="Start a job the spec file names (its `jobs:`).")
def run_job(
    job: str = typer.Argument(..., help="The job's name in the spec file's `jobs:`."),
    spec_file: Optional[Path] = typer.Option(None, "--file", "-f", help="The spec file (default: ./clusterctl.yaml)."),
    cluster: Optional[str] = typer.Option(
        None, "--cluster", "-c", help="A cluster by name (default: the file's name, else the current)."
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what the job would run; run nothing."),
) -> None:
    """Start a job of the spec file: a train, a launch, a playbook (play) or any playbook step, by its name."""
    from clusterctl.cli import display
    from clusterctl.cli.up import file_schema
    from clusterctl.cluster import inventory
    from clusterctl.playbook import model as pbmodel, run as pb, specfile

    path = specfile.find(spec_file, Path.cwd(), shape_given=False)
    if path is None:
        raise UsageError(f"no spec file: no ./{specfile.FILE_NAME} here", "name one with -f FILE")
    sf = specfile.load(path, file_schema())
    step = sf.job(job)
    if dry_run:
        display.info(f"{step.name}: {pb.describe(step)}")
        return
    name = cluster or (str(sf.settings["name"].value) if "name" in sf.settings else None)
    store = _store()
    ctx = pbmodel.Context(inventory.resolve(None, name, store), store, report=display.info, base=path.parent)
    display.info(f"job {step.name} ({step.kind}) from {sf.where}:{step.line}")
    ok, detail = specfile.run_job(sf, step, ctx)
    display.info(f"job {step.name}: {detail}")
    if not ok:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


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
    from clusterctl.cli import display, tables
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
        open_view=tables.SweepProgress,
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
    from clusterctl.cli import display, tables
    from clusterctl.workloads.sweep import control

    done = control.attach(
        lambda: _resolve_hosts(hostsfile, cluster, ssh),
        sweep_id,
        out=out,
        poll=poll,
        open_view=tables.SweepProgress,
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
    from clusterctl.cli import tables
    from clusterctl.workloads.sweep import results as resultlib

    tables.sweep_table(
        resultlib.rows(state, state.params, state.meta.goal, sort), state.params, state.meta.metric, title
    )


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
