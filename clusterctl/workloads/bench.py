"""The synthetic scaling ladder: 1 process, one full node, every node; a verdict; a slow node named.

The recipe does this by hand: run the synthetic ResNet-50 script at 4, 8, then 32 GPUs, watch the
images/sec column, and eyeball whether 8 GPUs gave "a little less than double". Here every rung is a
real horovodrun launch on the leader (launch.py); the arithmetic below is pure and unit-tested.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from clusterctl import resources
from clusterctl.cluster import costs
from clusterctl.errors import ClusterctlError, ExitCode, UsageError
from clusterctl.hostsfile import HostsFile
from clusterctl.units import duration, money
from clusterctl.workloads import horovod, launch

DEFAULT_THRESHOLD = 0.90  # per process against one full node: the figure Horovod and the recipes report
SLOW_NODE = 0.80  # a node whose per-process img/s alone is below this share of the median node's is named
MIN_WARMUP = 10  # Horovod's reference benchmark warms up 10 steps; fewer times graph tracing and autotuning
MIN_ITERS = 3  # a spread needs a few timed batches


class BenchFailed(ClusterctlError):
    exit_code = ExitCode.REMOTE_FAILED


@dataclass(frozen=True)
class Rung:
    np: int
    nodes: int
    img_per_sec: float
    speedup: float  # over the 1-process rung (or the smallest rung)
    efficiency: float  # speedup / (np / np of the base rung)
    node_scaling: float | None  # per-process img/s / the full-node rung's per-process img/s; None on one node
    per_node: dict[str, float]
    seconds: float
    log: str  # file name of the raw log in the results folder
    conf: float = 0.0  # img/s: 1.96 standard deviations over the timed batches
    node_scaling_conf: float = 0.0  # the same for node_scaling, propagated from both rungs


@dataclass(frozen=True)
class NodeAlone:
    """One node's own rung (all its slots, no cross-node allreduce), run on every node at once."""

    node: str  # the node as the hosts file names it
    hostname: str
    np: int
    per_proc: float  # img/s per process
    conf: float  # per process, 1.96 sigma
    log: str = ""


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[Rung, ...]
    threshold: float
    passed: bool
    verdict: str
    slow_nodes: tuple[str, ...] = ()
    judged: bool = True  # False on local nodes: they share this machine's cores, so scaling means little
    model: str = ""
    batch_size: int = 0
    results_dir: str = ""
    status: str = ""  # PASS | FAIL | INCONCLUSIVE (the interval straddles the threshold)
    alone: tuple[NodeAlone, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


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


def _ratio_conf(a: float, ca: float, b: float, cb: float) -> tuple[float, float]:
    """a/b and its 1.96-sigma half-width, by first-order propagation of the two relative errors."""
    if a <= 0 or b <= 0:
        return 0.0, 0.0
    r = a / b
    return r, r * math.hypot(ca / a, cb / b)


def _status(value: float, conf: float, threshold: float) -> str:
    if value - conf >= threshold:
        return "PASS"
    if value + conf < threshold:
        return "FAIL"
    return "INCONCLUSIVE"


def analyze(
    runs: Sequence[tuple[int, int, horovod.BenchRun, float, str]], threshold: float, full_np: int | None = None
) -> Ladder:
    """runs: (np, nodes, parsed run, seconds, log name) per rung, ascending np; full_np: one full node's
    processes (default: the largest one-node rung).

    The verdict: every rung on more than one node is judged per process against the full-node rung,
    (img/s / np) / (full img/s / full np), with the 1.96-sigma interval of both propagated. PASS when every
    such interval lies at or above the threshold, FAIL when one lies wholly below it, INCONCLUSIVE when one
    straddles it. One node only: the last rung's efficiency over the first, the same way."""
    base_np, base_run = runs[0][0], runs[0][2]
    single = [r for r in runs if r[1] == 1]
    full = (
        next((r for r in runs if r[0] == full_np and r[1] == 1), None) if full_np else (single[-1] if single else None)
    )
    multi_node = any(r[1] > 1 for r in runs)
    if multi_node and full is None:
        raise ValueError("a ladder over several nodes needs a full-node rung to judge against")
    rungs = []
    for np_, nodes, run, seconds, log in runs:
        speedup = run.img_per_sec / base_run.img_per_sec if base_run.img_per_sec else 0.0
        efficiency = speedup / (np_ / base_np)
        scaling, scaling_conf = None, 0.0
        if nodes > 1 and full is not None:  # a multi-node ladder has its full-node rung: checked above
            fnp, frun = full[0], full[2]
            scaling, scaling_conf = _ratio_conf(
                run.img_per_sec / np_, run.conf / np_, frun.img_per_sec / fnp, frun.conf / fnp
            )
        rungs.append(
            Rung(
                np_,
                nodes,
                run.img_per_sec,
                speedup,
                efficiency,
                scaling,
                run.per_node(),
                seconds,
                log,
                run.conf,
                scaling_conf,
            )
        )
    multi = [(r, r.node_scaling) for r in rungs if r.node_scaling is not None]
    if multi and full is not None:
        judged = [(r, scaling, _status(scaling, r.node_scaling_conf, threshold)) for r, scaling in multi]
        status = (
            "FAIL"
            if any(s == "FAIL" for _, _, s in judged)
            else "INCONCLUSIVE"
            if any(s == "INCONCLUSIVE" for _, _, s in judged)
            else "PASS"
        )
        worst, worst_scaling = min(((r, scaling) for r, scaling, s in judged if s == status), key=lambda x: x[1])
        verdict = (
            f"{status}: at {worst.np} processes on {worst.nodes} nodes each process gives "
            f"{worst_scaling:.0%} +- {worst.node_scaling_conf:.0%} of a process on one full node "
            f"({full[0]} processes; threshold {threshold:.0%})"
        )
    else:
        last = rungs[-1]
        _, conf = _ratio_conf(last.img_per_sec, last.conf, base_run.img_per_sec, base_run.conf)
        conf /= last.np / base_np
        status = _status(last.efficiency, conf, threshold)
        verdict = (
            f"{status}: {last.np} processes give {last.efficiency:.0%} +- {conf:.0%} of "
            f"linear scaling over {base_np} (threshold {threshold:.0%})"
        )
    if status == "INCONCLUSIVE":
        verdict += ": the interval straddles the threshold; rerun with more --iters"
    return Ladder(tuple(rungs), threshold, status == "PASS", verdict, status=status)


def stragglers(alone: Sequence[NodeAlone]) -> tuple[str, ...]:
    """Nodes that are slow on their own: per-process img/s, even at the top of its interval, under
    SLOW_NODE x the median node's. Needs at least two nodes (one has nothing to differ from)."""
    if len(alone) < 2:
        return ()
    median = statistics.median(a.per_proc for a in alone)
    return tuple(a.node for a in alone if a.per_proc + a.conf < SLOW_NODE * median)


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
    model: str = "resnet50"
    batch_size: int = 32
    steps: int = 10  # per timed batch
    iters: int = 10  # timed batches
    warmup_steps: int = MIN_WARMUP
    mixed_precision: bool = False
    xla: bool = False
    input_only: bool = False
    threshold: float = DEFAULT_THRESHOLD
    timeout: float = 900.0  # per rung
    extra: list[str] = field(default_factory=list)

    def script_args(self, np: int) -> list[str]:
        args = [
            "--model",
            self.model,
            "--batch-size",
            str(self.batch_size),
            "--steps",
            str(self.steps),
            "--iters",
            str(self.iters),
            "--warmup-steps",
            str(self.warmup_steps),
            "--expect-size",
            str(np),
        ]
        if self.mixed_precision:
            args.append("--mixed-precision")
        if self.xla:
            args.append("--xla")
        if self.input_only:
            args.append("--input-only")
        return args + list(self.extra)


Event = Callable[[str, object], None]  # ("start", np) / ("line", text) / ("rung", Rung)


def run_ladder(
    inv,
    rungs: Sequence[int],
    opts: BenchOptions,
    out_root: Path,
    python: str | None = None,
    on_event: Event = lambda *_: None,
) -> Ladder:
    """Every rung for real on the cluster; the results folder written as it goes."""
    from clusterctl.remote.ssh import SshPool

    out_dir = out_root / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=False)
    python = python or launch.node_python(inv.cluster)
    env = launch.job_env(inv.cluster, python)
    gpus = horovod.gpus_per_node(inv.cluster)  # 0: no GPUs to prove (local nodes, CPU types, hosts files)
    runs = []
    alone: list[NodeAlone] = []
    full_np = full_node_np(inv.hosts)
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        job = launch.new_job(pool, leader, "bench")
        script = f"{job.dir}/bench_synthetic.py"
        try:
            launch.stage(
                pool,
                inv.targets,
                job,
                resources.node_script("bench_synthetic.py"),
                inv.hosts,
            )
            for np_ in rungs:
                hosts = launch.rung_hosts(inv.hosts, np_)
                pool.put([leader], {f"{job.dir}/hosts": (hosts.render().encode(), 0o644)})
                on_event("start", np_)
                cmd = launch.leader_command(job, np_, [python, script, *opts.script_args(np_)], python, env)
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
                partial = analyze(runs, opts.threshold, full_np)
                on_event("rung", partial.rungs[-1])
            if len(inv.targets) > 1:
                alone = _nodes_alone(pool, inv, job, python, env, script, opts, out_dir, gpus, on_event)
        finally:
            try:
                launch.kill_job(pool, inv.targets, job)
                launch.remove_job(pool, inv.targets, job)
            except KeyboardInterrupt:
                pass
    ladder = analyze(runs, opts.threshold, full_np)
    slow = stragglers(alone)
    verdict = ladder.verdict + (f"; slow node(s) on their own: {', '.join(slow)}" if slow else "")
    judged = inv.cluster is None or not inv.cluster.shares_this_machine
    if not judged:
        verdict = f"not judged: local nodes share this machine's {os.cpu_count()} cores ({verdict})"
    # A straggler names where to look; the verdict stays the scaling's (a slow node shows there, as lost img/s).
    ladder = Ladder(
        ladder.rungs,
        ladder.threshold,
        ladder.passed,
        verdict,
        slow,
        judged,
        opts.model,
        opts.batch_size,
        str(out_dir),
        ladder.status,
        tuple(alone),
    )
    (out_dir / "results.json").write_text(ladder.to_json() + "\n")
    plot(ladder, out_dir / "scaling.png")
    return ladder


