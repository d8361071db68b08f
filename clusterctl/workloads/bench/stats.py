"""The benchmark's statistics: a rate's mean over timed batches with its 95% confidence interval, ratios of
such means with theirs, and how many batches would take an interval clear of a threshold.

The interval judged is the mean's, t x s / sqrt(n) (Student's t, sample standard deviation s of the n
timed batches): it narrows as sqrt(n) when --iters grows. The population sd of single batches (Horovod's
benchmark prints 1.96 of it) is their *spread*; it does not shrink with n and is no test of the mean.

Ratios of independent means (img/s of one rung over another's) carry both relative errors, to first order:
(se_r / r)^2 = (se_a / a)^2 + (se_b / b)^2; the t-quantile then takes the Welch-Satterthwaite degrees of
freedom of that sum (Welch 1947), so a ratio of two 3-batch means gets a wider interval than two 30-batch
ones. The t-quantile is clusterctl/node/student_t.py's (exact to ~1e-9, no scipy), the one the nodes'
stopping rule uses too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

from clusterctl.node.student_t import t_quantile, t_sf

__all__ = ["LEVEL", "MAX_ITERS", "POWER", "Estimate", "Part", "spread", "t_quantile", "t_sf"]

LEVEL = 0.95  # two-sided confidence of every judged interval
# iters_to_clear: the chance that a rerun at the advised --iters decides, were the figure and its variance as
# measured. 0.9 rather than the textbook 0.8: the first run's own estimates are noisy (the unit tests measure it).
POWER = 0.90
MAX_ITERS = 100_000  # beyond this no --iters is practical advice


@dataclass(frozen=True)
class Part:
    """One independent mean inside an estimate: the relative variance of one batch (s^2 / mean^2, weighted
    by its share when means are added) and how many batches it averages."""

    rel_var: float
    n: int


@dataclass(frozen=True)
class Estimate:
    """A mean (or a ratio of means) and what its uncertainty is made of."""

    value: float
    parts: tuple[Part, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Estimate":
        """The mean of per-batch rates; at least two batches (one says nothing of its variance)."""
        n = len(samples)
        if n < 2:
            raise ValueError(f"a mean's interval needs at least two timed batches, not {n}")
        mean = sum(samples) / n
        if mean <= 0:
            raise ValueError(f"per-batch rates must be positive, not a mean of {mean}")
        var = sum((x - mean) ** 2 for x in samples) / (n - 1)
        return cls(mean, (Part(var / mean**2, n),))

    def times(self, k: float) -> "Estimate":
        """A constant multiple (a process count): the same relative error."""
        return Estimate(self.value * k, self.parts)

    def over(self, other: "Estimate") -> "Estimate":
        """self / other for independent means: the relative variances add (first order)."""
        return Estimate(self.value / other.value, self.parts + other.parts)

    def average(self, other: "Estimate") -> "Estimate":
        """(self + other) / 2 of independent means: each part weighted by its share of the sum."""
        total = self.value + other.value
        parts = tuple(Part(p.rel_var * (e.value / total) ** 2, p.n) for e in (self, other) for p in e.parts)
        return Estimate(total / 2.0, parts)

    def _rel_var_of_mean(self, n: int | None) -> float:
        return sum(p.rel_var / (n or p.n) for p in self.parts)

    def df(self, n: int | None = None) -> float:
        """Welch-Satterthwaite degrees of freedom (infinite when nothing varied); n: as if every mean had n batches."""
        total = self._rel_var_of_mean(n)
        denom = sum((p.rel_var / (n or p.n)) ** 2 / ((n or p.n) - 1) for p in self.parts)
        return math.inf if denom <= 0 else total**2 / denom

    def se(self, n: int | None = None) -> float:
        """Standard error of the value (first order)."""
        return abs(self.value) * math.sqrt(self._rel_var_of_mean(n))

    def half_width(self, n: int | None = None) -> float:
        """Half the 95% confidence interval: t(0.975, df) x se."""
        se = self.se(n)
        return 0.0 if se == 0 else t_quantile(0.5 + LEVEL / 2, self.df(n)) * se

    def iters_to_clear(self, threshold: float) -> int | None:
        """The batches per mean at which the interval would leave the threshold out with POWER's chance, if the
        value and the per-batch variance stay as measured: the least n with (t(df(n)) + z_power) x se(n) <=
        |value - threshold| (the usual sample size of a test at 95% confidence and POWER). None when no
        count up to MAX_ITERS does (the value sits on the threshold)."""
        gap = abs(self.value - threshold)
        z = NormalDist().inv_cdf(POWER)

        def clears(n: int) -> bool:
            se = self.se(n)
            return se == 0 or (t_quantile(0.5 + LEVEL / 2, self.df(n)) + z) * se <= gap

        if gap == 0 or not clears(MAX_ITERS):
            return None
        lo, hi = 1, 2  # clears(lo) is False (n=1 has no variance estimate); find the least hi that clears
        while not clears(hi):
            lo, hi = hi, hi * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if clears(mid) else (mid, hi)
        return hi


def spread(samples: Sequence[float]) -> float:
    """1.96 population standard deviations of single batches (what Horovod's benchmark prints as +-)."""
    mean = sum(samples) / len(samples)
    return 1.96 * math.sqrt(sum((x - mean) ** 2 for x in samples) / len(samples))
