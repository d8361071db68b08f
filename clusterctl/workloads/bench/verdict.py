"""The ladder's verdict, pure: each rung's img/s as a mean with its 95% interval (bench_stats), the checks
judged against the threshold (1 -> N efficiency; per process against one full node), the verdict line with
the --iters that would decide it, and each node alone against the median of the others."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

from clusterctl.node import bench_stop
from clusterctl.workloads import horovod
from clusterctl.workloads.bench import stats

DEFAULT_THRESHOLD = 0.90  # scaling efficiency: the figure Horovod (90% at 512 GPUs) and AWS's recipe report
SLOW_NODE = 0.80  # a node whose per-process img/s alone is below this share of the other nodes' median is named


@dataclass(frozen=True)
class Rung:
    np: int
    nodes: int
    img_per_sec: float  # the mean over the timed batches of every process's rate summed
    speedup: float  # over the 1-process rung (or the smallest rung)
    efficiency: float  # 1 -> N: img/s / (np / base np x the base rung's img/s)
    node_scaling: float | None  # per-process img/s / the full-node rung's per-process img/s; None on one node
    # img/s of each node's ranks, their own means: no interval (ranks in lockstep have no independent errors)
    per_node: dict[str, float]
    seconds: float
    log: str  # file name of the raw log in the results folder
    conf: float = 0.0  # img/s: half the 95% confidence interval of the mean (bench_stats)
    node_scaling_conf: float = 0.0  # the same for node_scaling, propagated from both rungs
    efficiency_conf: float = 0.0  # the same for efficiency, propagated from this rung and the base rung
    spread: float = 0.0  # img/s: 1.96 standard deviations of single batches (Horovod's +-; not the mean's)
    iters: int = 0  # timed batches
    speedup_conf: float = 0.0  # the same for speedup (efficiency's, times np / base np)
    stop: str = ""  # why it timed no more batches: decided | precise | time-cap | fixed (node/bench_stop.py)


@dataclass(frozen=True)
class Check:
    """One judged figure: its value, the half-width of its 95% interval, and what that says."""

    kind: str  # "efficiency" (1 -> N processes) | "node_scaling" (per process against one full node)
    np: int
    nodes: int
    value: float
    conf: float
    threshold: float
    status: str  # PASS | FAIL | INCONCLUSIVE
    text: str  # the figure in words, as the verdict says it
    iters_needed: int | None = None  # INCONCLUSIVE: --iters that would decide it at the measured variance


@dataclass(frozen=True)
class NodeAlone:
    """One node's own rung (all its slots, no cross-node allreduce), run on every node at once."""

    node: str  # the node as the hosts file names it
    hostname: str
    np: int
    per_proc: float  # img/s per process
    conf: float  # per process, half the 95% confidence interval of the mean
    log: str = ""
    spread: float = 0.0  # per process, 1.96 standard deviations of single batches
    vs_others: float | None = None  # per_proc / the median of the other nodes' (None: no other node)
    vs_others_conf: float = 0.0
    status: str = ""  # slow | ok | undecided (the interval straddles SLOW_NODE) | "" (no other node)


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
    status: str = ""  # PASS | FAIL | INCONCLUSIVE (an interval straddles the threshold)
    alone: tuple[NodeAlone, ...] = ()
    checks: tuple[Check, ...] = ()
    iters_needed: int | None = None  # INCONCLUSIVE: the --iters that would decide every undecided check
    config: dict[str, object] = field(default_factory=dict)  # the configuration chosen (TrainConfig.to_dict(), key)
    ran: dict[str, object] = field(default_factory=dict)  # what the rungs ran (the benchmark's own start line)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


def rate_of(run: horovod.BenchRun) -> stats.Estimate:
    """A run's img/s as a mean over its timed batches (each batch: every process's rate summed)."""
    return stats.Estimate.of([i.img_per_sec for i in run.intervals])


def _status(value: float, conf: float, threshold: float) -> str:
    if value - conf >= threshold:
        return "PASS"
    if value + conf < threshold:
        return "FAIL"
    return "INCONCLUSIVE"


def _check(kind: str, np_: int, nodes: int, est: stats.Estimate, threshold: float, words: str) -> Check:
    conf = est.half_width()
    status = _status(est.value, conf, threshold)
    text = words.format(value=f"{est.value:.0%} +- {conf:.0%}", threshold=f"threshold {threshold:.0%}")
    needed = est.iters_to_clear(threshold) if status == "INCONCLUSIVE" else None
    return Check(kind, np_, nodes, est.value, conf, threshold, status, text, needed)


