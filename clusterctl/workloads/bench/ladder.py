"""The synthetic scaling ladder: 1 process, one full node, every node, run for real; its verdict is
bench/verdict.py's.

The recipe does this by hand: run the synthetic ResNet-50 script at 4, 8, then 32 GPUs, watch the
images/sec column, and eyeball whether 8 GPUs gave "a little less than double". Here every rung is a
real horovodrun launch on the leader (launch.py).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from clusterctl import providers
from clusterctl.cluster import costs
from clusterctl.errors import ClusterctlError, ExitCode, UsageError, within
from clusterctl.hostsfile import HostsFile
from clusterctl.node import nccl_report
from clusterctl.node.bench_stop import Reference, references_text
from clusterctl.remote import jobfolder, nodepkg
from clusterctl.types import OnStep, Step, no_steps
from clusterctl.units import duration, money
from clusterctl.workloads import horovod, launch
from clusterctl.workloads.bench import stats
from clusterctl.workloads.bench.verdict import (
    DEFAULT_THRESHOLD,
    Ladder,
    NodeAlone,
    Run,
    analyze,
    judge_nodes,
    rate_of,
    references,
    stragglers,
)
from clusterctl.workloads.train import config as train_config
from clusterctl.workloads.train.config import TrainConfig
from clusterctl.workloads.train.options import PRECISIONS

if TYPE_CHECKING:
    from clusterctl.cluster.inventory import Inventory
    from clusterctl.remote.jobfolder import JobFolder
    from clusterctl.remote.ssh import SshPool
    from clusterctl.remote.targets import SshTarget
    from clusterctl.types import Cluster, HostResult

MIN_WARMUP = 10  # Horovod's reference benchmark warms up 10 steps; fewer times graph tracing and autotuning
MIN_ITERS = 3  # a mean's interval needs a few timed batches (its t-quantile at 2 degrees of freedom is 4.3)
# Seconds of timed batches after which a rung stops undecided: at about 2 s per batch (ResNet-50 at 256 images
# per GPU, 10 steps, an assumed figure) 150 batches, twice what the simulated ladders at 2%/3% noise take
# (tests/workloads/test_bench_sequential.py); a 3-rung ladder then times at most 15 minutes.
MAX_SECONDS = 300.0
PROGRAM = "bench"  # the node package's synthetic benchmark (node/bench.py)


class BenchFailed(ClusterctlError):
    exit_code = ExitCode.REMOTE_FAILED


def full_node_np(hosts: HostsFile) -> int:
    """Processes of one full node: the leader's slots (rungs fill the leader first)."""
    return hosts.entries[0].slots


def default_ladder(hosts: HostsFile) -> list[int]:
    return sorted({1, full_node_np(hosts), hosts.total_slots})


def parse_ladder(text: str, hosts: HostsFile) -> list[int]:
    """The user's rungs plus one full node: every multi-node rung is judged per process against it."""
    try:
        rungs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--ladder takes process counts like 1,8,16, not {text!r}") from None
    if not rungs or rungs[0] < 1 or rungs[-1] > hosts.total_slots:
        raise UsageError(f"--ladder rungs must be 1..{hosts.total_slots} (the cluster's slots), not {text!r}")
    return sorted({*rungs, full_node_np(hosts)})


def run_config(run: horovod.BenchRun, hosts: HostsFile, rungs: Sequence[int]) -> dict[str, object]:
    """What the ladder ran, as the benchmark itself reported it on its start line (not what was asked)."""
    s = run.start
    precision = s.get("precision") or ("mixed" if s.get("mixed_precision") == "1" else "float32")
    return {
        "model": s.get("model", run.model),
        "precision": precision,
        "batch_per_process": int(s.get("batch", run.batch)),
        "xla": s.get("xla") == "1",
        "compression": s.get("compression", "none"),  # a template that names none sends gradients as they are
        "warmup_steps": int(s.get("warmup_steps", 0)),
        "steps_per_batch": int(s.get("steps", 0)),
        "iters": int(s.get("iters", len(run.intervals))),  # the least per rung (each rung's own count: its Rung)
        "max_seconds": float(s.get("max_seconds", 0)),  # of timed batches per rung; 0: exactly iters
        "gpus_per_process": int(s.get("gpus", 0)),
        "nodes": [{"node": e.host, "slots": e.slots} for e in hosts.entries],
        "processes": list(rungs),
        "start_line": dict(s),
    }


