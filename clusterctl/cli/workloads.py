"""Commands that check and explore the cluster: bench doctor play sweep (training is cli/train.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

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
        10, "--iters", help="Timed batches per rung (the verdict's 95% interval narrows as their square root)."
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
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    out: Path = typer.Option(Path("bench-results"), "--out", help="Folder for results.json, logs and scaling.png."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Synthetic Horovod ladder: 1 GPU, 1 node, all; a verdict."""
    from clusterctl.cli import display, tables
    from clusterctl.workloads import bench as benchlib

    if not synthetic:
        raise UsageError(
            "only --synthetic is supported", "run `clusterctl bench --synthetic`; real data is `clusterctl train`"
        )
    precision = _precision(precision, fp32, mixed_precision)
    opts = benchlib.BenchOptions(  # every option checked here, as a playbook's bench step is
        model=model,
        batch_size=batch_size,
        steps=steps,
        iters=iters,
        warmup_steps=warmup,
        xla=xla,
        input_only=input_only,
        threshold=threshold,
        timeout=timeout,
        precision=precision,
        fp16_allreduce=fp16_allreduce,
    )
    inv = _resolve_hosts(hostsfile, cluster, ssh)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    rungs = benchlib.parse_ladder(ladder, inv.hosts) if ladder else benchlib.default_ladder(inv.hosts)
    config = opts.config(inv.cluster)
    display.info(
        f"ladder: {', '.join(map(str, rungs))} process(es) on {len(inv.hosts.entries)} node(s), "
        f"configuration for {config.describe()} ({config.source})"
    )
    result = benchlib.run_ladder(inv, rungs, opts, out, python=python, on_event=display.BenchProgress())
    tables.ladder_table(result)
    _bench_cost(inv, result, "input-pipeline" if input_only else model)
    if result.judged and result.status == "INCONCLUSIVE":
        raise typer.Exit(int(ExitCode.INCONCLUSIVE))
    if result.judged and not result.passed:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _bench_cost(inv, ladder, model: str) -> None:
    """What the ladder cost, and what ImageNet costs at the rate measured on the top rung (bench.cost_lines)."""
    from clusterctl.cli import display
    from clusterctl.cluster import costs
    from clusterctl.workloads import bench as benchlib

    per_hour = costs.hourly(inv.cluster)
    for line in benchlib.cost_lines(ladder, per_hour, model):
        display.info(line)
    top = max(ladder.rungs, key=lambda r: r.np, default=None)
    if top is not None and top.img_per_sec > 0 and inv.cluster is not None and model != "input-pipeline":
        costs.save_measured(_store(), inv.cluster.name, top.img_per_sec, top.np, model, ladder.config)


def _precision(precision: Optional[str], fp32: bool, mixed: bool) -> Optional[str]:
    """One precision from --precision, --fp32 and --mixed-precision (None: the GPU type's)."""
    if fp32:
        if precision not in (None, "fp32"):
            raise UsageError(f"--fp32 and --precision {precision} say different things", "give one of them")
        precision = "fp32"
    if mixed:
        if precision is not None:
            raise UsageError("--mixed-precision and --precision/--fp32 say different things", "give one of them")
        precision = "mixed"
    return precision  # an unknown one is refused by BenchOptions, as a playbook's is


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

    from clusterctl.cli import tables
    from clusterctl.workloads import doctor as doctorlib

    if fabric:
        within("--fabric-mb", fabric_mb, above=0, high=4096)
    store = _store()
    inv = _resolve_hosts(hostsfile, cluster, ssh, store=store)
    if fabric:
        inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    report = doctorlib.run(inv, python=python, timeout=timeout, cloud=_cloud_facts(inv.cluster, store))
    if fabric:
        report = doctorlib.with_fabric(
            report, doctorlib.fabric(inv, python=python, mb=fabric_mb, timeout=max(timeout, 300.0))
        )
    if json_:
        sys.stdout.write(jsonlib.dumps(report.to_dict()) + "\n")
    else:
        tables.doctor_table(report)
    if any(n.cells["reachable"].status == "fail" for n in report.nodes):
        raise typer.Exit(int(ExitCode.UNREACHABLE))
    if not report.ok:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _cloud_facts(cluster, store):
    """Instance type / zone / placement per node, as the cluster's provider sees them (None for a hosts file)."""
    if cluster is None:
        return None
    from clusterctl.workloads import doctor as doctorlib

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
    ctx = pbmodel.Context(inventory.resolve(hostsfile, cluster, store), store, report=display.info)
    results = pb.execute(book, ctx, start_from)
    tables.play_summary(results)
    if not all(r.ok for r in results):
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