def rung_seconds(runs: Sequence[tuple[int, int, horovod.BenchRun, float, str]], iters: int) -> float | None:
    """Seconds the slowest rung would take at `iters` timed batches: its launch and warm-up as measured, plus
    the batches at its measured rate (None when a run did not say its steps per batch)."""
    worst = 0.0
    for np_, _, run, seconds, _ in runs:
        steps = int(run.start.get("steps") or 0)
        if not steps or run.img_per_sec <= 0:
            return None
        per_batch = run.batch * steps * np_ / run.img_per_sec
        worst = max(worst, max(0.0, seconds - len(run.intervals) * per_batch) + iters * per_batch)
    return worst


Run = tuple[int, int, horovod.BenchRun, float, str]  # (np, nodes, parsed run, seconds, log name) of one rung


def _full_rung(runs: Sequence[Run], full_np: int | None) -> Run | None:
    """The one-node rung that multi-node rungs are judged against per process (default: the largest one)."""
    if full_np:
        return next((r for r in runs if r[0] == full_np and r[1] == 1), None)
    single = [r for r in runs if r[1] == 1]
    return single[-1] if single else None


def _reference(run: horovod.BenchRun, scale: float) -> bench_stop.Reference:
    rate = rate_of(run)
    (part,) = rate.parts
    return bench_stop.Reference(rate.value, math.sqrt(part.rel_var) * rate.value, part.n, scale)


def references(
    runs: Sequence[Run], np_: int, nodes: int, full_np: int | None = None
) -> tuple[bench_stop.Reference, ...]:
    """What the next rung (np_ processes on `nodes` nodes) will be judged against, from the rungs run before
    it, for its stopping rule (node/bench_stop.py): the base rung (its efficiency) and, on several nodes, the
    full-node rung (its figure per process), as analyze() judges it; () for the first rung."""
    refs = []
    if runs and np_ != runs[0][0]:
        refs.append(_reference(runs[0][2], np_ / runs[0][0]))
    full = _full_rung(runs, full_np)
    if nodes > 1 and full is not None:
        refs.append(_reference(full[2], np_ / full[0]))
    return tuple(refs)


def analyze(
    runs: Sequence[tuple[int, int, horovod.BenchRun, float, str]],
    threshold: float,
    full_np: int | None = None,
    timeout: float | None = None,
) -> Ladder:
    """runs: (np, nodes, parsed run, seconds, log name) per rung, ascending np; full_np: one full node's
    processes (default: the largest one-node rung); timeout: each rung's --timeout, raised in the advice
    when the advised --iters would not fit in it.

    Every figure is a mean over the timed batches with its 95% confidence interval (bench_stats: Student's t,
    propagated to first order through each ratio). Judged against the threshold:
    - every rung above the base (the 1-process rung, else the smallest): its 1 -> N efficiency,
      img/s / (np / base np x base img/s), the figure Horovod and AWS's recipe report;
    - every rung on more than one node: per process against the full-node rung,
      (img/s / np) / (full img/s / full np), so the loss the network adds shows apart from the node's own.
    PASS when every interval lies at or above the threshold, FAIL when one lies wholly below it, else
    INCONCLUSIVE, with the --iters that would decide it (each undecided check's Estimate.iters_to_clear)."""
    base_np, base_run = runs[0][0], runs[0][2]
    full = _full_rung(runs, full_np)
    if any(r[1] > 1 for r in runs) and full is None:
        raise ValueError("a ladder over several nodes needs a full-node rung to judge against")
    base = rate_of(base_run)
    rungs, checks = [], []
    for np_, nodes, run, seconds, log in runs:
        rate = rate_of(run)
        efficiency, efficiency_conf = 1.0, 0.0
        if np_ != base_np:
            eff = rate.over(base.times(np_ / base_np))
            efficiency, efficiency_conf = eff.value, eff.half_width()
            where = f" on {nodes} nodes" if nodes > 1 else ""
            words = f"{np_} processes{where} give {{value}} of linear scaling over {base_np} ({{threshold}})"
            checks.append(_check("efficiency", np_, nodes, eff, threshold, words))
        scaling, scaling_conf = None, 0.0
        if nodes > 1 and full is not None:  # a multi-node ladder has its full-node rung: checked above
            per_proc = rate.times(1 / np_).over(rate_of(full[2]).times(1 / full[0]))
            scaling, scaling_conf = per_proc.value, per_proc.half_width()
            words = (
                f"at {np_} processes on {nodes} nodes each process gives {{value}} of a process on one full "
                f"node ({full[0]} processes; {{threshold}})"
            )
            checks.append(_check("node_scaling", np_, nodes, per_proc, threshold, words))
        samples = [i.img_per_sec for i in run.intervals]
        rungs.append(
            Rung(
                np_,
                nodes,
                rate.value,
                rate.value / base.value,
                efficiency,
                scaling,
                run.per_node(),
                seconds,
                log,
                rate.half_width(),
                scaling_conf,
                efficiency_conf,
                stats.spread(samples),
                len(samples),
                efficiency_conf * np_ / base_np,
                run.stop.get("reason", ""),
            )
        )
    status, verdict, needed = _verdict(checks)
    longest = rung_seconds(runs, needed) if needed is not None and timeout is not None else None
    if longest is not None and timeout is not None and longest > timeout:  # else the advice would time out
        advice = f"rerun with --iters {needed} "
        verdict = verdict.replace(advice, f"{advice}--timeout {math.ceil(1.5 * longest / 60) * 60} ")
    return Ladder(
        tuple(rungs), threshold, status == "PASS", verdict, status=status, checks=tuple(checks), iters_needed=needed
    )


