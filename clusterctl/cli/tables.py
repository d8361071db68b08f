"""The tables of results (rich), on stdout: clusters, gc, the bench ladder, doctor, sync, sweeps, playbooks,
training; and a running sweep's table, redrawn in place. Library code never prints; it hands typed values
here (the line printers are cli/display.py)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from clusterctl.cli.display import _esc, console, fitted_table, info, warn
from clusterctl.units import duration, money

if TYPE_CHECKING:
    from types import TracebackType

    from rich.console import JustifyMethod
    from rich.live import Live
    from rich.table import Table

    from clusterctl.cluster.gc import Scan
    from clusterctl.data.outcome import SyncReport
    from clusterctl.playbook.model import StepResult
    from clusterctl.providers.base import ClusterStatus
    from clusterctl.types import Cluster
    from clusterctl.workloads.bench.verdict import Ladder
    from clusterctl.workloads.cluster_view import ClusterView
    from clusterctl.workloads.doctor.judge import Allreduce, DoctorReport
    from clusterctl.workloads.jobs import Job
    from clusterctl.workloads.train.job import TrainJob
    from clusterctl.workloads.train.log import EvalResult, TrainStatus


# ---- clusters ----------------------------------------------------------------------------------------
def cluster_table(
    rows: Sequence[Mapping[str, object]],
    columns: Sequence[str] = ("name", "provider", "nodes", "type", "slots", "age", "state"),
) -> None:
    fitted_table(
        [c.upper() for c in columns], [[_esc(str(r.get(c, ""))) for c in columns] for r in rows], prose=("NOTE",)
    )


def cluster_status(status: ClusterStatus, now: float, current: bool = False, notes: Sequence[str] = ()) -> None:
    """`status` of a cluster as its provider sees it: one row per node, then $/hour and cost so far."""
    c = console()
    c.print(
        f"[bold]{_esc(status.name)}[/] ({status.provider}, {status.region}, {status.instance_type or '-'})"
        + (" [dim]current[/]" if current else "")
    )
    rows = []
    for ns in status.nodes:
        n = ns.node
        up = duration(now - ns.launched_at) if ns.launched_at and ns.state in ("pending", "running") else "-"
        rows.append(
            [
                n.name,
                n.role,
                n.instance_id or "-",
                ns.zone or "-",
                ns.state,
                n.private_ip,
                f"{n.ssh_user}@{n.ssh_host}:{n.ssh_port}",
                str(n.slots),
                up,
            ]
        )
    if status.nodes:
        fitted_table(("NODE", "ROLE", "INSTANCE", "AZ", "STATE", "ADDRESS", "SSH", "SLOTS", "UPTIME"), rows)
    hourly, so_far = status.hourly_usd, status.cost_so_far(now)
    c.print(f"cost: {money(hourly)}/hour now, {money(so_far)} so far (built-in on-demand prices; not a bill)")
    for line in status.other:
        c.print(f"  left without nodes: {_esc(line)}")
    for note in notes:
        c.print(f"[yellow]note:[/] {_esc(note)}")


def cluster_view(view: ClusterView) -> None:
    """`status`: the cluster's nodes (as the record, or the cloud, has them), then what is lost, autostop,
    the node runtime, and the jobs on it."""
    if view.nodes is not None:
        node_table(view.nodes, current=view.current)
    elif view.cloud is not None:
        cluster_status(view.cloud, view.now, current=view.current, notes=view.notes)
    for x in view.lost:
        if x.disks_kept:  # repair keeps it unless named
            warn(f"not running: {x.node.name} ({x.node.private_ip}): {x.why}; its disks are kept")
        else:
            warn(f"lost: {x.node.name} ({x.node.private_ip}): {x.why}; `clusterctl repair` replaces it")
    c = console()
    for line in view.stopped.lines() if view.stopped is not None else ():
        c.print(_esc(line))
    for line in view.autostop:
        c.print(_esc(line))
    if view.runtime is not None:
        c.print(_esc(view.runtime))
    if view.training is not None:
        t = view.training
        if t.status is None:
            warn(f"training job {t.job.job}: {t.error}")
        else:
            train_status(t.job, t.status, t.hourly_usd)
    if view.launches is not None:
        if view.launches.error:
            warn(f"launch jobs: {view.launches.error}")
        for line in view.launches.lines:
            c.print(_esc(line))


def gc_table(scan: Scan, now: float) -> None:
    """`gc`: one row per cluster found (age, owner, record here, what happens to it), then each resource of the
    ones to remove."""
    picked, young = {id(c) for c in scan.chosen}, {id(c) for c in scan.young}  # per identity: names may repeat
    rows = []
    for c in scan.found:
        nodes = sum(f.kind in ("instance", "namespace") for f in c.found)
        rows.append(
            [
                _esc(c.name),
                c.where,
                duration(now - c.created_at) if c.created_at else "?",
                _esc(c.owner or "?"),
                c.record or "none",
                str(nodes),
                str(len(c.found)),
                "remove"
                if id(c) in picked
                else ("kept (no record here, young: --older-than)" if c.mine else "kept (another owner's, young)")
                if id(c) in young
                else "kept (younger)"
                if c.mine
                else "kept (another owner's: --force)",
            ]
        )
    fitted_table(("CLUSTER", "WHERE", "AGE", "OWNER", "RECORD HERE", "NODES", "RESOURCES", ""), rows, prose=("",))
    for c in scan.chosen:
        for f in c.found:
            info(
                f"  {c.name}: {f.kind} {f.id}"
                + (f" ({f.state})" if f.state else "")
                + (f", {duration(now - f.created_at)} old" if f.created_at else "")
            )


def jobs_table(found: Sequence[Job], now: float) -> None:
    """`jobs`: one row per detached job, newest first."""
    import time as _time

    if not found:
        info("no detached jobs on these nodes")
        return
    rows = [
        [
            j.id,
            _esc(j.name),
            j.kind,
            j.state,
            _time.strftime("%Y-%m-%d %H:%M", _time.localtime(j.started)) if j.started is not None else "-",
            duration(j.duration(now)),
            str(j.nodes or len(j.hosts)),
            "-" if j.exit_status is None else str(j.exit_status),
        ]
        for j in found
    ]
    fitted_table(("ID", "NAME", "KIND", "STATE", "STARTED", "DURATION", "NODES", "EXIT"), rows)


def node_table(cluster: Cluster, current: bool = False) -> None:
    console().print(
        f"[bold]{_esc(cluster.name)}[/] ({cluster.provider}, {cluster.region}, {cluster.instance_type})"
        + (" [dim]current[/]" if current else "")
    )
    fitted_table(
        ("NODE", "ROLE", "ADDRESS", "SSH", "SLOTS"),
        [
            [n.name, n.role, n.private_ip, f"{n.ssh_user}@{n.ssh_host}:{n.ssh_port}", str(n.slots)]
            for n in cluster.nodes
        ],
    )


def ladder_table(ladder: Ladder) -> None:
    """The rungs, each node alone, the verdict. +-: half the 95% interval of the mean (what is judged);
    the batch spread (1.96 sd of single batches, Horovod's +-) is shown apart, labelled as such."""
    from clusterctl.workloads.bench.verdict import SLOW_NODE

    judged = {(c.kind, c.np): c.status for c in ladder.checks} if ladder.judged else {}

    def figure(value: float | None, conf: float, kind: str, np_: int) -> str:
        if value is None:
            return "-"
        mark = judged.get((kind, np_))
        return f"{value:.1%} +- {conf:.1%}" + (f" {mark}" if mark else "")

    iters = sorted({r.iters for r in ladder.rungs})
    columns = ("processes", "nodes", "img/s", "batch spread", "speedup", "efficiency 1->N", "per process vs 1 node")
    fitted_table(
        [(col, "right") for col in (*columns, "batches")],
        [
            [
                str(r.np),
                str(r.nodes),
                f"{r.img_per_sec:.1f} +- {r.conf:.1f}",
                f"+- {r.spread:.1f}",
                f"{r.speedup:.2f}x",
                figure(r.efficiency, r.efficiency_conf, "efficiency", r.np) if r.np != ladder.rungs[0].np else "-",
                figure(r.node_scaling, r.node_scaling_conf, "node_scaling", r.np),
                f"{r.iters} {r.stop}".strip(),  # how many, and why no more (node/bench_stop.py)
            ]
            for r in ladder.rungs
        ],
        title=f"Synthetic {ladder.model} ladder (batch {ladder.batch_size}/process)",
        boxed=True,
        caption=(
            f"+-: 95% confidence interval of the mean over {'/'.join(map(str, iters))} timed batches (judged); "
            "batch spread: 1.96 sd of single batches (not judged)"
        ),
    )
    if ladder.alone:
        fitted_table(
            [
                "node",
                *(
                    (col, "right")
                    for col in ("processes", "img/s per process", "batch spread", "vs the others' median")
                ),
            ],
            [
                [
                    _esc(a.node + (f" ({a.hostname})" if a.hostname else "")),
                    str(a.np),
                    f"{a.per_proc:.1f} +- {a.conf:.1f}",
                    f"+- {a.spread:.1f}",
                    "-" if a.vs_others is None else f"{a.vs_others:.1%} +- {a.vs_others_conf:.1%} {a.status}",
                ]
                for a in ladder.alone
            ],
            title="each node alone, all at once: img/s per process",
            boxed=True,
            caption=f"slow: under {SLOW_NODE:.0%} of the median of the other nodes, the whole interval",
        )
    c = console()
    style = (
        ("green" if ladder.passed else "yellow" if ladder.status == "INCONCLUSIVE" else "red")
        if ladder.judged
        else "yellow"
    )
    c.print(f"[{style}]{_esc(ladder.verdict)}[/]")
    c.print(f"results: {_esc(ladder.results_dir)}/results.json, scaling.png, rung logs")


# ---- the doctor --------------------------------------------------------------------------------------
def doctor_table(report: DoctorReport) -> None:
    marks = {"ok": "[green]ok[/]", "fail": "[bold red]FAIL[/]", "n/a": "[dim]n/a[/]"}
    rows = [
        [_esc(n.host + (f" ({n.name})" if n.name else "")), *(marks[n.cells[c].status] for c in report.checks)]
        for n in report.nodes
    ]
    fitted_table(("node", *report.checks), rows, title="clusterctl doctor", boxed=True)
    c = console()
    if report.fabric is not None:
        f = report.fabric
        c.print(f"fabric: measured with {_esc(f.tool)}: {_esc(f.tool_why)}")
        if f.network:
            c.print(_esc(f.network))
        if f.nccl is not None:  # all_reduce_perf times each size many times; no spread to print
            c.print(
                f"fabric: all_reduce_perf avg bus bandwidth {f.nccl.avg_busbw_gbyte:.2f} GB/s over "
                f"{len(f.nccl.rows)} sizes, {f.nccl.peak_busbw_gbyte:.2f} GB/s at the largest"
            )
        timed_alone = f.tool != "nccl-tests"  # our own allreduce: a spread over its timed runs

        def spread(a: Allreduce) -> str:
            return f" +- {a.conf:.2f}" if timed_alone else ""

        c.print(
            "fabric: cluster allreduce "
            + (
                f"{f.cluster.busbw_gbit:.2f}{spread(f.cluster)} Gbit/s busbw"
                if not f.cluster.error
                else f"failed: {_esc(f.cluster.error)}"
            )
        )
        for p in f.pairs:
            c.print(
                f"fabric: pair {_esc(' <-> '.join(p.hosts))}: "
                + (f"{p.busbw_gbit:.2f}{spread(p)} Gbit/s" if not p.error else f"failed: {_esc(p.error)}")
            )
        c.print(f"fabric: judged against {_esc(f.reference)}")
    for line in report.failures():
        c.print(f"[red]FAIL[/] {_esc(line)}")
    c.print("[green]all checks passed[/]" if report.ok else f"[red]{len(report.failures())} check(s) failed[/]")


def sync_table(report: SyncReport) -> None:
    """The final table: node, bytes, seconds, MB/s, verified; and one summary line."""
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("NODE", "left"),
        ("BYTES", "right"),
        ("SECONDS", "right"),
        ("MB/S", "right"),
        ("VERIFIED", "left"),
    )
    rows = [
        [
            _esc(o.host),
            f"{o.bytes:,}",
            f"{o.seconds:.1f}",
            f"{o.bytes / o.seconds / 1e6:.1f}" if o.seconds > 0 and o.bytes else "-",
            "yes" if o.verified else _esc(f"no: {o.status}: {o.detail}"),
        ]
        for o in report.outcomes
    ]
    fitted_table(columns, rows, prose=("VERIFIED",))
    ok = sum(1 for o in report.outcomes if o.verified)
    style = "green" if ok == len(report.outcomes) else "red"
    console(stderr=True).print(
        f"[{style}]{ok} of {len(report.outcomes)} node(s) verified and marked complete: "
        f"{report.files} file(s), {report.total_bytes:,} bytes, {report.strategy}, "
        f"{report.seconds:.1f}s[/]"
    )


