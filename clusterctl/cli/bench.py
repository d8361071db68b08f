"""`clusterctl bench`: the synthetic scaling ladder run, each rung as it ends, the ladder's table and what it cost."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from clusterctl.cli.display import _esc, console, fitted_table
from clusterctl.cli.shared import (
    CLUSTER,
    DEFAULT_SSH,
    HOSTS,
    LOGIN,
    Ssh,
    _resolve_hosts,
    _store,
    ssh_options,
)
from clusterctl.errors import ExitCode, UsageError
from clusterctl.node.nccl_report import ALLOW_FLAG as ALLOW_SOCKET

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.workloads.bench.verdict import Ladder

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
    from clusterctl.cli import display
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
        result = benchlib.run_ladder(inv, rungs, opts, out, python, BenchProgress(), step_line)
    ladder_table(result)
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


# ---- each rung as it ends, and the ladder's table ----------------------------------------------------------
class BenchProgress:
    """on_event of bench.run_ladder: the network NCCL chose, and a line per rung as it ends (the table comes at
    the end; the steps themselves are StepLine's)."""

    def __init__(self) -> None:
        self.network = ""  # rank 0's `network:` line, printed when it first appears or changes

    def __call__(self, kind: str, value: object) -> None:
        from clusterctl.node import nccl_report
        from clusterctl.node.bench_stop import WHY
        from clusterctl.workloads.bench.verdict import Rung

        c = console(stderr=True)
        if kind == "line" and isinstance(value, str):
            network = nccl_report.said(value)[0]
            if network and network != self.network:
                self.network = network
                c.print(f"  {_esc(network)}")
        elif kind == "rung" and isinstance(value, Rung):
            r = value
            c.print(
                f"  {r.np:>4} procs on {r.nodes} node(s): {r.img_per_sec:10.1f} +- {r.conf:.1f} img/s (95% CI), "
                f"speedup {r.speedup:5.2f}x, efficiency {r.efficiency:6.1%} +- {r.efficiency_conf:.1%} "
                f"({r.seconds:.1f}s); {r.iters} batches, stopped: {WHY.get(r.stop, r.stop or 'not said')}"
            )
