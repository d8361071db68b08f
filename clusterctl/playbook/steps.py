"""What each playbook step does: the same library calls the CLI commands make, never a shell-out."""

from __future__ import annotations

import re
from pathlib import Path

from clusterctl.cluster import inventory as inventory_mod
from clusterctl.playbook.run import Context, PlaybookError, Step


def run_step(step: Step, ctx: Context) -> tuple[bool, str]:
    handler = _HANDLERS.get(step.kind)
    if handler is None:
        raise PlaybookError(f"step {step.name!r}: {step.kind} steps are not available in this version")
    return handler(step, ctx)


def _targets(ctx: Context, on: str):
    inv = ctx.inventory
    if on == "leader":
        return inventory_mod.subset(inv, inv.hosts.hosts[:1])
    if on == "members":
        return inventory_mod.subset(inv, inv.hosts.hosts[1:])
    return inv


def _run(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl.remote.ssh import SshPool

    p = step.params
    inv = _targets(ctx, str(p.get("nodes", "all")))
    if not inv.targets:
        return True, "no hosts to run on"
    with SshPool(inv.settings) as pool:
        report = pool.run(inv.targets, str(p["command"]), timeout=p.get("timeout"),
                          on_line=lambda h, s, line: ctx.report(f"  {h}: {line}"))
    expect = p.get("expect") or {"exit": 0}
    want_exit = expect.get("exit", 0)
    pattern = expect.get("output")
    bad = []
    for r in report:
        if r.exit_code != want_exit:
            bad.append(f"{r.host}: exit {r.exit_code if r.exit_code is not None else r.status} (expected {want_exit})")
        elif pattern is not None and not re.search(str(pattern), r.stdout):
            bad.append(f"{r.host}: output does not match {pattern!r}")
    return (not bad), "; ".join(bad) or f"{len(report)} host(s) as expected"


def _put(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl import resources
    from clusterctl.remote.ssh import SshPool

    p = step.params
    inv = _targets(ctx, str(p.get("nodes", "all")))
    text = resources.render(str(p["template"]), **(p.get("vars") or {}))
    mode = int(str(p.get("mode", "644")), 8)
    with SshPool(inv.settings) as pool:
        report = pool.put(inv.targets, {str(p["dest"]): (text.encode(), mode)})
    bad = [f"{r.host}: {r.error}" for r in report if not r.ok]
    return (not bad), "; ".join(bad) or f"{p['dest']} on {len(report)} host(s)"


def _doctor(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads import doctor

    report = doctor.run(ctx.inventory, python=step.params.get("python"))
    return report.ok, "; ".join(report.failures()) or "all checks passed"


def _bench(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads import bench

    p = step.params
    inv = ctx.inventory
    rungs = bench.parse_ladder(str(p["ladder"]), inv.hosts) if p.get("ladder") else bench.default_ladder(inv.hosts)
    opts = bench.BenchOptions(model=str(p.get("model", "resnet50")), batch_size=int(p.get("batch_size", 32)),
                              steps=int(p.get("steps", 10)), iters=int(p.get("iters", 10)),
                              # Horovod's reference warms up 10 steps: fewer would time graph tracing
                              warmup_steps=max(bench.MIN_WARMUP, int(p.get("warmup_steps", bench.MIN_WARMUP))),
                              threshold=float(p.get("threshold", bench.DEFAULT_THRESHOLD)),
                              timeout=float(p.get("timeout", 900)))
    ladder = bench.run_ladder(inv, rungs, opts, Path(str(p.get("out", "bench-results"))))
    summary = ", ".join(f"{r.np}:{r.img_per_sec:.0f} img/s" for r in ladder.rungs)
    return (ladder.passed or not ladder.judged), f"{summary}; {ladder.verdict}"


def _clean(step: Step, ctx: Context) -> tuple[bool, str]:
    """The troubleshooting list: kill leftover jobs, remove a log folder, show disk (clean.py's commands)."""
    from clusterctl.remote import clean
    from clusterctl.remote.ssh import SshPool

    p = step.params
    inv = ctx.inventory
    actions = []
    if "logs" in p and not isinstance(p["logs"], str):  # a rendered variable must never turn into "no logs"
        raise PlaybookError(f"clean step {step.name!r}: logs must be a folder, not {p['logs']!r}")
    if p.get("kill", not ("logs" in p or p.get("disk"))):
        actions.append(("kill", clean.kill_command()))
    if "logs" in p:
        clean.check_logs_path(str(p["logs"]))
        actions.append(("logs", clean.logs_command(str(p["logs"]), bool(p.get("force", False)))))
    if p.get("disk"):
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
    return ok, "; ".join(details)


def _sync(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads import launch
    from clusterctl.data import sync as transfer
    from clusterctl.remote.ssh import SshPool

    p = step.params
    inv = ctx.inventory
    strategy = str(p.get("strategy", "chain"))
    if strategy not in transfer.STRATEGIES:
        raise PlaybookError(f"step {step.name!r}: unknown strategy {strategy!r}")
    dst = str(p["dst"])
    transfer.check_dst(dst)
    source = transfer.parse_source(str(p["src"]))

    class Phases(transfer.Events):
        def phase(self, text: str) -> None:
            ctx.report(f"  {text}")

    with SshPool(inv.settings) as pool:
        report = transfer.Syncer(inv.targets, [e.address for e in inv.hosts.entries], inv.settings.known_hosts, pool, source, dst,
                                 strategy=strategy, fanout=int(p.get("fanout", 1)), delete=bool(p.get("delete", False)),
                                 endpoint_url=p.get("endpoint_url") or None, managed=inv.cluster is not None,
                                 events=Phases(), node_python=launch.node_python(inv.cluster)).run()
    err = report.error()
    if err is not None:
        return False, err.one_line()
    return True, f"{report.files} file(s), {report.total_bytes} bytes verified on {len(report.outcomes)} node(s)"


def _train(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads import launch
    from clusterctl.workloads import train_job as train

    p = step.params
    synthetic = bool(p.get("synthetic", False))
    opts = train.TrainOptions(
        data=None if synthetic else str(p["data"]) if p.get("data") else None, synthetic=synthetic,
        model=str(p.get("model", "resnet50")), epochs=float(p["epochs"]) if p.get("epochs") else None,
        batch_size=int(p["batch_size"]) if p.get("batch_size") else None,
        extra=tuple(str(x) for x in (p.get("extra") or ())))
    if not synthetic and not opts.data:
        raise PlaybookError(f"step {step.name!r}: train needs data or synthetic: true")
    job = train.start(ctx.inventory, ctx.store, opts, report=ctx.report)
    if not p.get("wait", True):
        return True, f"started {job.job} (not waited for)"
    code = launch.follow(ctx.inventory, job.job, lambda line: ctx.report(f"  {line}"))
    return code == 0, f"{job.job} exited {code}"


def _eval(step: Step, ctx: Context) -> tuple[bool, str]:
    from clusterctl.workloads import train_job as train

    job = train.require_job(ctx.store, ctx.inventory)
    result = train.evaluate(ctx.inventory, job)
    return True, f"top-1 {result.top1:.2f}%, top-5 {result.top5:.2f}% at step {result.step}"


_HANDLERS = {"run": _run, "put": _put, "doctor": _doctor, "bench": _bench, "clean": _clean,
             "sync": _sync, "train": _train, "eval": _eval}
