"""experiments/significance.py: Welch's t-test, the seed-level test of the results tables, Holm's adjustment over
a table's family, the detectable difference of a null result; and the verdicts of results/README.md against them."""

import math
import random
import re
import statistics

import pytest

from nmt.lab.stats import (ALPHA, detectable_difference, holm, holm_levels, p_cell, seed_p, t_quantile,
                       t_two_sided_p, verdict, welch_power, welch_test)
from nmt.lab.claims import generated_tables
from tests.conftest import ROOT


@pytest.mark.parametrize("t, df, p", [(2.0, 5, 0.1019395), (2.228139, 10, 0.05), (12.7062, 1, 0.05),
                                      (1.959964, 1e6, 0.05), (0.0, 3, 1.0), (4.303, 2, 0.05)])
def test_student_t_tail_matches_the_tables(t, df, p):
    assert t_two_sided_p(t, df) == pytest.approx(p, abs=2e-5)


def test_welch_is_scipys_own():
    """The one check against the library the lab's statistics stand on: scipy's Welch test, on unequal spreads."""
    from scipy import stats

    a, b = [35.1, 34.6, 35.3], [34.2, 34.5, 33.9, 34.0]
    t, df, p = welch_test(a, b)
    theirs = stats.ttest_ind(a, b, equal_var=False)
    assert (t, p) == pytest.approx((theirs.statistic, theirs.pvalue), rel=1e-9)


def test_welch_gives_the_published_example():
    """Wikipedia's "Welch's t-test", example 1 (two samples of 15, unequal variances): t = -2.46, df = 24.99,
    p = 0.021, computed elsewhere: the test of the function is against numbers it did not produce."""
    a = [27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4]
    b = [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4]
    t, df, p = welch_test(a, b)
    assert t == pytest.approx(-2.46, abs=0.005) and df == pytest.approx(24.99, abs=0.005)
    assert p == pytest.approx(0.021, abs=0.0005)


def test_welch_counts_each_rows_own_variance():
    a, b = [34.6, 35.0, 35.3], [34.0, 34.2, 34.6, 34.1, 33.9]
    t, df, p = welch_test(a, b)
    va, vb = statistics.variance(a) / 3, statistics.variance(b) / 5
    assert t == pytest.approx((statistics.mean(a) - statistics.mean(b)) / math.sqrt(va + vb))
    assert df == pytest.approx((va + vb) ** 2 / (va**2 / 2 + vb**2 / 4))
    assert 0.0 < p < 0.05  # the p of (t, df) itself: the published example above and the t tables
    assert welch_test(b, a)[2] == pytest.approx(p) and welch_test(a, a)[2] == pytest.approx(1.0)


def test_a_row_of_fewer_than_three_seeds_gets_no_p_value():
    assert seed_p([35.0, 35.2], [34.0, 34.1, 34.3]) is None and p_cell(None) == "n < 3 seeds"
    p = seed_p([35.0, 35.2, 35.1], [34.0, 34.1, 34.3])
    assert p == welch_test([35.0, 35.2, 35.1], [34.0, 34.1, 34.3])[2] and p_cell(p) == f"{p:.3f}"
    assert p_cell(0.0004) == "< 0.001"
    with pytest.raises(ValueError, match="2 values a side"):
        welch_test([1.0], [1.0, 2.0])


@pytest.mark.parametrize("ps, adjusted", [
    ([0.01, 0.04, 0.03], [0.03, 0.06, 0.06]),  # 3 x 0.01; 2 x 0.03; 1 x 0.04 raised to the 0.06 before it
    ([0.001, 0.01, 0.02, 0.5], [0.004, 0.03, 0.04, 0.5]),
    ([0.02, 0.02], [0.04, 0.04]),
    ([0.3, 0.6], [0.6, 0.6]),  # 2 x 0.3 = 0.6, then max(0.6, 0.6)
    ([0.4, 0.9, 0.7], [1.0, 1.0, 1.0]),  # capped at 1
])
def test_holm_has_its_closed_forms(ps, adjusted):
    assert holm(ps) == pytest.approx(adjusted)


@pytest.mark.parametrize("a, b, t, df, p", [  # Welch's t-test, Wikipedia's worked examples (to their rounding)
    ([27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4],
     [27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4], -2.46, 25.0, 0.021),
    ([17.2, 20.9, 22.6, 18.1, 21.7, 21.4, 23.5, 24.2, 14.7, 21.8],
     [21.5, 22.8, 21.0, 23.0, 21.6, 23.6, 22.5, 20.7, 23.4, 21.8, 20.7, 21.7, 21.5, 22.5, 23.6, 21.5, 22.5, 23.5, 21.5,
      21.8], -1.57, 9.9, 0.149),
])
def test_welch_matches_the_textbook_examples(a, b, t, df, p):
    got = welch_test(a, b)
    assert got[0] == pytest.approx(t, abs=0.005) and got[1] == pytest.approx(df, abs=0.05)
    assert got[2] == pytest.approx(p, abs=0.0005)