def _verdict(checks: Sequence[Check]) -> tuple[str, str, int | None]:
    """The ladder's status (its worst check's), the verdict line naming the deciding check, and for an
    INCONCLUSIVE one the --iters that would decide every undecided check."""
    if not checks:  # a one-rung ladder compares nothing
        return "PASS", "PASS: one rung, nothing to compare (give --ladder two process counts or more)", None
    order = ("FAIL", "INCONCLUSIVE", "PASS")
    status = min((c.status for c in checks), key=order.index)
    worst = min((c for c in checks if c.status == status), key=lambda c: c.value - c.threshold)
    tally = ", ".join(f"{sum(c.status == s for c in checks)} {s}" for s in order if any(c.status == s for c in checks))
    verdict = f"{status}: {worst.text}"
    needed: int | None = None
    if status == "INCONCLUSIVE":
        undecided = [c.iters_needed for c in checks if c.status == "INCONCLUSIVE"]
        needed = None if None in undecided else max(n for n in undecided if n is not None)
        verdict += ": the interval straddles the threshold; " + (
            f"rerun with --iters {needed} (estimated from the measured variance)"
            if needed is not None
            else f"no --iters up to {stats.MAX_ITERS:,} would decide it: the figure sits on the threshold"
        )
    return status, verdict + (f"; checks: {tally}" if len(checks) > 1 else ""), needed


def judge_nodes(alone: Sequence[NodeAlone], rates: Sequence[stats.Estimate]) -> list[NodeAlone]:
    """Each node alone against the median of the OTHER nodes (per process, with the ratio's 95% interval):
    slow when the whole interval is under SLOW_NODE, ok when it is at or above, else undecided. The others'
    median, not the best node: with two nodes it is the other node (nothing of the node itself dilutes the
    comparison, as a median over all would), with many it stays put when a few nodes are slow, and one
    unusually fast node does not make every other node slow. rates: each node's per-process Estimate."""
    judged = []
    for i, a in enumerate(alone):
        others = sorted((r for j, r in enumerate(rates) if j != i), key=lambda r: r.value)
        if not others:
            judged.append(a)
            continue
        mid = len(others) // 2
        median = others[mid] if len(others) % 2 else others[mid - 1].average(others[mid])
        ratio = rates[i].over(median)
        conf = ratio.half_width()
        status = "slow" if ratio.value + conf < SLOW_NODE else "ok" if ratio.value - conf >= SLOW_NODE else "undecided"
        judged.append(replace(a, vs_others=ratio.value, vs_others_conf=conf, status=status))
    return judged


def stragglers(alone: Sequence[NodeAlone]) -> tuple[str, ...]:
    """The nodes judge_nodes found slow on their own."""
    return tuple(a.node for a in alone if a.status == "slow")
