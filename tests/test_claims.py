"""Comparative sentences are computed, not written (nmt/lab/claims.py): every sentence of the results page, the README
and docs/ that compares rows cites a comparison the page's tables computed, says what it says, and shows the clause
those tables give today; a chance level cites the shortcut check's figure."""

from pathlib import Path

import pytest

from nmt.lab.claims import (Comparison, chance_uncited, cite, cite_percentages, comparisons, disagreements,
                            percent_uncited, row_means, uncited, unsupported_claims)
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
    assert cite_percentages(text, row_means((ROOT / "results" / "README.md").read_text(encoding="utf-8"))) == text
    assert percent_uncited(text) == []
    assert unsupported_claims(text, computed) == []


def test_a_percentage_of_a_row_is_computed_from_the_table():
    """The page's sentence "23% and 28% of sinusoids' score" had the shares of the gap, not of the score: a
    percentage of a row is a pct marker that the page's means fill; one written by hand is found."""
    means = {"en-de.none": 26.49, "en-de.absolute": 34.24, "en-fr.none": 36.65, "en-fr.absolute": 50.67}
    written = "No positions reach 23% and 28% of sinusoids' score."
    assert percent_uncited(written) == [written]
    marked = "No positions reach <!-- pct en-de.none/en-de.absolute, en-fr.none/en-fr.absolute -->23% and 28%<!-- /pct --> of sinusoids' score."
    assert cite_percentages(marked, means) == marked.replace("23% and 28%", "77% and 72%")
    assert percent_uncited(marked) == [] and percent_uncited("relative's edge tables are 1.3% of the model") == []
    with pytest.raises(ValueError, match="no rows en-de.none/en-de.rope"):
        cite_percentages("<!-- pct en-de.none/en-de.rope -->1%<!-- /pct -->", means)


LEARNED_LOWER = Comparison(-2.70, "< 0.001", "0.024", "lower")
KINDS = {"l/a": LEARNED_LOWER, "l/r": LEARNED_LOWER, "l/b": NULL, "s/r": NULL, "c/d": HIGHER, "a/b": NULL}


@pytest.mark.parametrize("kind, sentence", [
    ("superlative", "Learned positions are the worst of the four (<!-- cmp l/a, l/r -->x<!-- /cmp -->)."),  # vs both?
    ("superlative", "Learned positions are the worst of the three (<!-- cmp l/a, l/b -->x<!-- /cmp -->)."),  # a null
    ("gain", "The gain of relative positions over absolute ones is not a gain of learned over fixed positions."),
    ("gain", "The gain of relative over absolute (<!-- cmp a/b -->x<!-- /cmp -->) is small."),  # a null is no gain
    ("universal", "Only T5's differs, so its rows are the only ones trained again."),
    ("universal", "ALiBi cannot attend at an offset the query names."),
    ("universal", "Two or more relative layers reach every distance tested, whatever k."),
    ("recommendation", "Sharing the tables showed no difference (<!-- cmp s/r -->x<!-- /cmp -->): relative with "
                       "shared tables deploys."),
])
def test_a_claim_that_needs_a_test_or_a_table_is_found_by_its_kind(kind, sentence):
    assert [found.split(": ", 1)[0] for found in unsupported_claims(sentence, KINDS)] == [kind]


@pytest.mark.parametrize("sentence", [
    "Learned positions are the worst of the three (<!-- cmp l/a, l/r -->x<!-- /cmp -->).",
    "Learned positions have the lowest mean of the four (one seed, no test).",
    "T5 at its rate gains over T5 (<!-- cmp c/d -->x<!-- /cmp -->), the gain of a rate.",
    "RoPE and ALiBi stay within 1.1x of SDPA at every length measured.",
    "Sharing the tables showed no difference (<!-- cmp s/r -->x<!-- /cmp -->), which leaves smaller differences "
    "open: relative with shared tables deploys, at a cost not measured below that size.",
])
def test_a_claim_with_its_test_or_its_hedge_passes(sentence):
    assert unsupported_claims(sentence, KINDS) == []


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