@pytest.mark.parametrize("tail, df, t", [(0.025, 4, 2.776), (0.2, 4, 0.941), (0.025, 10, 2.228), (0.05, 1, 6.314),
                                         (0.2, 10, 0.879)])
def test_t_quantiles_match_the_tables(tail, df, t):
    assert t_quantile(tail, df) == pytest.approx(t, abs=0.0005)


def test_detectable_difference_of_three_seeds_a_side():
    """Equal SDs: Welch's df is 4 and the standard error s * sqrt(2/3). The central-t shortcut (t_.975,4 + t_.8,4)
    = 3.717 standard errors has power 0.791 (the noncentral t); 80 % needs a little more. At a corrected level the
    shortcut falls further short: at 0.05 / 40 it gives power under 0.7."""
    a, b = [-1.0, 0.0, 1.0], [9.0, 10.0, 11.0]  # SD 1 each
    se = (2 / 3) ** 0.5
    assert welch_power(2.776 + 0.941, 4) == pytest.approx(0.791, abs=0.001)
    assert welch_power(detectable_difference(a, b) / se, 4) == pytest.approx(0.80, abs=1e-6)
    assert 3.717 < detectable_difference(a, b) / se < 3.8
    shortcut = t_quantile(0.05 / 80, 4) + t_quantile(0.2, 4)
    assert welch_power(shortcut, 4, alpha=0.05 / 40) < 0.7 and detectable_difference(a, b, alpha=0.05 / 40) / se > shortcut


def test_the_detectable_difference_against_a_simulation_at_one_row():
    """A row of the page (3 seeds a side, the spreads of Table 1's relative and absolute En-De rows): at the
    detectable difference, a t-test at the Welch-Satterthwaite df of the true spreads finds the gap in 80 % of 40,000
    simulated pairs of rows, as the noncentral t says. Welch's own test, whose df is estimated from the seeds too,
    finds it less often (about 0.70 at 0.05): the detectable difference is what the seeds could at best detect."""
    import numpy as np
    from scipy import stats

    a0, b0 = [35.3, 34.97, 34.6], [34.24, 34.56, 33.92]
    df = welch_test(a0, b0)[1]
    rng = np.random.default_rng(1)
    for level, welch_range in ((0.05, (0.66, 0.74)), (0.05 / 40, (0.40, 0.55))):
        delta = detectable_difference(a0, b0, alpha=level)
        a = rng.normal(delta, statistics.stdev(a0), (40_000, 3))
        b = rng.normal(0.0, statistics.stdev(b0), (40_000, 3))
        welch = stats.ttest_ind(a, b, axis=1, equal_var=False)
        assert np.mean(np.abs(welch.statistic) > t_quantile(level / 2, df)) == pytest.approx(0.80, abs=0.01)
        assert welch_range[0] < np.mean(welch.pvalue < level) < welch_range[1]


def test_holm_holds_every_null_to_the_level_where_its_step_down_stopped():
    """m = 4: ranks 1-4 are tested at 0.0125, 0.0167, 0.025 and 0.05; 0.02 is the first p not under its level, so it
    and every later p are held to 0.0167, even 0.021, which is under its own rank's 0.025."""
    ps = [0.5, 0.001, 0.021, 0.02]
    assert holm_levels(ps) == pytest.approx([0.05 / 3, 0.0125, 0.05 / 3, 0.05 / 3])
    called = [adjusted < ALPHA for adjusted in holm(ps)]
    assert called == [p < level for p, level in zip(ps, holm_levels(ps))] == [False, True, False, False]


def test_no_null_shows_a_gap_its_seeds_would_have_called():
    """A gap larger than the detectable difference at a null's level would be a p under that level: never, for any
    seeds, since the detectable difference uses the test's own standard error and degrees of freedom."""
    rng = random.Random(3)
    for _ in range(300):
        a = [rng.gauss(rng.uniform(-2, 2), rng.uniform(0.05, 2)) for _ in range(rng.choice((3, 4, 5)))]
        b = [rng.gauss(0, rng.uniform(0.05, 2)) for _ in range(rng.choice((3, 4, 5)))]
        level = rng.choice((0.05, 0.05 / 10, 0.05 / 44))
        if abs(statistics.mean(a) - statistics.mean(b)) > detectable_difference(a, b, alpha=level):
            assert welch_test(a, b)[2] < level


def test_the_verdict_reads_the_adjusted_p():
    a, b = [35.0, 35.2, 35.1], [34.0, 34.1, 34.3]
    assert verdict(a, b, 0.01) == "higher" and verdict(b, a, 0.049) == "lower"
    assert verdict(a, b, 0.06).startswith("no difference found (detectable: ") and verdict(a, b, None) == "no test"


