"""Significance with the seed as the unit: Welch's t-test on per-seed scores (Welch 1947), Holm-adjusted over a
family of comparisons (Holm 1979), and the smallest difference a null result could have detected (the noncentral
t, post hoc: at the observed spreads), on scipy's distributions; every table (nmt/table.py, nmt/lab/page.py) compares rows with them.

A run's BLEU varies with its seed (initialization, dropout, data order) by more than sentence resampling shows:
sacrebleu's paired bootstrap on the seeds' concatenated hypotheses measures only the second, so its p-value says
nothing about whether another set of seeds would rank the rows the same way. Welch's test compares the rows'
per-seed means with each row's own variance (no equal-variance assumption), its degrees of freedom by the
Welch-Satterthwaite equation. It needs at least 2 seeds a row and has little power below 3 (no p-value is printed
there); with 3 seeds a row, p = 0.05 needs a gap of about 3 pooled standard deviations.

A table makes many comparisons; a verdict reads the Holm-adjusted p (`holm`: the family-wise error rate of the whole
family at most ALPHA), never the raw one. A comparison whose adjusted p is not below ALPHA is a null result, stated
as the smallest difference the seeds could have detected (`detectable_difference`: 80% power for Welch's test at
the level Holm's step-down held the comparison to, `holm_levels`, from the noncentral t at the observed spreads),
not as "level with".
"""

from __future__ import annotations

import math
import statistics

try:  # the lab's extra (pip install -e '.[lab]'; make install brings it): Student's t and the noncentral t
    from scipy import stats as scipy_stats
    from scipy.optimize import brentq
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError("the tables' statistics need scipy: pip install -e '.[lab]'") from missing

MIN_SEEDS = 3  # below this a row's variance is too uncertain for a p-value worth printing

def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom."""
    return float(2 * scipy_stats.t.sf(abs(t), df))


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
    """The t with P(T >= t) = upper_tail for Student's t with df degrees of freedom."""
    return float(scipy_stats.t.isf(upper_tail, df))


def welch_power(noncentrality: float, df: float, alpha: float = ALPHA) -> float:
    """The power of the two-sided t-test at `alpha` with df degrees of freedom when the true difference is
    `noncentrality` standard errors: P(|T'| > t_{1-alpha/2}), T' noncentral t."""
    critical = t_quantile(alpha / 2, df)
    wrong_side = scipy_stats.nct.cdf(-critical, df, noncentrality)  # NaN where it underflows (scipy 1.17): nil
    return float(scipy_stats.nct.sf(critical, df, noncentrality) + (0.0 if math.isnan(wrong_side) else wrong_side))


def detectable_difference(a: list[float], b: list[float], alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true difference of means Welch's two-sided test at `alpha` finds with probability `power`: the
    noncentrality at which the noncentral t's power is `power` (welch_power), times the test's own standard error,
    with its Welch-Satterthwaite degrees of freedom (welch_variance), so an observed gap larger than this always has p
    below `alpha`. Post hoc: it takes the observed spreads for the true ones (with 3 seeds a row, a rough measure)."""
    variance, df = welch_variance(a, b)
    if variance == 0.0:
        return 0.0
    high = 2 * t_quantile(alpha / 2, df) + 2
    while welch_power(high, df, alpha) < power:
        high *= 2
    return float(brentq(lambda nc: welch_power(nc, df, alpha) - power, 0.0, high, xtol=1e-10)) * math.sqrt(variance)


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
