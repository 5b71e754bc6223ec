"""Comparative sentences are computed, not written (nmt/lab/claims.py): every sentence of the results page, the README
and docs/ that compares rows cites a comparison the page's tables computed, says what it says, and shows the clause
those tables give today; a chance level cites the shortcut check's figure."""

from pathlib import Path

import pytest

from nmt.lab.claims import Comparison, chance_uncited, cite, comparisons, disagreements, uncited
from tests.conftest import ROOT

PAGES = [ROOT / "results" / "README.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
NULL = Comparison(0.73, "0.058", "0.467", "no difference found (detectable: 1.72)")
HIGHER = Comparison(3.64, "0.002", "0.047", "higher")
UNTESTED = Comparison(-8.04, "n < 3 seeds", "n < 3 seeds", "no test")
COMPUTED = {"a/b": NULL, "c/d": HIGHER, "k0/k16": UNTESTED}


def cited(sentence: str) -> str:
    return cite(sentence, COMPUTED)


@pytest.mark.parametrize("sentence", [
    "Relative is higher than absolute (<!-- cmp a/b --><!-- /cmp -->).",  # a null result called "higher"
    "T5 at its rate is level with T5 (<!-- cmp c/d --><!-- /cmp -->).",  # a shown difference called level
    "T5 at its rate trails T5 by the means (<!-- cmp c/d --><!-- /cmp -->).",  # the means' sign is +3.64
    "k = 0 is behind k = 16 (<!-- cmp k0/k16 --><!-- /cmp -->).",  # no test: only the means may be compared
    "Relative is above absolute (<!-- cmp a/x --><!-- /cmp -->).",  # no such comparison
])
def test_a_word_that_disagrees_with_its_comparison_fails(sentence):
    assert disagreements(sentence, COMPUTED)


@pytest.mark.parametrize("sentence", [
    "Relative's mean is above absolute's, but no difference is found (<!-- cmp a/b --><!-- /cmp -->).",
    "T5 at its rate is higher than T5 (<!-- cmp c/d --><!-- /cmp -->), and not found below relative "
    "(<!-- cmp a/b --><!-- /cmp -->).",
    "k = 0's mean is far behind k = 16's (<!-- cmp k0/k16 --><!-- /cmp -->).",
])
def test_a_word_that_says_what_its_comparison_says_passes(sentence):
    assert disagreements(sentence, COMPUTED) == []


def test_a_comparative_sentence_without_a_computed_comparison_is_found():
    assert uncited("RoPE has the highest mean of the single schemes. The table below has the rows.\n") == [
        "RoPE has the highest mean of the single schemes."]
    assert uncited("RoPE is above relative (<!-- cmp a/b --><!-- /cmp -->). RoPE beats T5 (one seed, no test).") == []
    assert uncited("T5 is lower (p = 0.002, adjusted 0.043: lower).") == []  # quoted: tests/test_significance.py
    after = "RoPE is above relative (<!-- cmp a/b --><!-- /cmp -->), and T5 trails ALiBi."  # the cited words come first
    assert uncited(after) == [after]


def test_the_clause_is_written_from_the_comparison():
    assert cited("(<!-- cmp c/d, k0/k16 -->stale<!-- /cmp -->)") == (
        "(<!-- cmp c/d, k0/k16 -->+3.64 BLEU, p = 0.002, adjusted 0.047: higher; "
        "-8.04 BLEU, n < 3 seeds: no test<!-- /cmp -->)")
    assert "no difference found, detectable 1.72" in cited("<!-- cmp a/b --><!-- /cmp -->")
    with pytest.raises(ValueError, match="no comparison a/x"):
        cited("<!-- cmp a/x --><!-- /cmp -->")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_comparative_sentence_cites_a_computed_comparison_and_says_what_it_says(page: Path):
    """results/README.md's tables are the comparisons: a page's citation shows the clause they give (run
    `relnmt-table results/README.md --cite README.md docs/*.md` after a table changes), its words agree with it,
    and no sentence compares rows without one (or without saying it describes untested runs)."""
    computed = comparisons((ROOT / "results" / "README.md").read_text(encoding="utf-8"))
    assert len(computed) >= 40
    text = page.read_text(encoding="utf-8")
    assert cite(text, computed) == text, f"{page}: a citation is stale; run make plots (relnmt-table --cite)"
    assert disagreements(text, computed) == []
    assert uncited(text) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_chance_level_cites_the_shortcut_check(page: Path):
    assert chance_uncited(page.read_text(encoding="utf-8")) == []
    assert chance_uncited("Sinusoids stay at chance (0.053).") == ["Sinusoids stay at chance (0.053)."]
    assert chance_uncited("T5 is 0.11 above the best shortcut (0.167).") == ["T5 is 0.11 above the best shortcut (0.167)."]


@pytest.mark.slow
def test_every_chance_level_is_the_shortcut_checks_figure():
    """Each chance marker's figure is the shortcut share it names, computed again (`python -m experiments.chance
    --cite FILE` writes them)."""
    from experiments.chance import cite_chance

    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert cite_chance(text) == text, page