# ---- playbooks ---------------------------------------------------------------------------------------
def play_summary(results: Sequence[StepResult]) -> None:
    c = console()
    for r in results:
        mark = "[dim]skip[/]" if r.skipped else ("[green]ok[/]" if r.ok else "[bold red]FAIL[/]")
        c.print(f"{mark:>6} {_esc(r.step.name)} ({r.step.kind}): {_esc(r.detail)}")
    failed = [r for r in results if not r.ok]
    c.print("[green]playbook finished[/]" if not failed else f"[red]{len(failed)} step(s) failed[/]")


# ---- sweeps --------------------------------------------------------------------------------------------
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


# ---- training ----------------------------------------------------------------------------------------
def train_eval(result: EvalResult) -> None:
    """`clusterctl eval`: the recipe's evaluation line, top-1/top-5 in percent."""
    row = [
        str(result.step),
        f"{result.epoch:.1f}",
        f"{result.top1:.2f}%",
        f"{result.top5:.2f}%",
        f"{result.loss:.3f}",
        str(result.examples),
        _esc(result.checkpoint.rsplit("/", 1)[-1] or "-"),
        _esc(result.time or "-"),
    ]
    fitted_table(("STEP", "EPOCH", "TOP-1", "TOP-5", "LOSS", "IMAGES", "CHECKPOINT", "TIME (UTC)"), [row])