def cost_lines(ladder: Ladder, per_hour: float | None, model: str) -> list[str]:
    """What the ladder cost, and what ImageNet costs at the top rung's rate: a lower bound for the tiny
    model, whose img/s says nothing of ResNet-50's."""
    seconds = sum(r.seconds for r in ladder.rungs)
    lines = [
        f"cost: this ladder ran {duration(seconds)}"
        + (
            f" on a {money(per_hour)}/hour cluster: about {money(costs.run_cost(seconds, per_hour))}"
            if per_hour is not None
            else " (price unknown: a hosts file, not a cluster clusterctl made)"
        )
    ]
    top = max(ladder.rungs, key=lambda r: r.np, default=None)
    if top is None or top.img_per_sec <= 0:
        return lines
    ninety = money(costs.run_cost(90 * costs.IMAGENET_TRAIN_IMAGES / top.img_per_sec, per_hour))
    if model == "resnet50":
        lines.append(f"cost: {costs.epoch_line(top.img_per_sec, per_hour)}; 90 epochs about {ninety}")
    else:
        lines.append(
            f"cost: lower bound only: the {model} model at {top.img_per_sec:,.0f} img/s would train 90 "
            f"ImageNet epochs in {duration(90 * costs.IMAGENET_TRAIN_IMAGES / top.img_per_sec)} "
            f"({ninety}); ResNet-50 is far slower (`--model resnet50` measures it)"
        )
    return lines


