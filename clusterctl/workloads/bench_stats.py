"""The benchmark's statistics: a rate's mean over timed batches with its 95% confidence interval, ratios of
such means with theirs, and how many batches would take an interval clear of a threshold.

The interval judged is the mean's, t x s / sqrt(n) (Student's t, sample standard deviation s of the n
timed batches): it narrows as sqrt(n) when --iters grows. The population sd of single batches (Horovod's
benchmark prints 1.96 of it) is their *spread*; it does not shrink with n and is no test of the mean.

Ratios of independent means (img/s of one rung over another's) carry both relative errors, to first order:
(se_r / r)^2 = (se_a / a)^2 + (se_b / b)^2; the t-quantile then takes the Welch-Satterthwaite degrees of
freedom of that sum (Welch 1947), so a ratio of two 3-batch means gets a wider interval than two 30-batch
ones. The t-quantile is computed here from the regularized incomplete beta function (Student's t CDF,
Abramowitz & Stegun 26.7.1 and 26.5.27; the continued fraction evaluated by the modified Lentz method as in
Numerical Recipes 6.4), solved by bisection: exact to ~1e-9, no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Sequence

LEVEL = 0.95  # two-sided confidence of every judged interval
# iters_to_clear: the chance that a rerun at the advised --iters decides, were the figure and its variance as
# measured. 0.9 rather than the textbook 0.8: the first run's own estimates are noisy (the unit tests measure it).
POWER = 0.90
MAX_ITERS = 100_000  # beyond this no --iters is practical advice


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with df degrees of freedom (any real df > 0), t >= 0."""
    return 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile (p > 0.5) of Student's t; the normal's for infinite df."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"t_quantile takes 0.5 < p < 1, not {p}")
    if math.isinf(df) or df > 1e9:
        return NormalDist().inv_cdf(p)
    tail = 1.0 - p
    lo, hi = 0.0, 2.0
    while t_sf(hi, df) > tail:
        lo, hi = hi, hi * 2.0
    while hi - lo > 1e-10 * hi:
        mid = (lo + hi) / 2.0
        if t_sf(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


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
