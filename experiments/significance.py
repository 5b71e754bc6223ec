"""Significance with the seed as the unit: Welch's t-test on per-seed scores (Welch 1947).

A run's BLEU varies with its seed (initialization, dropout, data order) by more than sentence resampling shows:
sacrebleu's paired bootstrap on the seeds' concatenated hypotheses measures only the second, so its p-value says
nothing about whether another set of seeds would rank the rows the same way. Welch's test compares the rows'
per-seed means with each row's own variance (no equal-variance assumption), its degrees of freedom by the
Welch-Satterthwaite equation. It needs at least 2 seeds a row and has little power below 3 (results_table.py
prints no p-value there); with 3 seeds a row, p = 0.05 needs a gap of about 3 pooled standard deviations.
"""

from __future__ import annotations

from nmt.stats import MIN_SEEDS, regularized_beta, t_two_sided_p, welch_test  # noqa: F401 -- the tests' names


def seed_p(a: list[float], b: list[float]) -> str:
    """The table cell: Welch's p, or why there is none."""
    if min(len(a), len(b)) < MIN_SEEDS:
        return f"n < {MIN_SEEDS} seeds"
    p = welch_test(a, b)[2]
    return f"{p:.3f}" if p >= 0.001 else "< 0.001"