@dataclass
class BenchOptions:
    """None: the GPU type's configuration (train/config.py), the one `train` runs; `resolved` fills it in."""

    model: str = "resnet50"
    batch_size: int | None = None
    steps: int = 10  # per timed batch
    iters: int = 10  # timed batches: the least per rung; exactly this many with max_seconds 0
    max_seconds: float = MAX_SECONDS  # of timed batches per rung, after which it stops undecided (bench_stop.py)
    warmup_steps: int = MIN_WARMUP
    mixed_precision: bool = False  # --precision mixed
    xla: bool | None = None
    input_only: bool = False
    threshold: float = DEFAULT_THRESHOLD
    timeout: float = 900.0  # per rung
    extra: list[str] = field(default_factory=list)
    precision: str | None = None  # fp32 | float16 | bfloat16 | mixed | auto
    fp16_allreduce: bool | None = None
    allow_socket_transport: bool = False  # on an EFA type, go on when NCCL did not choose EFA

    def config(self, cluster: Cluster | None) -> TrainConfig:
        """The configuration this ladder measures on `cluster` (a rate is stored under its key)."""
        return train_config.choose(
            train_config.gpu_type_of(cluster),
            model=self.model,
            precision=self.precision or ("mixed" if self.mixed_precision else None),
            batch_size=self.batch_size,
            xla=self.xla,
            fp16_allreduce=self.fp16_allreduce,
        )

    def resolved(self, cluster: Cluster | None) -> "BenchOptions":
        """These options with the configuration's fields filled in (idempotent)."""
        c = self.config(cluster)
        return replace(
            self,
            batch_size=c.batch_size,
            precision=c.precision,
            mixed_precision=False,
            xla=c.xla,
            fp16_allreduce=c.fp16_allreduce,
        )

    def __post_init__(self) -> None:
        """The same checks for `clusterctl bench` and a playbook's bench step, one per option."""
        if self.model not in ("resnet50", "tiny"):
            raise UsageError(f"unknown model {self.model!r}", "use resnet50 or tiny")
        within("--batch-size", self.batch_size, 1)
        within("--steps", self.steps, 1)
        within("--iters", self.iters, MIN_ITERS)
        within("--warmup-steps", self.warmup_steps, MIN_WARMUP)
        within("--threshold", self.threshold, above=0, high=1)
        within("--timeout", self.timeout, above=0)
        within("--max-seconds", self.max_seconds, 0)
        if self.max_seconds >= self.timeout:
            raise UsageError(
                f"--max-seconds {self.max_seconds:g} leaves no time of --timeout {self.timeout:g} for each rung's "
                "launch and warm-up",
                f"give --max-seconds below --timeout, e.g. --timeout {math.ceil(self.max_seconds * 2 / 60) * 60}",
            )
        if self.precision is not None and self.precision not in PRECISIONS:
            raise UsageError(f"unknown precision {self.precision!r}", f"use one of {', '.join(PRECISIONS)}")

    def stopping(self) -> str:
        """How many batches each rung times, in words (printed before the ladder starts)."""
        if not self.max_seconds:
            return f"each rung times {self.iters} batches (--max-seconds 0)"
        return (
            f"each rung times at least {self.iters} batches (--iters), then until its verdict is decided, at most "
            f"{self.max_seconds:g}s of batches (--max-seconds)"
        )

    def script_args(self, np: int, against: Sequence[Reference] = (), fixed: bool = False) -> list[str]:
        """The node benchmark's arguments for a rung of np processes judged against `against` (the rungs before
        it: bench_verdict.references); fixed: exactly --iters batches (each node alone)."""
        args = [
            "--model",
            self.model,
            "--batch-size",
            str(self.batch_size or train_config.DEFAULTS[train_config.UNKNOWN].batch_size),
            "--steps",
            str(self.steps),
            "--iters",
            str(self.iters),
            "--max-seconds",
            "0" if fixed else f"{self.max_seconds:g}",
            "--threshold",
            repr(self.threshold),
            *references_text(against),
            "--warmup-steps",
            str(self.warmup_steps),
            "--expect-size",
            str(np),
        ]
        if self.precision:
            args += ["--precision", self.precision]
        if self.mixed_precision:
            args.append("--mixed-precision")
        if self.xla:
            args.append("--xla")
        if self.fp16_allreduce:
            args.append("--fp16-allreduce")
        if self.input_only:
            args.append("--input-only")
        return args + list(self.extra)


Event = Callable[[str, object], None]  # ("line", text) / ("rung", Rung) / ("alone", NodeAlone tuple)


