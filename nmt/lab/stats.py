"""Significance with the seed as the unit: Welch's t-test on per-seed scores (Welch 1947), Holm-adjusted over a
family of comparisons (Holm 1979), and the smallest difference a null result could have detected, with no
dependency beyond the standard library; every table (nmt/table.py, nmt/lab/page.py) compares rows with them.

A run's BLEU varies with its seed (initialization, dropout, data order) by more than sentence resampling shows:
sacrebleu's paired bootstrap on the seeds' concatenated hypotheses measures only the second, so its p-value says
nothing about whether another set of seeds would rank the rows the same way. Welch's test compares the rows'
per-seed means with each row's own variance (no equal-variance assumption), its degrees of freedom by the
Welch-Satterthwaite equation. It needs at least 2 seeds a row and has little power below 3 (no p-value is printed
there); with 3 seeds a row, p = 0.05 needs a gap of about 3 pooled standard deviations.

A table makes many comparisons; a verdict reads the Holm-adjusted p (`holm`: the family-wise error rate of the whole
family at most ALPHA), never the raw one. A comparison whose adjusted p is not below ALPHA is a null result, stated
as the smallest difference the seeds could have detected (`detectable_difference`: 80% power for Welch's test at
the level Holm's step-down held the comparison to, `holm_levels`), not as "level with".
"""

from __future__ import annotations

import math
import statistics

MIN_SEEDS = 3  # below this a row's variance is too uncertain for a p-value worth printing

def _continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz's method)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for numerator in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for 0 <= x <= 1."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _continued_fraction(a, b, x) / a
    return 1.0 - front * _continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    return regularized_beta(df / (df + t * t), df / 2.0, 0.5)


def welch_test(a: list[float], b: list[float]) -> tuple[float, float, float]:
    """(t, degrees of freedom, two-sided p) of mean(a) against mean(b), each with at least 2 values."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's test needs 2 values a side, got {len(a)} and {len(b)}")
    diff = statistics.mean(a) - statistics.mean(b)
    variance, df = welch_variance(a, b)
    if variance == 0.0:
        return (math.copysign(math.inf, diff) if diff else 0.0), df, (0.0 if diff else 1.0)
    t = diff / math.sqrt(variance)
    return t, df, t_two_sided_p(t, df)


def welch_variance(a: list[float], b: list[float]) -> tuple[float, float]:
    """(variance of mean(a) - mean(b), Welch-Satterthwaite degrees of freedom); n_a + n_b - 2 where both are 0."""
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if va + vb == 0.0:
        return 0.0, float(len(a) + len(b) - 2)
    return va + vb, (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))


def holm_levels(ps: list[float], alpha: float = 0.05) -> list[float]:
    """The level each comparison's p was held to in Holm's step-down, in the order given. The p of rank r (1 the
    smallest) is tested at alpha / (m - r + 1) until the first that is not below its level; the step-down stops
    there, and that comparison and every one after it are nulls held to the level where it stopped: to be called,
    a null's p would have had to come before the stop and pass that level. A null's detectable difference is sized
    at it, so no null shows a gap its seeds would have called."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    levels, stop = [0.0] * len(ps), None
    for rank, i in enumerate(order):
        own = alpha / (len(ps) - rank)
        if stop is None and not ps[i] < own:
            stop = own
        levels[i] = own if stop is None else stop
    return levels


def holm(ps: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: the i-th smallest p times (m - i + 1), made
    non-decreasing in that order and capped at 1. A comparison is significant at family-wise level a when its
    adjusted p < a."""
    order = sorted(range(len(ps)), key=lambda i: ps[i])
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


ALPHA, POWER = 0.05, 0.80


def t_quantile(upper_tail: float, df: float) -> float:
    """The t with P(T >= t) = upper_tail (0 < upper_tail <= 0.5) for Student's t with df degrees of freedom
    (bisection on t_two_sided_p)."""
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > 2 * upper_tail:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 2 * upper_tail else (lo, mid)
    return (lo + hi) / 2


def detectable_difference(a: list[float], b: list[float], alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true difference of means Welch's two-sided test at `alpha` finds with probability `power` with
    these seeds: (t_{1-alpha/2} + t_{power}) * sqrt(s_a^2/n_a + s_b^2/n_b), df Welch-Satterthwaite's (the usual
    approximation: the central t in place of the noncentral one). The standard error and degrees of freedom are the
    test's own (welch_variance), so an observed gap larger than this always has p below `alpha`."""
    variance, df = welch_variance(a, b)
    if variance == 0.0:
        return 0.0
    return (t_quantile(alpha / 2, df) + t_quantile(1 - power, df)) * math.sqrt(variance)


def seed_noise(groups: list[list[float]], n_a: int, n_b: int, alpha: float = ALPHA) -> float | None:
    """The largest gap between two means of n_a and n_b runs that seed noise alone gives in 1 - alpha of trainings:
    t_{1-alpha/2, df} * s * sqrt(1/n_a + 1/n_b), s the pooled sd of `groups` (the seeds of each config run more than
    once), df their degrees of freedom; None below MIN_SEEDS - 1 of them (a spread of two runs is no measure). For
    comparing configs whose own seeds are too few to test."""
    groups = [g for g in groups if len(g) > 1]
    df = sum(len(g) - 1 for g in groups)
    if df < MIN_SEEDS - 1:
        return None
    pooled = math.sqrt(sum((len(g) - 1) * statistics.variance(g) for g in groups) / df)
    return t_quantile(alpha / 2, df) * pooled * math.sqrt(1 / n_a + 1 / n_b)


def seed_p(a: list[float], b: list[float]) -> float | None:
    """Welch's p of the two rows' seeds, or None with fewer than MIN_SEEDS a side."""
    return None if min(len(a), len(b)) < MIN_SEEDS else welch_test(a, b)[2]


def p_cell(p: float | None) -> str:
    """A table's p cell, or why there is none."""
    if p is None:
        return f"n < {MIN_SEEDS} seeds"
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def mean_sd(values: list[float]) -> str:
    """A row's mean ± sample standard deviation over its seeds (the value alone for one seed)."""
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}" if len(values) > 1 else f"{values[0]:.2f}"


def verdict(a: list[float], b: list[float], adjusted: float | None, level: float = ALPHA) -> str:
    """The verdict word of row a against row b from the Holm-adjusted p: "higher" or "lower" when adjusted < ALPHA,
    else the null result with the smallest difference the seeds could have detected at `level`, the level Holm's
    step-down held the comparison to (holm_levels), not ALPHA."""
    if adjusted is None:
        return "no test"
    if adjusted < ALPHA:
        return "higher" if statistics.mean(a) > statistics.mean(b) else "lower"
    return f"no difference found (detectable: {detectable_difference(a, b, alpha=level):.2f})"
