"""Commands that run work on the cluster: bench doctor play sweep train launch eval tensorboard."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from clusterctl.cli.shared import (
    DEFAULT_SSH,
    LOGIN,
    Ssh,
    _hourly,
    _print_line,
    _provider,
    _resolve_hosts,
    _store,
    ssh_options,
    within,
)
from clusterctl.errors import ClusterctlError, ExitCode, UsageError
from clusterctl.units import duration, money

app = typer.Typer()  # its commands are merged into cli/app.py's app (see COMMANDS there)


# ---- the synthetic benchmark -----------------------------------------------------------------------------
@app.command()
@ssh_options(*LOGIN)
def bench(
    hostsfile: Optional[str] = typer.Argument(
        None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."
    ),
    synthetic: bool = typer.Option(
        False, "--synthetic", help="Synthetic images (the only kind; real data is `train`)."
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    model: str = typer.Option("resnet50", "--model", help="resnet50, or tiny for CPU smoke runs."),
    batch_size: int = typer.Option(32, "--batch-size", help="Images per process per step."),
    steps: int = typer.Option(10, "--steps", help="Steps per timed batch."),
    iters: int = typer.Option(10, "--iters", help="Timed batches per rung (mean +- 1.96 sigma over them)."),
    warmup: int = typer.Option(10, "--warmup-steps", help="Untimed steps first (at least 10)."),
    input_only: bool = typer.Option(False, "--input-only", help="Time the input pipeline alone (no model)."),
    ladder: Optional[str] = typer.Option(
        None, "--ladder", help="Process counts, e.g. 1,8,16,32 (default: 1, one node, all)."
    ),
    threshold: float = typer.Option(0.90, "--threshold", help="Scaling efficiency required per added node."),
    mixed_precision: bool = typer.Option(False, "--mixed-precision", help="float16 compute."),
    xla: bool = typer.Option(False, "--xla", help="Compile the step with XLA."),
    timeout: float = typer.Option(900.0, "--timeout", help="Seconds each rung may take."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    out: Path = typer.Option(Path("bench-results"), "--out", help="Folder for results.json, logs and scaling.png."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Synthetic Horovod ladder: 1 GPU, 1 node, all; a verdict."""
    from clusterctl.cli import display
    from clusterctl.workloads import bench as benchlib

    if not synthetic:
        raise UsageError(
            "only --synthetic is supported", "run `clusterctl bench --synthetic`; real data is `clusterctl train`"
        )
    if model not in ("resnet50", "tiny"):
        raise UsageError(f"unknown model {model!r}", "use resnet50 or tiny")
    within("--threshold", threshold, above=0, high=1)
    within("--warmup-steps", warmup, benchlib.MIN_WARMUP)
    within("--iters", iters, benchlib.MIN_ITERS)
    within("--steps", steps, 1)
    within("--batch-size", batch_size, 1)
    inv = _resolve_hosts(hostsfile, cluster, ssh)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    rungs = benchlib.parse_ladder(ladder, inv.hosts) if ladder else benchlib.default_ladder(inv.hosts)
    opts = benchlib.BenchOptions(
        model=model,
        batch_size=batch_size,
        steps=steps,
        iters=iters,
        warmup_steps=warmup,
        mixed_precision=mixed_precision,
        xla=xla,
        input_only=input_only,
        threshold=threshold,
        timeout=timeout,
    )
    display.info(
        f"ladder: {', '.join(map(str, rungs))} process(es) on {len(inv.hosts.entries)} node(s), "
        f"model {model}, batch {batch_size}/process"
    )
    result = benchlib.run_ladder(inv, rungs, opts, out, python=python, on_event=display.BenchProgress())
    display.ladder_table(result)
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
        costs.save_measured(_store(), inv.cluster.name, top.img_per_sec, top.np, model)


