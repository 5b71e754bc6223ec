"""experiments/significance.py: Welch's t-test, the seed-level test of the results tables."""

import math
import statistics

import pytest

from experiments.significance import regularized_beta, seed_p, t_two_sided_p, welch_test


@pytest.mark.parametrize("t, df, p", [(2.0, 5, 0.1019395), (2.228139, 10, 0.05), (12.7062, 1, 0.05),
                                      (1.959964, 1e6, 0.05), (0.0, 3, 1.0), (4.303, 2, 0.05)])
def test_student_t_tail_matches_the_tables(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-5)


def test_regularized_beta_has_its_closed_forms():
    for x in (0.1, 0.5, 0.93):
        assert regularized_beta(x, 1.0, 1.0) == pytest.approx(x)  # uniform
        assert regularized_beta(x, 2.0, 1.0) == pytest.approx(x * x)
        assert regularized_beta(x, 0.5, 0.5) == pytest.approx(2 / math.pi * math.asin(math.sqrt(x)))


def test_welch_counts_each_rows_own_variance():
    a, b = [34.6, 35.0, 35.3], [34.0, 34.2, 34.6, 34.1, 33.9]
    t, df, p = welch_test(a, b)
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 5
    assert t == pytest.approx((statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 4))
    assert p == pytest.approx(t_two_sided_p(t, df)) and 0.0 < p < 0.05
    assert welch_test(b, a)[2] == pytest.approx(p) and welch_test(a, a)[2] == pytest.approx(1.0)


def test_a_row_of_fewer_than_three_seeds_gets_no_p_value():
    assert seed_p([35.0, 35.2], [34.0, 34.1, 34.3]) == "n < 3 seeds"
    assert seed_p([35.0, 35.2, 35.1], [34.0, 34.1, 34.3]) == f"{welch_test([35.0, 35.2, 35.1], [34.0, 34.1, 34.3])[2]:.3f}"
    with pytest.raises(ValueError, match="2 values a side"):
        welch_test([1.0], [1.0, 2.0])
