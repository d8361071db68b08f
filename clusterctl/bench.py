"""The synthetic scaling ladder: 1 process, one full node, every node; a verdict; a slow node named.

The recipe does this by hand: run the synthetic ResNet-50 script at 4, 8, then 32 GPUs, watch the
images/sec column, and eyeball whether 8 GPUs gave "a little less than double". Here every rung is a
real horovodrun launch on the leader (launch.py); the arithmetic below is pure and unit-tested.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from clusterctl import horovod, launch, resources
from clusterctl.errors import ClusterctlError, ExitCode, UsageError
from clusterctl.hostsfile import HostsFile

DEFAULT_THRESHOLD = 0.90  # per added node: the figure Horovod and the recipes report
SLOW_NODE = 0.80  # a node below this share of the median node is named


class BenchFailed(ClusterctlError):
    exit_code = ExitCode.REMOTE_FAILED


@dataclass(frozen=True)
class Rung:
    np: int
    nodes: int
    img_per_sec: float
    speedup: float  # over the 1-process rung (or the smallest rung)
    efficiency: float  # speedup / (np / np of the base rung)
    node_scaling: float | None  # img/s / (nodes x one-node img/s); None below two nodes
    per_node: dict[str, float]
    seconds: float
    log: str  # file name of the raw log in the results folder


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

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def default_ladder(hosts: HostsFile) -> list[int]:
    return sorted({1, hosts.entries[0].slots, hosts.total_slots})


def parse_ladder(text: str, hosts: HostsFile) -> list[int]:
    try:
        rungs = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--ladder takes process counts like 1,8,16, not {text!r}") from None
    if not rungs or rungs[0] < 1 or rungs[-1] > hosts.total_slots:
        raise UsageError(f"--ladder rungs must be 1..{hosts.total_slots} (the cluster's slots), not {text!r}")
    return rungs


def nodes_used(hosts: HostsFile, np: int) -> int:
    return len(launch.rung_hosts(hosts, np).entries)


def analyze(runs: Sequence[tuple[int, int, horovod.BenchRun, float, str]], threshold: float) -> Ladder:
    """runs: (np, nodes, parsed run, seconds, log name) per rung, ascending np."""
    base_np, base_ips = runs[0][0], runs[0][2].img_per_sec
    one_node = [r for r in runs if r[1] == 1]
    node_ips = one_node[-1][2].img_per_sec if one_node else None
    rungs = []
    for np_, nodes, run, seconds, log in runs:
        speedup = run.img_per_sec / base_ips if base_ips else 0.0
        efficiency = speedup / (np_ / base_np)
        node_scaling = run.img_per_sec / (nodes * node_ips) if nodes > 1 and node_ips else None
        rungs.append(Rung(np_, nodes, run.img_per_sec, speedup, efficiency, node_scaling, run.per_node(), seconds, log))
    multi = [r for r in rungs if r.node_scaling is not None]
    if multi:
        worst = min(multi, key=lambda r: r.node_scaling)
        passed = worst.node_scaling >= threshold
        verdict = (f"{'PASS' if passed else 'FAIL'}: {worst.nodes} nodes give {worst.node_scaling:.0%} of "
                   f"{worst.nodes}x one node's img/s (threshold {threshold:.0%} per added node)")
    else:
        last = rungs[-1]
        passed = last.efficiency >= threshold
        verdict = (f"{'PASS' if passed else 'FAIL'}: {last.np} processes give {last.efficiency:.0%} of "
                   f"linear scaling over {base_np} (threshold {threshold:.0%})")
    full = rungs[-1].per_node
    slow: tuple[str, ...] = ()
    if len(full) > 1:
        median = statistics.median(full.values())
        slow = tuple(n for n, v in full.items() if v < SLOW_NODE * median)
        if slow:
            verdict += f"; slow node(s): {', '.join(slow)}"
    return Ladder(tuple(rungs), threshold, passed, verdict, slow)


@dataclass
class BenchOptions:
    model: str = "resnet50"
    batch_size: int = 32
    steps: int = 20
    warmup_steps: int = 3
    mixed_precision: bool = False
    xla: bool = False
    threshold: float = DEFAULT_THRESHOLD
    timeout: float = 900.0  # per rung
    extra: list[str] = field(default_factory=list)

    def script_args(self, np: int) -> list[str]:
        args = ["--model", self.model, "--batch-size", str(self.batch_size), "--steps", str(self.steps),
                "--warmup-steps", str(self.warmup_steps), "--interval", str(max(1, self.steps // 2)),
                "--expect-size", str(np)]
        if self.mixed_precision:
            args.append("--mixed-precision")
        if self.xla:
            args.append("--xla")
        return args + list(self.extra)


Event = Callable[[str, object], None]  # ("start", np) / ("line", text) / ("rung", Rung)


def run_ladder(inv, rungs: Sequence[int], opts: BenchOptions, out_root: Path, python: str | None = None,
               on_event: Event = lambda *_: None) -> Ladder:
    """Every rung for real on the cluster; the results folder written as it goes."""
    from clusterctl.remote import SshPool

    out_dir = out_root / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=False)
    python = python or launch.node_python(inv.cluster)
    env = launch.job_env(inv.cluster, python)
    gpus = horovod.gpus_per_node(inv.cluster)  # 0: no GPUs to prove (local nodes, CPU types, hosts files)
    runs = []
    with SshPool(inv.settings) as pool:
        leader = inv.targets[0]
        job = launch.new_job(pool, leader, "bench")
        script = f"{job.dir}/bench_synthetic.py"
        try:
            launch.stage(pool, inv.targets, job, {"bench_synthetic.py": resources.template_bytes("bench_synthetic.py")},
                         inv.hosts)
            for np_ in rungs:
                hosts = launch.rung_hosts(inv.hosts, np_)
                pool.put([leader], {f"{job.dir}/hosts": (hosts.render().encode(), 0o644)})
                on_event("start", np_)
                cmd = launch.leader_command(job, np_, [python, script, *opts.script_args(np_)], python, env)
                start = time.monotonic()
                result = launch.run_on_leader(pool, leader, cmd, opts.timeout, lambda h, s, line: on_event("line", line))
                seconds = time.monotonic() - start
                log = f"rung-np{np_}.log"
                (out_dir / log).write_text(result.stdout + result.stderr)
                launch.kill_job(pool, inv.targets, job)  # nothing of a rung outlives it
                if result.timed_out:
                    raise BenchFailed(f"rung of {np_} processes produced no result within {opts.timeout:.0f}s",
                                      f"see {out_dir / log}; raise --timeout for big models")
                try:
                    run = horovod.parse_bench_output(result.stdout)
                except ValueError as exc:
                    raise BenchFailed(f"rung of {np_} processes failed (exit {result.exit_code}): {exc}",
                                      f"see {out_dir / log}") from None
                if run.size != np_:
                    raise BenchFailed(f"Horovod reported size {run.size}, but {np_} slots were asked for",
                                      f"see {out_dir / log}")
                gpu_faults = horovod.device_problems(run.devices, run.size, gpus)
                if gpu_faults:
                    raise BenchFailed(f"rung of {np_} processes did not run one process per GPU: "
                                      + "; ".join(gpu_faults), f"see {out_dir / log}; `clusterctl doctor` checks "
                                      "the GPUs and versions of every node")
                runs.append((np_, len(hosts.entries), run, seconds, log))
                partial = analyze(runs, opts.threshold)
                on_event("rung", partial.rungs[-1])
        finally:
            try:
                launch.kill_job(pool, inv.targets, job)
                launch.remove_job(pool, inv.targets, job)
            except KeyboardInterrupt:
                pass
    ladder = analyze(runs, opts.threshold)
    judged = inv.cluster is None or inv.cluster.provider != "local"
    verdict = ladder.verdict if judged else (
        f"not judged: local nodes share this machine's {os.cpu_count()} cores ({ladder.verdict})")
    ladder = Ladder(ladder.rungs, ladder.threshold, ladder.passed, verdict, ladder.slow_nodes, judged,
                    opts.model, opts.batch_size, str(out_dir))
    (out_dir / "results.json").write_text(ladder.to_json() + "\n")
    plot(ladder, out_dir / "scaling.png")
    return ladder


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
    verdict = ("PASS" if ladder.passed else "FAIL") if ladder.judged else "not judged (local nodes)"
    ax.set_title(f"Synthetic {ladder.model} scaling: {verdict}")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
