"""Significance with the seed as the unit: Welch's t-test on per-seed scores (Welch 1947), Holm-adjusted over a
family of comparisons (Holm 1979), and the smallest difference a null result could have detected.

A run's BLEU varies with its seed (initialization, dropout, data order) by more than sentence resampling shows:
sacrebleu's paired bootstrap on the seeds' concatenated hypotheses measures only the second, so its p-value says
nothing about whether another set of seeds would rank the rows the same way. Welch's test compares the rows'
per-seed means with each row's own variance (no equal-variance assumption), its degrees of freedom by the
Welch-Satterthwaite equation. It needs at least 2 seeds a row and has little power below 3 (results_table.py
prints no p-value there); with 3 seeds a row, p = 0.05 needs a gap of about 3 pooled standard deviations.

A table makes many comparisons; a verdict reads the Holm-adjusted p (`holm`: the family-wise error rate of the whole
family at most ALPHA), never the raw one. A comparison whose adjusted p is not below ALPHA is a null result, stated
as the smallest difference the seeds could have detected (`detectable_difference`: 80% power for a two-sided t-test
at ALPHA, from the two rows' pooled per-seed SD), not as "level with".
"""

from __future__ import annotations

import math
import statistics

from nmt.stats import MIN_SEEDS, holm, regularized_beta, t_two_sided_p, welch_test  # noqa: F401 -- the tests' names

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
    """The smallest true difference of means a two-sided two-sample t-test at `alpha` finds with probability `power`
    with these seed counts: (t_{1-alpha/2} + t_{power}) * s_pooled * sqrt(1/n_a + 1/n_b), df = n_a + n_b - 2 (the
    usual approximation: the central t in place of the noncentral one)."""
    df = len(a) + len(b) - 2
    pooled = math.sqrt(((len(a) - 1) * statistics.variance(a) + (len(b) - 1) * statistics.variance(b)) / df)
    return (t_quantile(alpha / 2, df) + t_quantile(1 - power, df)) * pooled * math.sqrt(1 / len(a) + 1 / len(b))


def seed_p(a: list[float], b: list[float]) -> float | None:
    """Welch's p of the two rows' seeds, or None with fewer than MIN_SEEDS a side."""
    return None if min(len(a), len(b)) < MIN_SEEDS else welch_test(a, b)[2]


def p_cell(p: float | None) -> str:
    """A table's p cell, or why there is none."""
    if p is None:
        return f"n < {MIN_SEEDS} seeds"
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"


def verdict(a: list[float], b: list[float], adjusted: float | None) -> str:
    """The verdict word of row a against row b from the Holm-adjusted p: "higher" or "lower" when adjusted < ALPHA,
    else the null result with the smallest difference the seeds could have detected."""
    if adjusted is None:
        return "no test"
    if adjusted < ALPHA:
        return "higher" if statistics.mean(a) > statistics.mean(b) else "lower"
    return f"no difference found (detectable: {detectable_difference(a, b):.2f})"
