"""Student's t distribution, standard library only: its tail and quantiles, for the benchmark's stopping rule
on the nodes (bench_stop.py) and the ladder's verdict (clusterctl/workloads/bench/stats.py) alike.

The tail is the regularized incomplete beta function (Abramowitz & Stegun 26.7.1 and 26.5.27; the continued
fraction evaluated by the modified Lentz method as in Numerical Recipes 6.4); the quantile is solved from it
by Newton's method kept inside a bisection bracket, or for many degrees of freedom taken from Fisher's
expansion: exact to ~1e-10, no scipy.
"""

from __future__ import annotations

import math
from functools import lru_cache
from statistics import NormalDist


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


LARGE_DF = 500.0  # from here the expansion is within 1e-10 of the exact quantile up to p = 1 - 1e-7


def _expansion(p: float, df: float) -> float:
    """The quantile for many degrees of freedom: Fisher's expansion in 1/df around the normal's, to the fourth
    power (Abramowitz & Stegun 26.7.5); the continued fraction converges slowly there."""
    z = NormalDist().inv_cdf(p)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4


@lru_cache(maxsize=4096)
def t_quantile(p: float, df: float) -> float:
    """The p-quantile (p > 0.5) of Student's t; the normal's for infinite df."""
    if not 0.5 < p < 1.0:
        raise ValueError(f"t_quantile takes 0.5 < p < 1, not {p}")
    if math.isinf(df) or df > 1e9:
        return NormalDist().inv_cdf(p)
    if df >= LARGE_DF:
        return _expansion(p, df)
    tail = 1.0 - p
    lo, hi = 0.0, 2.0
    while t_sf(hi, df) > tail:
        lo, hi = hi, hi * 2.0
    # Newton's steps on the tail (its slope is minus the density), kept inside the bracket [lo, hi] by
    # bisecting whenever a step would leave it: a handful of tail evaluations where bisection takes ~35.
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    t = min(max(NormalDist().inv_cdf(p), lo), hi)
    for _ in range(200):
        excess = t_sf(t, df) - tail
        lo, hi = (t, hi) if excess > 0 else (lo, t)
        step = t + excess / math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        step = step if lo < step < hi else (lo + hi) / 2.0
        if abs(step - t) <= 1e-12 * t or hi - lo <= 1e-12 * hi:
            return step
        t = step
    return t