# ---- parameter sweeps ------------------------------------------------------------------------------------
@app.command(context_settings={"allow_interspersed_args": False})
@ssh_options(*LOGIN)
def sweep(
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
        False, "--detach", help="Start the sweep and return (then --status, --attach, --cancel)."
    ),
    status: bool = typer.Option(False, "--status", help="Show a sweep's trials now (from another terminal too)."),
    attach: bool = typer.Option(False, "--attach", help="Watch a sweep until it ends, then write its results here."),
    cancel: bool = typer.Option(False, "--cancel", help="End every trial of a sweep and stop it."),
    sweep_id: Optional[str] = typer.Option(
        None, "--id", help="The sweep for --status/--attach/--cancel (default: the latest)."
    ),
    json_: bool = typer.Option(False, "--json", help="With --status: the scheduler's whole state as JSON."),
    out: Path = typer.Option(Path("sweep-results"), "--out", help="Folder for <time>/results.json, logs and the plot."),
    cluster: Optional[str] = CURRENT_CLUSTER,
    hostsfile: Optional[str] = typer.Option(None, "--hosts", help="A hosts file instead of a cluster."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    poll: float = typer.Option(1.0, "--poll", help="Seconds between the scheduler's rounds (and this watch's)."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Parallel experiments: one trial per GPU, run detached.

    A grid or random search across every node.
    """
    import json as jsonlib

    from clusterctl.cli import display
    from clusterctl.remote.ssh import SshPool
    from clusterctl.workloads import sweep as sweeplib, sweep_plan as planlib, sweep_results as resultlib

    modes = [
        name
        for name, on in (("--status", status), ("--attach", attach), ("--cancel", cancel), ("--detach", detach))
        if on
    ]
    if len(modes) > 1:
        raise UsageError(f"{' and '.join(modes)} do not go together")
    control = status or attach or cancel
    if control and (cmd or grid or range_ or random_k is not None or files):
        raise UsageError(f"{modes[0]} takes no command or parameters", "name the sweep with --id (default: the latest)")
    if sweep_id is not None and not control:
        raise UsageError("--id goes with --status, --attach or --cancel")
    if json_ and not status:
        raise UsageError("--json goes with --status")
    within("--poll", poll, 0.1, 60, unit="seconds")
    if sweep_id is not None:
        planlib.validate_id(sweep_id)
    spec = None
    if not control:
        if goal not in ("max", "min"):
            raise UsageError(f"--goal must be max or min, not {goal!r}")
        within("--gpus-per-trial", gpus_per_trial, 1)
        within("--trial-timeout", trial_timeout, above=0)
        within("--node-timeout", node_timeout, above=0)
        planlib.check_metric(metric)
        grid_values = planlib.parse_grid(grid)
        ranges = planlib.parse_ranges(range_)
        combos = planlib.expand(grid_values, ranges, random_k, seed)
        staged = planlib.stage_files(files)
        planlib.build_trials(cmd or [], combos[:1], "python")  # a bad command template fails before connecting
    inv = _resolve_hosts(hostsfile, cluster, ssh)
    inv.hosts.check_launchable("the sweep scheduler (ssh from the leader to each node)")
    py = sweeplib.python_for(inv.cluster, python)
    if not control:
        trials = planlib.build_trials(cmd or [], combos, py)
        params = tuple(combos[0])
        for name in planlib.unused(cmd or [], params):
            display.warn(f"parameter {name} is not used in the command (no {{{name}}} in it)")
        spec = planlib.SweepSpec(
            tuple(cmd or ()),
            tuple(trials),
            params,
            gpus_per_trial,
            metric,
            metric_key,
            goal,
            tuple(staged),
            workdir,
            trial_timeout,
            node_timeout,
            poll,
            tuple(n for n, r in ranges.items() if r.scale == "log"),
        )
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        if spec is not None:
            sid, folder = sweeplib.start(pool, inv, spec, py)
            slots = sum(e.slots for e in inv.hosts.entries) // gpus_per_trial
            display.info(
                f"sweep {sid}: {len(spec.trials)} trial(s) on {len(inv.hosts.entries)} node(s), up to {slots} "
                f"at once; scheduler detached on the leader {leader.label} (tmux {sid}), trials' logs in {folder}"
            )
            if detach:
                display.info(f"follow it with: clusterctl sweep --attach --id {sid}  (or --status, --cancel)")
                return
            _sweep_watch(pool, inv, sid, out, poll)
            return
        sid = planlib.validate_id(sweep_id) if sweep_id else sweeplib.latest(pool, leader)
        if status:
            snap = sweeplib.read_state(pool, leader, sid)
            if json_:
                sys.stdout.write(
                    jsonlib.dumps({"id": sid, "scheduler": "running" if snap.alive else "stopped", "state": snap.raw})
                    + "\n"
                )
                return
            if snap.state is None:
                display.info(
                    f"sweep {sid}: the scheduler has not written its state yet"
                    + ("" if snap.alive else f" and is not running; see ~/.clusterctl/jobs/{sid}.log on the leader")
                )
                return
            _sweep_show(snap.state, sort=snap.state.ended_for_good)
            if not snap.alive and not snap.state.ended_for_good and snap.log_tail.strip():
                display.warn("the scheduler's last words: " + " / ".join(snap.log_tail.strip().splitlines()[-3:]))
            display.info(
                resultlib.summary(snap.state)
                + (
                    ""
                    if snap.alive or snap.state.ended_for_good
                    else "; the scheduler is not running (--cancel ends its trials)"
                )
            )
            return
        if cancel:
            state = sweeplib.cancel(pool, leader, sid, py)
            _sweep_show(state, sort=False)
            display.info(resultlib.summary(state))
            return
        _sweep_watch(pool, inv, sid, out, poll)


def _sweep_show(state, sort: bool, title: Optional[str] = None) -> None:
    from clusterctl.cli import tables
    from clusterctl.workloads import sweep_results as resultlib

    tables.sweep_table(
        resultlib.rows(state, state.params, state.meta.goal, sort), state.params, state.meta.metric, title
    )


def _sweep_watch(pool, inv, sid: str, out: Path, poll: float) -> None:
    """Follow a sweep to its end, then: the sorted table, results.json, the logs, the plot; exit status."""
    from clusterctl.cli import display, tables
    from clusterctl.errors import RemoteCommandError
    from clusterctl.workloads import sweep as sweeplib, sweep_results as resultlib

    try:
        state = sweeplib.watch(pool, inv.targets[0], sid, tables.SweepProgress, poll=poll)
    except KeyboardInterrupt:
        display.info(
            f"stopped watching; sweep {sid} goes on on the leader: "
            f"clusterctl sweep --status | --attach | --cancel  (--id {sid})"
        )
        raise
    metric, goal = state.meta.metric, state.meta.goal
    folder = resultlib.results_dir(out)
    missing = sweeplib.collect_logs(pool, inv, state, folder)
    resultlib.write_results(folder, state, inv.cluster.name if inv.cluster else None)
    plotted = resultlib.plot(state, folder / "metric_vs_params.png")
    _sweep_show(state, sort=True, title=f"sweep {sid}: {metric} ({goal}), best first")
    top = resultlib.best(state, goal)
    display.info(resultlib.summary(state))
    if state.error:
        display.warn(state.error)
    if top is not None:
        display.info(f"best: trial {top.id} ({top.params_text()}) {metric} {top.metric:.6g}")
    if missing:
        display.warn(f"no logs from {', '.join(missing)} (node dead or unreachable)")
    display.info(f"results: {folder}/results.json, logs/" + (", metric_vs_params.png" if plotted else ""))
    if state.status == "cancelled":
        raise RemoteCommandError(f"sweep {sid} was cancelled", f"results so far are in {folder}")
    bad = [t for t in state.trials if not t.done_with_metric]
    if bad:
        raise RemoteCommandError(
            f"{len(bad)} of {len(state.trials)} trial(s) did not finish with a metric "
            f"({', '.join(str(t.id) for t in bad[:10])})",
            f"see their logs in {folder}/logs",
        )