def _checked_run(result, np_: int, what: str, log: Path, timeout: float, gpus: int) -> horovod.BenchRun:
    """The parsed run of one launch, or BenchFailed saying why not."""
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
    gpu_faults = horovod.device_problems(run.devices, run.size, gpus)
    if gpu_faults:
        raise BenchFailed(
            f"{what} did not run one process per GPU: " + "; ".join(gpu_faults),
            f"see {log}; `clusterctl doctor` checks the GPUs and versions of every node",
        )
    return run


def _nodes_alone(pool, inv, job, python, env, script, opts, out_dir: Path, gpus: int, on_event) -> list[NodeAlone]:
    """Every node runs its own slots at once, each on localhost: no allreduce crosses nodes, so a slow node
    shows as itself instead of holding every rank back to its pace (which a joint rung cannot tell apart)."""
    slots = {t.label: e.slots for t, e in zip(inv.targets, inv.hosts.entries)}
    on_event("start", "every node alone")

    def command(t) -> str:
        n = slots[t.label]
        return launch.leader_command(
            job, n, [python, script, *opts.script_args(n)], python, env, hosts=f"localhost:{n}"
        )

    report = pool.run(inv.targets, command, timeout=opts.timeout)
    launch.kill_job(pool, inv.targets, job)
    alone = []
    for i, r in enumerate(report):
        log = f"alone-node{i}.log"
        (out_dir / log).write_text(r.stdout + r.stderr)
        run = _checked_run(r, slots[r.host], f"{r.host} on its own", out_dir / log, opts.timeout, gpus)
        alone.append(
            NodeAlone(
                r.host,
                run.hosts[0].name if run.hosts else "",
                run.size,
                run.img_per_sec / run.size,
                run.conf / run.size,
                log,
            )
        )
    on_event("alone", tuple(alone))
    return alone


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
    ax.plot(nps, ips, "o-", color="tab:blue", label="measured img/s")
    ax.set_xlabel("processes (GPUs)")
    ax.set_ylabel("images / second")
    ax.set_xticks(nps)
    ax2 = ax.twinx()
    ax2.plot(nps, [r.efficiency * 100 for r in ladder.rungs], "s:", color="tab:orange", label="efficiency %")
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