def run_ladder(
    inv: Inventory,
    rungs: Sequence[int],
    opts: BenchOptions,
    out_root: Path,
    python: str | None = None,
    on_event: Event = lambda *_: None,
    on_step: OnStep = no_steps,
) -> Ladder:
    """Every rung for real on the cluster; the results folder written as it goes. on_step: staging, each rung
    and the nodes alone as steps; on_event: what they found."""
    from clusterctl.remote.ssh import SshPool

    opts = opts.resolved(inv.cluster)  # the GPU type's configuration, the one `train` runs
    config = opts.config(inv.cluster)
    out_dir = out_root / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=False)
    python = python or jobfolder.node_python(inv.cluster)
    # as `train` runs: the GPU type's TensorFlow settings and Horovod's fusion
    env = {
        **launch.job_env(inv.cluster, python, opts.allow_socket_transport),
        **train_config.gpu_env(config),
        **train_config.horovod_env(config),
    }
    gpus = horovod.gpus_per_node(inv.cluster)  # 0: no GPUs to prove (local nodes, CPU types, hosts files)
    runs: list[Run] = []
    alone: list[NodeAlone] = []
    full_np = full_node_np(inv.hosts)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        job = jobfolder.new_job(pool, leader, "bench")
        pkg = nodepkg.package()
        program = [pkg.at(job.home), PROGRAM]  # the node package's benchmark, on every node
        try:
            staging = f"staging the benchmark on {len(inv.targets)} node(s)"
            on_step(Step(staging))
            launch.stage(pool, inv.targets, job, {}, inv.hosts, package=pkg)
            on_step(Step(staging, "end"))
            for np_ in rungs:
                hosts = launch.rung_hosts(inv.hosts, np_)
                pool.put([leader], {f"{job.dir}/hosts": (hosts.render().encode(), 0o644)})
                on_step(Step(f"rung: {np_} process(es)"))
                against = references(runs, np_, len(hosts.entries), full_np)  # what its stopping rule judges
                args = opts.script_args(np_, against)
                cmd = launch.leader_command(job, np_, [python, *program, *args], python, env)
                start = time.monotonic()
                result = launch.run_on_leader(
                    pool, leader, cmd, opts.timeout, lambda h, s, line: on_event("line", line)
                )
                seconds = time.monotonic() - start
                log = f"rung-np{np_}.log"
                (out_dir / log).write_text(result.stdout + result.stderr)
                launch.kill_job(pool, inv.targets, job)  # nothing of a rung outlives it
                run = _checked_run(result, np_, f"rung of {np_} processes", out_dir / log, opts.timeout, gpus)
                runs.append((np_, len(hosts.entries), run, seconds, log))
                partial = analyze(runs, opts.threshold, full_np, opts.timeout)
                on_step(Step(f"rung: {np_} process(es)", "end"))
                on_event("rung", partial.rungs[-1])
            if len(inv.targets) > 1:
                alone = _nodes_alone(pool, inv, job, python, env, program, opts, out_dir, gpus, on_event, on_step)
        finally:
            try:
                launch.kill_job(pool, inv.targets, job)
                jobfolder.remove_job(pool, inv.targets, job)
            except KeyboardInterrupt:
                pass
    ladder = analyze(runs, opts.threshold, full_np, opts.timeout)
    slow = stragglers(alone)
    verdict = ladder.verdict + (f"; slow node(s) on their own: {', '.join(slow)}" if slow else "")
    judged = inv.cluster is None or not providers.shares_this_machine(inv.cluster)
    if not judged:
        verdict = f"not judged: local nodes share this machine's {os.cpu_count()} cores ({verdict})"
    # A straggler names where to look; the verdict stays the scaling's (a slow node shows there, as lost img/s).
    ladder = replace(
        ladder,
        verdict=verdict,
        slow_nodes=slow,
        judged=judged,
        model=opts.model,
        batch_size=opts.batch_size or 0,
        results_dir=str(out_dir),
        alone=tuple(alone),
        config=config.to_dict(),
        ran=run_config(runs[0][2], inv.hosts, rungs),
    )
    (out_dir / "results.json").write_text(ladder.to_json() + "\n")
    plot(ladder, out_dir / "scaling.png")
    return ladder


def _checked_run(result: HostResult, np_: int, what: str, log: Path, timeout: float, gpus: int) -> horovod.BenchRun:
    """The parsed run of one launch, or BenchFailed saying why not."""
    if wrong_network := nccl_report.said(result.stdout)[1]:  # NCCL did not choose the nodes' EFA
        raise BenchFailed(wrong_network, f"see {log}")
    if result.timed_out:
        raise BenchFailed(
            f"{what} produced no result within {timeout:.0f}s", f"see {log}; raise --timeout for big models"
        )
    try:
        run = horovod.parse_bench_output(result.stdout)
    except ValueError as exc:
        raise BenchFailed(f"{what} failed (exit {result.exit_code}): {exc}", f"see {log}") from None
    if run.size != np_:
        raise BenchFailed(f"Horovod reported size {run.size}, but {np_} slots were asked for", f"see {log}")
    if len(run.intervals) < 2:  # the mean's interval needs a variance
        raise BenchFailed(f"{what} reported {len(run.intervals)} timed batch(es), not the --iters asked", f"see {log}")
    gpu_faults = horovod.device_problems(run.devices, run.size, gpus)
    if gpu_faults:
        raise BenchFailed(
            f"{what} did not run one process per GPU: " + "; ".join(gpu_faults),
            f"see {log}; `clusterctl doctor` checks the GPUs and versions of every node",
        )
    return run


