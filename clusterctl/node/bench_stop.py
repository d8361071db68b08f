"""When a rung of the benchmark stops timing batches: the sequential rule, standard library only (it runs on
the nodes, inside node/bench.py's loop, and in the controller's simulation of whole ladders).

The rule, after every timed batch (a "look"), once at least --iters batches are in:
- a rung that is judged against rungs measured before it (its references: the base rung for the 1 -> N
  efficiency, the full-node rung for the per-process figure of a multi-node rung) stops as soon as every
  such figure's interval lies wholly at or above the threshold, or one lies wholly below it ("decided");
- the first rung, judged against nothing, stops once its own mean is known to within BASE_WIDTH of itself
  ("precise"): the later ratios divide by it, so its error is in every one of them;
- any rung stops when --max-seconds of timed batches have passed ("time-cap"); with --max-seconds 0 it
  times exactly --iters batches ("fixed").

Repeated looks: a rung looks after every batch, and each look is one more chance for noise to carry an
interval across the threshold. So the looks do not use the verdict's 95% interval but a stricter one,
LOOK_LEVEL, held constant over the looks (Pocock's design, with the boundary on the t scale): it is chosen
so that over the whole procedure, looks at every batch up to the time cap and the verdict's own 95% look at
the end, a cluster exactly at the threshold gets PASS in at most 5% of ladders. The figures are the
verdict's (clusterctl/workloads/bench/verdict.py): a ratio of two means with its relative variance from
both and Welch-Satterthwaite degrees of freedom; here rounded down to whole degrees of freedom, which only
widens the interval, so a look costs microseconds. tests/workloads/test_bench_sequential.py simulates whole
ladders through this rule and the verdict and measures the error rates (docs/bench-and-doctor.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Sequence, Tuple

from clusterctl.node.student_t import t_quantile

LOOK_LEVEL = 0.999  # two-sided level of the interval each look judges (module docstring; calibrated by simulation)
# The first rung's mean to +-0.5% (95%): a quarter of the 2-point margin by which a cluster at 92% clears the
# 90% threshold, relative to it (2/92 = 2.2%), so that the ratios' interval is mostly the later rung's own.
BASE_WIDTH = 0.005
BASE_LEVEL = 0.95

DECIDED, PRECISE, TIME_CAP, FIXED = "decided", "precise", "time-cap", "fixed"
WHY = {  # each reason in words, as the ladder prints it
    DECIDED: "its verdict decided",
    PRECISE: f"its mean known to +-{BASE_WIDTH:.1%}",
    TIME_CAP: "time cap (--max-seconds)",
    FIXED: "--iters batches (--max-seconds 0)",
}


@dataclass(frozen=True)
class Reference:
    """A rung measured before this one: the figure judged is this rung's img/s over scale x its mean
    (scale: this rung's processes over the reference's)."""

    mean: float
    sd: float  # sample standard deviation of its batches' img/s
    n: int  # its timed batches
    scale: float

    def arg(self) -> str:
        return f"{self.mean!r}:{self.sd!r}:{self.n}:{self.scale!r}"

    @classmethod
    def parse(cls, text: str) -> "Reference":
        """MEAN:SD:N:SCALE, as arg() writes it; ValueError on anything else."""
        mean, sd, n, scale = text.split(":")
        ref = cls(float(mean), float(sd), int(n), float(scale))
        if not (ref.mean > 0 and ref.sd >= 0 and ref.n >= 2 and ref.scale > 0):
            raise ValueError(f"a reference is MEAN:SD:N:SCALE with positive figures and N >= 2, not {text!r}")
        return ref


class Batches:
    """The running mean and sample variance of the batches' img/s (Welford's update: one pass, stable)."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self._m2 = 0.0

    def add(self, rate: float) -> None:
        self.n += 1
        delta = rate - self.mean
        self.mean += delta / self.n
        self._m2 += delta * (rate - self.mean)

    @property
    def var(self) -> float:
        return self._m2 / (self.n - 1) if self.n > 1 else math.inf


def _t(level: float, df: float) -> float:
    """The two-sided `level` quantile at whole degrees of freedom (rounded down: never a narrower interval)."""
    return t_quantile(0.5 + level / 2, math.inf if math.isinf(df) else float(max(1, math.floor(df))))


def interval(batches: Batches, ref: Reference, level: float = LOOK_LEVEL) -> Tuple[float, float]:
    """The figure batches.mean / (ref.scale x ref.mean) and half its interval at this level: the verdict's
    (workloads/bench/stats.py: Estimate.over, half_width) but for the degrees of freedom, rounded down here."""
    value = batches.mean / (ref.scale * ref.mean)
    a = batches.var / batches.n / batches.mean**2  # each mean's relative variance
    b = ref.sd**2 / ref.n / ref.mean**2
    if a + b <= 0:
        return value, 0.0
    df = (a + b) ** 2 / (a**2 / (batches.n - 1) + b**2 / (ref.n - 1))
    return value, _t(level, df) * value * math.sqrt(a + b)


def status(batches: Batches, ref: Reference, threshold: float, level: float = LOOK_LEVEL) -> str:
    """PASS, FAIL or INCONCLUSIVE of that figure at this level, by the verdict's rule (workloads/bench/verdict.py's _status)."""
    value, conf = interval(batches, ref, level)
    if value - conf >= threshold:
        return "PASS"
    return "FAIL" if value + conf < threshold else "INCONCLUSIVE"


def relative_width(batches: Batches, level: float = BASE_LEVEL) -> float:
    """Half the mean's interval over the mean."""
    return _t(level, batches.n - 1) * math.sqrt(batches.var / batches.n) / batches.mean


@dataclass(frozen=True)
class Rule:
    min_batches: int  # --iters
    max_seconds: float  # of timed batches; 0: exactly min_batches
    threshold: float = 0.9
    references: Tuple[Reference, ...] = ()
    base_width: float = BASE_WIDTH
    level: float = LOOK_LEVEL

    def reason(self, batches: Batches, seconds: float) -> str:
        """Why to stop after these batches and seconds of timing, or "" to time another batch."""
        if batches.n < max(2, self.min_batches):  # a variance needs two
            return ""
        if self.max_seconds <= 0:
            return FIXED
        if self.references:
            verdicts = [status(batches, r, self.threshold, self.level) for r in self.references]
            if "FAIL" in verdicts or all(v == "PASS" for v in verdicts):
                return DECIDED
        elif relative_width(batches) <= self.base_width:
            return PRECISE
        return TIME_CAP if seconds >= self.max_seconds else ""


def time_batches(rule: Rule, next_batch: Callable[[], Tuple[float, float]]) -> Tuple[List[float], str]:
    """Batches until the rule says stop: next_batch times one and returns (its img/s, seconds of timing so
    far), the same on every rank (node/bench.py: both summed over ranks). The rates and why it stopped."""
    batches, rates = Batches(), []
    while True:
        rate, seconds = next_batch()
        rates.append(rate)
        batches.add(rate)
        why = rule.reason(batches, seconds)
        if why:
            return rates, why


def references_text(refs: Sequence[Reference]) -> List[str]:
    """The node benchmark's arguments for these references."""
    return [arg for r in refs for arg in ("--against", r.arg())]