def p_value(cell: str) -> float:
    return 0.0005 if cell == "< 0.001" else float(cell)


def test_every_verdict_in_the_results_follows_its_holm_adjusted_p():
    """results/README.md: over the page's family (every distinct seed-level comparison of its generated tables, one
    comparison printed twice counted once), each adjusted p is Holm's over the raw p (to the printed rounding), and
    each verdict is the one its adjusted p gives, no null shows a gap larger than its detectable difference, and the
    family's size is the one the text states; no null result is called "level with"."""
    text = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    tables = generated_tables(text)
    assert len(tables) >= 5
    tests = {}  # (row's BLEU cell, reference's BLEU cell) -> (row, reference, raw, adjusted, verdict, row mean - ref)
    for rows in tables:
        # a row's BLEU cell and its seed count name its comparison (two rows may print the same mean ± std)
        bleu = {row["row"]: f'{row["sacreBLEU (mean ± std)"]} ({row["seeds"]})' for row in rows}
        for row in (r for r in rows if r["vs"]):
            columns = (row[c].split(" / ") for c in ("vs", "p (seeds, Welch)", "p (Holm, all tables)",
                                                     "verdict (Holm, family-wise 0.05)"))
            for against, raw, adjusted, word in zip(*columns):
                key = (bleu[row["row"]], bleu[against])
                gap = float(bleu[row["row"]].split()[0]) - float(bleu[against].split()[0])
                assert tests.setdefault(key, (raw, adjusted, word, gap)) == (raw, adjusted, word, gap), key
    family = {key: t for key, t in tests.items() if t[0] != "n < 3 seeds"}
    assert len(family) >= 20
    recomputed = dict(zip(family, holm([p_value(t[0]) for t in family.values()])))
    for key, (raw, adjusted, word, gap) in family.items():
        assert p_value(adjusted) == pytest.approx(recomputed[key], abs=0.0005 * len(family) + 0.001), key
        if p_value(adjusted) < ALPHA:
            assert word == ("higher" if gap > 0 else "lower"), (key, word)
        else:
            assert word.startswith("no difference found (detectable: "), (key, word)
            detectable = float(word.split(": ")[1].rstrip(")"))
            assert abs(gap) <= detectable + 0.01, f"{key}: a null whose gap {gap:+.2f} exceeds its detectable {word}"
    printed = re.search(r"page's (\d+) seed-level comparisons", " ".join(text.split()))
    assert printed and int(printed.group(1)) == len(family), "the family's size as the page states it"
    assert all(t[1] == "n < 3 seeds" and t[2] == "no test" for key, t in tests.items() if key not in family)
    for page in (ROOT / "results" / "README.md", ROOT / "README.md"):
        assert "level with" not in page.read_text(encoding="utf-8"), page


def agrees_with(printed: str, cell: str) -> bool:
    """A p the prose prints (0.17, 0.053, < 0.001) is the table's cell (0.173, 0.053, < 0.001) to its own digits."""
    if "<" in printed or "<" in cell:
        return printed.replace(" ", "") == cell.replace(" ", "")
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(float(printed) - float(cell)) <= 0.5 * 10 ** -decimals + 1e-9


def test_every_corrected_p_the_text_quotes_is_a_computed_comparison_and_says_its_verdict():
    """A sentence of results/README.md that quotes a comparison ("p = 0.002, adjusted 0.053: no difference found")
    quotes one the page's tables computed (its raw and Holm-adjusted p, to the digits printed), and the verdict word
    it gives, where it gives one, is that comparison's: a verdict is computed, never written beside a stale p."""
    text = (ROOT / "results" / "README.md").read_text(encoding="utf-8")
    computed = [(row["p (seeds, Welch)"].split(" / ")[i], row["p (Holm, all tables)"].split(" / ")[i],
                 row["verdict (Holm, family-wise 0.05)"].split(" / ")[i])
                for rows in generated_tables(text) for row in rows if row["vs"]
                for i in range(len(row["vs"].split(" / ")))]
    prose = re.sub(r"<!-- results:(\S+) -->.*?<!-- /results:\1 -->", "", text, flags=re.DOTALL)
    quoted = re.findall(r"p\s+=\s+(< 0\.001|[\d.]+\d),\s+adjusted\s+(< 0\.001|[\d.]+\d)(?::\s+(higher|lower|no "
                        r"difference found))?", prose)
    assert len(quoted) >= 10, quoted
    for raw, adjusted, word in quoted:
        matches = [c for c in computed if agrees_with(raw, c[0]) and agrees_with(adjusted, c[1])]
        assert matches, f"p = {raw}, adjusted {adjusted}: no comparison of the page's tables"
        if word:
            assert any(c[2].startswith(word) for c in matches), (raw, adjusted, word, matches)