def train_status(job: TrainJob, st: TrainStatus, dollars_per_hour: float | None) -> None:
    """The training job under `status`: state, step, epoch, img/s, loss, elapsed, ETA and its cost."""

    c = console()
    c.print(
        f"[bold]training[/] {_esc(job.job)}: {st.state}"
        + (f" ({_esc(st.reason)})" if st.reason else "")
        + (f", restarted {st.restarts}x" if st.restarts else "")
    )
    if st.stop_step:
        c.print(
            f"  step {st.step}/{st.stop_step}  epoch {st.epoch:.2f}/{st.epochs:g}  "
            f"{'-' if st.img_per_sec is None else f'{st.img_per_sec:,.1f}'} img/s  "
            f"loss {'-' if st.loss is None else f'{st.loss:.4f}'}  lr {'-' if st.lr is None else f'{st.lr:.6f}'}  "
            f"{st.size} process(es)"
        )
    cost = None if dollars_per_hour is None else st.cost_to_finish(dollars_per_hour)
    c.print(
        f"  elapsed {duration(st.elapsed_s)} (all runs {duration(st.total_elapsed_s)})  "
        f"ETA {duration(st.eta_s)}  cost to finish {money(cost)}"
    )
    if st.resized:
        c.print(f"  elastic: {_esc(st.resized)}")
    if st.last_checkpoint is not None:
        c.print(f"  last checkpoint: step {st.last_checkpoint.step} ({_esc(st.last_checkpoint.path)})")
    if st.result is not None:
        r = st.result
        c.print(f"  evaluation: top-1 {r.top1:.2f}%  top-5 {r.top5:.2f}%  at step {r.step} ({r.examples} images)")
    elif st.validation is not None:
        v = st.validation
        c.print(
            f"  validation during training: top-1 {v.top1:.2f}%  top-5 {v.top5:.2f}%  at epoch {v.epoch:g} "
            f"(step {v.step}, {v.examples} images)"
        )