def _nodes_alone(
    pool: SshPool,
    inv: Inventory,
    job: JobFolder,
    python: str,
    env: Mapping[str, str],
    program: Sequence[str],
    opts: BenchOptions,
    out_dir: Path,
    gpus: int,
    on_event: Event,
    on_step: OnStep,
) -> list[NodeAlone]:
    """Every node runs its own slots at once, each on localhost: no allreduce crosses nodes, so a slow node
    shows as itself instead of holding every rank back to its pace (which a joint rung cannot tell apart)."""
    slots = {t.label: e.slots for t, e in zip(inv.targets, inv.hosts.entries)}
    step = f"every node alone: {len(inv.targets)} node(s) at once"
    on_step(Step(step))

    def command(t: SshTarget) -> str:
        n = slots[t.label]
        return launch.leader_command(
            job, n, [python, *program, *opts.script_args(n, fixed=True)], python, env, hosts=f"localhost:{n}"
        )

    report = pool.run(inv.targets, command, timeout=opts.timeout)
    launch.kill_job(pool, inv.targets, job)
    on_step(Step(step, "end"))
    alone, rates = [], []
    for i, r in enumerate(report):
        log = f"alone-node{i}.log"
        (out_dir / log).write_text(r.stdout + r.stderr)
        run = _checked_run(r, slots[r.host], f"{r.host} on its own", out_dir / log, opts.timeout, gpus)
        rate = rate_of(run).times(1 / run.size)
        rates.append(rate)
        alone.append(
            NodeAlone(
                r.host,
                run.hosts[0].name if run.hosts else "",
                run.size,
                rate.value,
                rate.half_width(),
                log,
                stats.spread([i.img_per_sec / run.size for i in run.intervals]),
            )
        )
    judged = judge_nodes(alone, rates)
    on_event("alone", tuple(judged))
    return judged


def plot(ladder: Ladder, path: Path) -> None:
    """img/s and efficiency against processes, with the ideal line for reference (headless)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nps = [r.np for r in ladder.rungs]
    ips = [r.img_per_sec for r in ladder.rungs]
    base = ladder.rungs[0]
    ideal = [base.img_per_sec * n / base.np for n in nps]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    ax.plot(nps, ideal, "--", color="grey", label="ideal (linear)")
    ax.errorbar(
        nps, ips, yerr=[r.conf for r in ladder.rungs], fmt="o-", color="tab:blue", capsize=3, label="img/s (95% CI)"
    )
    ax.set_xlabel("processes (GPUs)")
    ax.set_ylabel("images / second")
    ax.set_xticks(nps)
    ax2 = ax.twinx()
    ax2.errorbar(
        nps,
        [r.efficiency * 100 for r in ladder.rungs],
        yerr=[r.efficiency_conf * 100 for r in ladder.rungs],
        fmt="s:",
        color="tab:orange",
        capsize=3,
        label="efficiency 1->N % (95% CI)",
    )
    ax2.axhline(ladder.threshold * 100, color="tab:red", linewidth=0.8, label="threshold")
    ax2.set_ylabel("scaling efficiency (%)")
    ax2.set_ylim(0, 110)
    lines = ax.get_legend_handles_labels()
    lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="upper left", fontsize=8)
    verdict = (ladder.status or ("PASS" if ladder.passed else "FAIL")) if ladder.judged else "not judged (local nodes)"
    ax.set_title(f"Synthetic {ladder.model} scaling: {verdict}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