# ---- the preflight check ---------------------------------------------------------------------------------
@app.command()
@ssh_options(*LOGIN)
def doctor(
    hostsfile: Optional[str] = typer.Argument(
        None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
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

    from clusterctl.cli import display
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
        display.doctor_table(report)
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
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    var: List[str] = typer.Option([], "--var", help="Override a variable: --var name=value (repeatable)."),
    start_from: Optional[str] = typer.Option(None, "--from", help="Resume from this step."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print what each step would run; run nothing."),
) -> None:
    """Run a playbook of named steps (run, put, sync, bench ...)."""
    from clusterctl import resources
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.playbook import load as pbload, model as pbmodel, run as pb

    path = Path(playbook)
    if not path.exists() and "/" not in playbook:
        shipped = resources.folder("playbooks") / (playbook if playbook.endswith(".yaml") else f"{playbook}.yaml")
        path = shipped if shipped.exists() else path
    overrides = {}
    for item in var:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--var takes name=value, not {item!r}")
        overrides[key] = value
    book = pbload.load(path, overrides)
    if dry_run:
        for step in book.steps:
            display.info(
                f"{step.name}: {pb.describe(step)}" + ("" if step.on_failure == "stop" else "  [on_failure: continue]")
            )
        return
    store = _store()
    ctx = pbmodel.Context(inventory.resolve(hostsfile, cluster, store), store, report=display.info)
    results = pb.execute(book, ctx, start_from)
    display.play_summary(results)
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
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name (default: the current)."),
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
    from clusterctl.cli import display
    from clusterctl.workloads import sweep_results as resultlib

    display.sweep_table(
        resultlib.rows(state, state.params, state.meta.goal, sort), state.params, state.meta.metric, title
    )


def _sweep_watch(pool, inv, sid: str, out: Path, poll: float) -> None:
    """Follow a sweep to its end, then: the sorted table, results.json, the logs, the plot; exit status."""
    from clusterctl.cli import display
    from clusterctl.errors import RemoteCommandError
    from clusterctl.workloads import sweep as sweeplib, sweep_results as resultlib

    try:
        state = sweeplib.watch(pool, inv.targets[0], sid, display.SweepProgress, poll=poll)
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


# ---- training ------------------------------------------------------------------------------------------
def _train_inventory(hostsfile, cluster, connect_timeout: float = 10.0):
    from clusterctl.cluster import inventory

    return inventory.resolve(hostsfile, cluster, _store(), inventory.SshOverrides(connect_timeout=connect_timeout))


@app.command()
@ssh_options(*LOGIN)
def train(
    hostsfile: Optional[str] = typer.Argument(
        None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."
    ),
    data: Optional[str] = typer.Option(
        None, "--data", help="Dataset folder on every node (ImageNet-format TFRecords, put there by `clusterctl sync`)."
    ),
    synthetic: bool = typer.Option(False, "--synthetic", help="Random in-memory images instead of --data."),
    model: str = typer.Option("resnet50", "--model", help="resnet50, or tiny for CPU rehearsals."),
    epochs: float = typer.Option(90, "--epochs"),
    batch_size: Optional[int] = typer.Option(
        None, "--batch-size", help="Images per process per step (trainer default 64)."
    ),
    model_dir: Optional[str] = typer.Option(
        None,
        "--model-dir",
        help="Checkpoints and TensorBoard logs on the leader (default ~/clusterctl-train/model); a restart resumes from it.",
    ),
    checkpoint_every: Optional[int] = typer.Option(
        None, "--checkpoint-every", help="Steps between checkpoints (also at every epoch)."
    ),
    log_every: Optional[int] = typer.Option(None, "--log-every", help="Steps between log lines."),
    max_steps: Optional[int] = typer.Option(
        None, "--max-steps", help="Stop at this step (the schedule still spans --epochs)."
    ),
    base_lr: Optional[float] = typer.Option(
        None, "--base-lr", help="Learning rate per 256 images (scaled with the global batch)."
    ),
    warmup_epochs: Optional[float] = typer.Option(None, "--warmup-epochs"),
    mixed_precision: bool = typer.Option(
        False, "--mixed-precision", help="float16 on GPUs, bfloat16 on CPUs (--precision mixed)."
    ),
    precision: Optional[str] = typer.Option(
        None,
        "--precision",
        help="auto (the trainer's default: float16 with loss scaling on GPUs with tensor cores, compute capability 7.0+, else fp32), fp32, float16, bfloat16 or mixed.",
    ),
    fp32: bool = typer.Option(False, "--fp32", help="No mixed precision, even on tensor-core GPUs (--precision fp32)."),
    fp16_allreduce: bool = typer.Option(
        False, "--fp16-allreduce", help="Compress gradients to float16 for the allreduce."
    ),
    recipe: Optional[str] = typer.Option(
        None,
        "--recipe",
        help="default (cosine decay, label smoothing 0.1) or goyal (Goyal et al. 2017: /10 at epochs 30, 60, 80 of 90, 5 warm-up epochs, no label smoothing, zero last BN gamma per residual block).",
    ),
    eval_every: Optional[int] = typer.Option(
        None,
        "--eval-every",
        help="Also evaluate every N epochs during training (all processes, each validation image once).",
    ),
    fusion_threshold_mb: float = typer.Option(
        64.0, "--fusion-threshold-mb", help="Horovod's tensor fusion buffer (HOROVOD_FUSION_THRESHOLD), MiB."
    ),
    cycle_time_ms: float = typer.Option(1.0, "--cycle-time-ms", help="Horovod's cycle time (HOROVOD_CYCLE_TIME), ms."),
    xla: bool = typer.Option(False, "--xla"),
    trainer_arg: List[str] = typer.Option(
        [], "--trainer-arg", help="One more argument for train_imagenet.py (repeatable)."
    ),
    np_: Optional[int] = typer.Option(None, "--np", help="Processes (default: every slot of the hosts)."),
    python: Optional[str] = typer.Option(None, "--python", help="Python on the nodes (default: the cluster's)."),
    wait: bool = typer.Option(False, "--wait", help="Follow the job to its end (exit status: the job's)."),
    force: bool = typer.Option(False, "--force", help="Stop a job still running first."),
    stop: bool = typer.Option(False, "--stop", help="Stop the training job everywhere, and start nothing."),
    no_verify_data: bool = typer.Option(
        False, "--no-verify-data", help="Skip the check that `clusterctl sync` verified the data on every node."
    ),
    checkpoint_to: Optional[str] = typer.Option(
        None,
        "--checkpoint-to",
        metavar="S3_URI",
        help="Also upload every checkpoint to s3://bucket/prefix (the nodes' instance profile; on AWS clusters clusterctl grants it write on that prefix only).",
    ),
    no_checkpoint_copy: bool = typer.Option(
        False, "--no-checkpoint-copy", help="Do not keep a copy of every checkpoint on the second node."
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Start training on the leader, in tmux.

    Horovod over every slot, launched by horovodrun on the leader inside tmux; returns at once (--wait
    follows it). Refuses while a job runs (--force stops it first) or when the data is not verified on
    every node. Started again, the job resumes from the latest checkpoint in --model-dir."""
    from clusterctl.cli import display
    from clusterctl.workloads import launch as launchlib, train_job as trainlib, train_options as trainopts

    inv = _resolve_hosts(hostsfile, cluster, ssh)
    store = _store()
    if stop:
        job = trainlib.require_job(store, inv)
        trainlib.stop(inv, job)
        display.info(f"stopped {job.job} on every node")
        return
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    if synthetic == bool(data):
        raise UsageError("give --data DIR or --synthetic (one of them)")
    if model not in ("resnet50", "tiny"):
        raise UsageError(f"unknown model {model!r}", "use resnet50 or tiny")
    for flag, value in (
        ("--batch-size", batch_size),
        ("--checkpoint-every", checkpoint_every),
        ("--log-every", log_every),
        ("--max-steps", max_steps),
        ("--np", np_),
    ):
        within(flag, value, 0 if flag == "--checkpoint-every" else 1)
    within("--epochs", epochs, above=0)
    if fp32:
        if precision not in (None, "fp32"):
            raise UsageError(f"--fp32 and --precision {precision} say different things", "give one of them")
        precision = "fp32"
    if mixed_precision and precision is not None:
        raise UsageError("--mixed-precision and --precision/--fp32 say different things", "give one of them")
    if precision is not None and precision not in trainopts.PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}", f"use one of {', '.join(trainopts.PRECISIONS)}")
    if recipe is not None and recipe not in trainopts.RECIPES:
        raise UsageError(f"unknown recipe {recipe!r}", f"use one of {', '.join(trainopts.RECIPES)}")
    within("--eval-every", eval_every, 1)
    within("--fusion-threshold-mb", fusion_threshold_mb, 0)
    within("--cycle-time-ms", cycle_time_ms, above=0)
    if checkpoint_to is not None:
        trainopts.check_s3_uri(checkpoint_to)
        if inv.cluster is not None:
            _provider(inv.cluster.provider, store, inv.cluster.region).grant_checkpoint_write(
                inv.cluster, checkpoint_to
            )
    opts = trainopts.TrainOptions(
        data=data,
        synthetic=synthetic,
        model=model,
        epochs=epochs,
        batch_size=batch_size,
        model_dir=model_dir,
        max_steps=max_steps,
        base_lr=base_lr,
        warmup_epochs=warmup_epochs,
        checkpoint_every=checkpoint_every,
        log_every=log_every,
        mixed_precision=mixed_precision,
        xla=xla,
        checkpoint_to=checkpoint_to,
        extra=tuple(trainer_arg),
    )
    from dataclasses import replace

    opts = replace(
        opts,
        precision=precision,
        fp16_allreduce=fp16_allreduce,
        recipe=recipe,
        eval_every=eval_every,
        fusion_threshold_mb=fusion_threshold_mb,
        cycle_time_ms=cycle_time_ms,
    )
    job = trainlib.start(
        inv,
        store,
        opts,
        np=np_,
        python=python,
        force=force,
        verify_data=not no_verify_data,
        report=display.info,
        checkpoint_copy=not no_checkpoint_copy,
    )
    display.info(
        f"started training job {job.job}: {job.np} process(es), leader {job.leader} (tmux session "
        f"{job.job}); checkpoints in {job.model_dir}"
    )
    _train_estimate(trainlib.job_inventory(inv, job), job, opts)
    if not wait:
        display.info("follow it: clusterctl logs -f; where it is: clusterctl status")
        return
    began = time.monotonic()
    code = launchlib.follow(trainlib.job_inventory(inv, job), job.job, _print_line)
    from clusterctl.cluster import costs

    per_hour = costs.hourly(inv.cluster)
    took = time.monotonic() - began
    display.info(
        f"cost: this run took {duration(took)}"
        + (
            f" on a {money(per_hour)}/hour cluster: about {money(costs.run_cost(took, per_hour))}"
            if per_hour is not None
            else ""
        )
    )
    if code != 0:
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _train_estimate(inv, job, opts) -> None:
    """The run's estimated cost: images to train (the dataset's count x epochs, or --max-steps) at the img/s
    `bench` measured on this cluster for this model."""
    from clusterctl.cli import display
    from clusterctl.cluster import costs

    per_hour = costs.hourly(inv.cluster)
    measured = costs.load_measured(_store(), inv.cluster.name) if inv.cluster is not None else None
    if measured is None or measured.get("model") != opts.model:
        display.info(
            f"cost: {money(per_hour)}/hour; no img/s measured for {opts.model} on this cluster yet "
            f"(`clusterctl bench --synthetic --model {opts.model}` measures it; `clusterctl status` shows "
            "the cost to finish once the job runs)"
        )
        return
    images, what = None, ""
    if opts.max_steps:
        images, what = opts.max_steps * (opts.batch_size or 64) * job.np, f"{opts.max_steps} step(s)"
    elif job.options.data:
        from clusterctl.workloads import train_job as trainlib

        per_epoch = trainlib.dataset_examples(inv, job.options.data)
        if per_epoch:
            images, what = int(per_epoch * opts.epochs), f"{opts.epochs:g} epoch(s) of {per_epoch:,} images"
    if images is None:
        images, what = int(costs.IMAGENET_TRAIN_IMAGES * opts.epochs), f"{opts.epochs:g} ImageNet-sized epoch(s)"
    rate = float(measured["img_per_sec"]) * job.np / max(1, int(measured.get("np") or job.np))
    display.info(
        f"cost: estimated {costs.epoch_line(rate, per_hour, images, 1.0, what)} (from the "
        f"{float(measured['img_per_sec']):,.0f} img/s `bench` measured at {measured.get('np')} process(es), "
        "scaled linearly; `clusterctl status` shows the cost to finish from the job's own rate)"
    )


# ---- your own Horovod script -------------------------------------------------------------------------------
@app.command(short_help="Run your own Horovod script on the cluster, in tmux.")
@ssh_options(*LOGIN)
def launch(
    args: List[str] = typer.Argument(
        None,
        metavar="[HOSTS] -- python SCRIPT [ARGS]",
        help="A hosts file (optional), then after -- the command every rank runs.",
    ),
    np_: Optional[int] = typer.Option(None, "--np", help="Processes (default: every slot of the hosts)."),
    file: List[str] = typer.Option(
        [],
        "--file",
        metavar="PATH",
        help="One more file for the job folder (repeatable); "
        "the script named in the command is copied when it is a file here.",
    ),
    name: Optional[str] = typer.Option(None, "--name", help="The job's name (default: launch-<time>-<pid>)."),
    attach: bool = typer.Option(False, "--attach", help="Follow the job to its end (exit status: the job's)."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    ssh: Ssh = DEFAULT_SSH,
) -> None:
    """Run your own Horovod script: horovodrun on the leader, detached in tmux.

    The script and --file files go to one job folder at the same path on every node; the leading
    `python` becomes the node runtime's Python; horovodrun runs over every slot (or --np) with host
    keys checked and a scrubbed environment. Follow it with `clusterctl logs NAME`, end it with
    `clusterctl kill NAME`; `clusterctl status` lists it."""
    from clusterctl.cli import display
    from clusterctl.workloads import launch as launchlib, userjob

    hosts_path, command_argv = userjob.split_hosts(args or [])
    the_plan = userjob.plan(command_argv, file, Path.cwd())  # bad input fails here, before any connection
    if name is not None:
        from clusterctl.remote import tmux as jobs

        jobs.validate_job_name(name)
    userjob.check_np(np_, 1 << 30)  # the lower bound now; the slots once the hosts are known
    inv = _resolve_hosts(hosts_path, cluster, ssh)
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    np_ = userjob.check_np(np_, inv.hosts.total_slots)
    from clusterctl.cluster import autostop_control as autostop

    with autostop.lease(_store(), inv.cluster, "launch", warn=display.warn):  # autostop waits for the start
        job = userjob.start(inv, _store(), the_plan, np=np_, name=name, report=display.info)
    display.info(f"`{the_plan.command.python}` runs as the node runtime's Python on every node: {job.python}")
    display.info(
        f"started job {job.job}: {job.np} process(es) on {len(job.nodes)} node(s), horovodrun on the "
        f"leader {job.leader} (tmux session {job.job}, folder {job.job_dir})"
    )
    if not attach:
        display.info(f"follow it: clusterctl logs {job.job} -f; end it: clusterctl kill {job.job}")
        return
    try:
        with autostop.lease(_store(), inv.cluster, "launch --attach", warn=display.warn):
            code = launchlib.follow(inv, job.job, _print_line)
    except KeyboardInterrupt:
        display.info(f"detached; {job.job} keeps running (clusterctl kill {job.job} ends it)")
        raise typer.Exit(int(ExitCode.INTERRUPTED)) from None
    if code != 0:
        display.error(f"job {job.job} exited {code}")
        raise typer.Exit(int(ExitCode.REMOTE_FAILED))


def _launch_status(name: str) -> None:
    """The cluster's `launch` jobs (running ones and the latest), after its node table in `status`."""
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.workloads import userjob

    store = _store()
    try:
        inv = inventory.resolve(None, name, store)
        lines = userjob.status_lines(store, inv)
    except ClusterctlError as exc:
        display.warn(f"launch jobs: {exc.one_line()}")
        return
    for line in lines:
        display.console().print(display._esc(line))


@app.command("eval")
def eval_(
    hostsfile: Optional[str] = typer.Argument(
        None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show the evaluation's own output."),
    timeout: Optional[float] = typer.Option(None, "--timeout", help="Seconds the evaluation may take."),
) -> None:
    """Top-1/top-5 of the latest checkpoint.

    Evaluates the training job's latest checkpoint on the leader alone (GPUs hidden while it trains)."""
    from clusterctl.cli import display
    from clusterctl.workloads import train_job as trainlib

    inv = _train_inventory(hostsfile, cluster)
    job = trainlib.require_job(_store(), inv)
    result = trainlib.evaluate(inv, job, on_line=_print_line if verbose else None, timeout=timeout)
    display.train_eval(result)


@app.command()
def tensorboard(
    hostsfile: Optional[str] = typer.Argument(
        None, metavar="[HOSTS]", help="A hosts file (default: the current cluster)."
    ),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="A cluster by name."),
    port: int = typer.Option(6006, "--port", help="Local port of the tunnel (127.0.0.1 only)."),
    remote_port: int = typer.Option(6006, "--remote-port", help="TensorBoard's port on the leader (127.0.0.1 only)."),
) -> None:
    """TensorBoard on the leader, via ssh tunnel.

    TensorBoard bound to the leader's 127.0.0.1 (never an open port), reached through an ssh tunnel to
    local --port; Ctrl-C ends both."""
    from clusterctl.cli import display
    from clusterctl.workloads import train_job as trainlib, train_tensorboard

    for flag, value in (("--port", port), ("--remote-port", remote_port)):
        within(flag, value, 1, 65535)
    inv = _train_inventory(hostsfile, cluster)
    job = trainlib.require_job(_store(), inv)
    with train_tensorboard.tensorboard_tunnel(inv, job, port, remote_port) as tunnel:
        display.info(f"TensorBoard of {job.job}: http://127.0.0.1:{port}/ (Ctrl-C to stop)")
        code = tunnel.wait()
        raise ClusterctlError(f"the ssh tunnel ended (exit {code})", "run `clusterctl tensorboard` again")


def _train_logs(hostsfile, cluster, follow: bool, connect_timeout: float) -> None:
    """`clusterctl logs` without a job name: the training job's log, from the leader."""
    from clusterctl.workloads import launch as launchlib, train_job as trainlib

    inv = _train_inventory(hostsfile, cluster, connect_timeout)
    job = trainlib.require_job(_store(), inv)
    if follow:
        code = launchlib.follow(trainlib.job_inventory(inv, job), job.job, _print_line)
        raise typer.Exit(0 if code == 0 else int(ExitCode.REMOTE_FAILED))
    text = trainlib.read_log(inv, job).text
    sys.stdout.write(text)


def _train_status(name: str) -> None:
    """The training job's place, when the cluster has one (`status` calls this after its node table)."""
    from clusterctl.cli import display
    from clusterctl.cluster import inventory
    from clusterctl.workloads import train_job as trainlib

    store = _store()
    try:
        inv = inventory.resolve(None, name, store)
    except ClusterctlError:
        return
    job = trainlib.load_job(store, inv)
    if job is None:
        return
    try:
        st = trainlib.job_status(inv, job)
    except ClusterctlError as exc:
        display.warn(f"training job {job.job}: {exc.one_line()}")
        return
    display.train_status(job, st, _hourly(inv.cluster))
