"""What each playbook step does: the same library calls the CLI commands make, never a shell-out.
Each takes its step's typed spec (model.py), already checked whole by load.py."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from clusterctl.cluster import inventory as inventory_mod
from clusterctl.playbook.model import (
    BenchSpec,
    CleanSpec,
    Context,
    DoctorSpec,
    EvalSpec,
    LaunchSpec,
    PutSpec,
    RunSpec,
    Step,
    SyncSpec,
    TrainSpec,
)

if TYPE_CHECKING:
    from clusterctl.workloads.bench.ladder import BenchOptions
    from clusterctl.workloads.train.options import TrainOptions
    from clusterctl.workloads.userjob import Plan as LaunchPlan


def run_step(step: Step, ctx: Context) -> tuple[bool, str]:
    handler: Callable[[Any, Context], tuple[bool, str]] = _HANDLERS[type(step.spec)]
    return handler(step.spec, ctx)


def _targets(ctx: Context, on: str) -> inventory_mod.Inventory:
    inv = ctx.inventory
    if on == "leader":
        return inventory_mod.subset(inv, inv.hosts.hosts[:1])
    if on == "members":
        return inventory_mod.subset(inv, inv.hosts.hosts[1:])
    return inv


def _run(s: RunSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl.remote.ssh import SshPool

    inv = _targets(ctx, s.nodes)
    if not inv.targets:
        return True, "no hosts to run on"
    with SshPool(inv.settings) as pool:
        report = pool.run(
            inv.targets, s.command, timeout=s.timeout, on_line=lambda h, _, line: ctx.report(f"  {h}: {line}")
        )
    want_exit, pattern = s.expect.exit, s.expect.output
    bad = []
    for r in report:
        if r.exit_code != want_exit:
            bad.append(f"{r.host}: exit {r.exit_code if r.exit_code is not None else r.status} (expected {want_exit})")
        elif pattern is not None and not re.search(pattern, r.stdout):
            bad.append(f"{r.host}: output does not match {pattern!r}")
    return (not bad), "; ".join(bad) or f"{len(report)} host(s) as expected"


def _put(s: PutSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl import resources
    from clusterctl.remote.ssh import SshPool

    inv = _targets(ctx, s.nodes)
    text = resources.render(s.template, **s.vars)
    with SshPool(inv.settings) as pool:
        report = pool.put(inv.targets, {s.dest: (text.encode(), s.mode)})
    bad = [f"{r.host}: {r.error}" for r in report if not r.ok]
    return (not bad), "; ".join(bad) or f"{s.dest} on {len(report)} host(s)"


def _doctor(s: DoctorSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads.doctor import preflight as doctor

    report = doctor.run(ctx.inventory, python=s.python, on_step=ctx.on_step)
    return report.ok, "; ".join(report.failures()) or "all checks passed"


def bench_options(s: BenchSpec) -> BenchOptions:
    """The step's bench.BenchOptions (the fields it leaves out: their defaults), checked as `clusterctl bench`'s
    are; load.py calls this too, so a bad value is refused before any step runs."""
    from clusterctl.workloads.bench import ladder as bench

    given = {
        f.name: getattr(s, f.name)
        for f in dataclasses.fields(bench.BenchOptions)
        if getattr(s, f.name, None) is not None
    }
    return bench.BenchOptions(**given)


def _bench(s: BenchSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads.bench import ladder as bench

    inv = ctx.inventory
    rungs = bench.parse_ladder(s.ladder, inv.hosts) if s.ladder else bench.default_ladder(inv.hosts)
    ladder = bench.run_ladder(inv, rungs, bench_options(s), Path(s.out), on_step=ctx.on_step)
    summary = ", ".join(f"{r.np}:{r.img_per_sec:.0f} img/s" for r in ladder.rungs)
    return (ladder.passed or not ladder.judged), f"{summary}; {ladder.verdict}"


def _clean(s: CleanSpec, ctx: Context) -> tuple[bool, str]:
    """The troubleshooting list: kill leftover jobs, remove a log folder, show disk (clean.py's commands)."""
    from clusterctl.cluster import clean
    from clusterctl.remote.ssh import SshPool

    inv = ctx.inventory
    actions = []
    if s.kill if s.kill is not None else not (s.logs is not None or s.disk):
        actions.append(("kill", clean.kill_command(s.all_user_processes)))  # the step is the confirmation
    if s.logs is not None:  # every node's checks first: a refusal anywhere stops the step before any removal
        actions += [("logs check", clean.logs_command(s.logs, s.force, check_only=True))]
        actions.append(("logs", clean.logs_command(s.logs, s.force)))
    if s.disk:
        actions.append(("disk", clean.DISK_COMMAND))
    details, ok = [], True
    with SshPool(inv.settings) as pool:
        for what, command in actions:
            report = pool.run(inv.targets, command, timeout=120)
            ok = ok and report.all_ok
            if what == "disk":
                rows = [row for r in report if r.ok for row in clean.parse_disk(r.host, r.stdout)]
                for row in rows:
                    ctx.report(f"  {row.host} {row.mount}: {row.free_fraction:.0%} free" + (" LOW" if row.low else ""))
            bad = [f"{r.host}: {r.error or r.stderr.strip()[-120:]}" for r in report if not r.ok]
            details.append(f"{what}: " + ("; ".join(bad) if bad else f"ok on {len(report)} node(s)"))
            if bad and what == "logs check":
                break
    return ok, "; ".join(details)


def check_sync(s: SyncSpec) -> None:
    """`clusterctl sync`'s checks of the step's values (load.py calls this before any step runs)."""
    from clusterctl.data import plan as syncplan

    syncplan.check_strategy(s.strategy)
    syncplan.check_fanout(s.fanout)
    syncplan.check_dst(s.dst)


def _sync(s: SyncSpec, ctx: Context) -> tuple[bool, str]:
    """`clusterctl sync`'s own run (cluster/sync_run.py): under an autostop lease, and a DST verified on a node
    goes into the cluster's record, so `repair` (and `up` adding nodes) copies it to a new node."""
    from clusterctl.cluster import sync_run
    from clusterctl.data import outcome as sync_outcome

    check_sync(s)
    opts = sync_run.options(s.src, s.dst, s.strategy, str(s.fanout), s.delete, s.endpoint_url or None)

    class Phases(sync_outcome.Events):
        def phase(self, text: str) -> None:
            ctx.report(f"  {text}")

    report = sync_run.run(ctx.inventory, ctx.store, opts, Phases(), ctx.report)
    err = report.error()
    if err is not None:
        return False, err.one_line()
    return True, f"{report.files} file(s), {report.total_bytes} bytes verified on {len(report.outcomes)} node(s)"


def train_options(s: TrainSpec) -> TrainOptions:
    """The step's TrainOptions, checked as `clusterctl train`'s are (load.py calls this too, so a bad value is
    refused before any step runs)."""
    from clusterctl.workloads.train import options

    return options.TrainOptions(
        data=s.data or None,
        synthetic=s.synthetic,
        model=s.model,
        epochs=s.epochs,
        batch_size=s.batch_size,
        extra=s.extra,
    ).require_source()


def _train(s: TrainSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl.remote import jobfolder
    from clusterctl.workloads.train import start as train

    opts = train_options(s)
    job = train.start(ctx.inventory, ctx.store, opts, report=ctx.report)
    if not s.wait:
        return True, f"started {job.job} (not waited for)"
    code = jobfolder.follow(ctx.inventory, job.job, lambda line: ctx.report(f"  {line}"))
    return code == 0, f"{job.job} exited {code}"


def _eval(_: EvalSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads.train import job as train

    job = train.require_job(ctx.store, ctx.inventory)
    result = train.evaluate(ctx.inventory, job)
    return True, f"top-1 {result.top1:.2f}%, top-5 {result.top5:.2f}% at step {result.step}"


def launch_plan(s: LaunchSpec, base: Path) -> LaunchPlan:
    """`clusterctl launch`'s checks of the command and its files (relative to `base`), before anything connects."""
    import shlex

    from clusterctl.workloads import userjob

    try:
        argv = shlex.split(s.command)
    except ValueError as exc:
        from clusterctl.errors import UsageError

        raise UsageError(f"command {s.command!r}: {exc}", "close its quotes") from None
    userjob.check_np(s.np, 1 << 30)  # the lower bound now; the slots once the hosts are known
    return userjob.plan(argv, s.files, base)


def _launch(s: LaunchSpec, ctx: Context) -> tuple[bool, str]:
    from clusterctl.cluster import autostop_control as autostop
    from clusterctl.remote import jobfolder
    from clusterctl.workloads import launch, userjob

    the_plan = launch_plan(s, ctx.base)
    inv = ctx.inventory
    inv.hosts.check_launchable()  # horovodrun takes one ssh port for every host
    np = userjob.check_np(s.np, inv.hosts.total_slots)
    with autostop.lease(ctx.store, inv.cluster, "launch", warn=ctx.report):  # autostop waits for the start
        job = userjob.start(inv, ctx.store, the_plan, np=np, report=ctx.report)
    if not s.wait:
        return True, f"started {job.job} (follow it: clusterctl logs {job.job} -f)"
    code = jobfolder.follow(inv, job.job, launch.with_network_line(lambda line: ctx.report(f"  {line}")))
    return code == 0, f"{job.job} exited {code}"


_HANDLERS: dict[type, Callable[[Any, Context], tuple[bool, str]]] = {
    RunSpec: _run,
    PutSpec: _put,
    DoctorSpec: _doctor,
    BenchSpec: _bench,
    CleanSpec: _clean,
    SyncSpec: _sync,
    TrainSpec: _train,
    EvalSpec: _eval,
    LaunchSpec: _launch,
}
