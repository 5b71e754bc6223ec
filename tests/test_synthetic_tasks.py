"""The synthetic tasks' shortcut check (experiments/shortcuts.py): no fixed offset and no fixed absolute position
holds more of a task's answers than chance, at every evaluation length; the check finds a shortcut where there is
one; and a model without the mechanism a task claims to need (`none`: no position at all) fails it."""

import json

import pytest
import torch

from experiments.extrapolate import EVAL_LENGTHS, OUTPUTS, REPEAT_SYMBOLS, repeat_batch, repeat_symbols, shortcuts
from experiments.reach import FIRST_TOKEN, MAX_DISTANCE, SYMBOLS, batch, offset_symbols
from experiments.shortcuts import shortcut_shares
from tests.conftest import ROOT


def test_a_repeat_query_asks_for_the_successor_of_its_symbol_in_the_first_half():
    for length in (40, 320):
        tokens, targets = repeat_batch(8, torch.Generator().manual_seed(3), length)
        half, symbols = length // 2, tokens - FIRST_TOKEN
        first, queries = symbols[:, :half], symbols[:, half:]
        assert (first < REPEAT_SYMBOLS).all() and (queries >= REPEAT_SYMBOLS).all()  # queries: their own tokens
        assert all(len(set(row.tolist())) == half for row in first)
        assert all(sorted(q.tolist()) == sorted((f + REPEAT_SYMBOLS).tolist()) for q, f in zip(queries, first))
        assert not all(torch.equal(q - REPEAT_SYMBOLS, f) for q, f in zip(queries, first))  # shuffled, not repeated
        assert (targets[:, :half] == -100).all()
        for row in range(8):
            successor = {int(a): int(b) for a, b in zip(first[row, :-1], first[row, 1:])}
            for j in range(half, length):
                asked = int(queries[row, j - half]) - REPEAT_SYMBOLS
                assert int(targets[row, j]) == successor.get(asked, -100)  # the last symbol has no successor


@pytest.mark.parametrize("length", EVAL_LENGTHS)
def test_no_fixed_offset_or_position_holds_the_repeat_tasks_answer(length):
    """Chance: one of the N/2 - 1 successors. The old design (the first half repeated in order) had 100% at +1."""
    chance = 1 / (length // 2 - 1)
    shares = shortcuts("repeat", length, seed=1)
    assert shares["offset"] < 1.5 * chance and shares["position"] < 1.5 * chance, shares


@pytest.mark.parametrize("length", EVAL_LENGTHS)
def test_one_fixed_offset_holds_about_one_in_24_of_the_offset_tasks_answers(length):
    """Each token names its own offset d = 1..24: a fixed offset holds the answers of one d (about 1/24, a little
    more for small d in short sequences) beyond the symbols that match by chance (1/16)."""
    shares = shortcuts("offset", length, seed=1)
    for key in ("offset", "position"):
        beyond_chance = (shares[key] - 1 / SYMBOLS) / (1 - 1 / SYMBOLS)
        assert beyond_chance < 2 / MAX_DISTANCE, shares


def test_the_check_finds_a_shortcut_where_there_is_one():
    generator = torch.Generator().manual_seed(1)
    first = torch.rand(64, REPEAT_SYMBOLS, generator=generator).argsort(-1)[:, :20]
    targets = torch.cat([torch.full((64, 20), -100), first[:, 1:], torch.full((64, 1), -100)], 1)
    old = shortcut_shares(torch.cat([first, first], 1), targets)  # the old repeat task: the first half again
    assert old["offset"] == 1.0 and old["best_offset"] in (-19, 1)  # N/2 - 1 back, or the right neighbour
    tokens, targets = batch(64, generator, distance=5)  # the offset task at one distance
    assert shortcut_shares(offset_symbols(tokens), targets)["offset"] == 1.0
    tokens, targets = repeat_batch(64, generator, 40)
    targets[:, 20:] = torch.where(targets[:, 20:] >= 0, repeat_symbols(tokens)[:, :1], -100)  # always symbol 0
    assert shortcut_shares(repeat_symbols(tokens), targets)["position"] == 1.0


def test_the_check_counts_content_shortcuts_too():
    """Counting and content matching are shortcuts as well: the offset task's commonest symbol beats 1/16 (what a
    model without positions scores), and the repeat task is solved whole by an induction head (the symbol after the
    previous occurrence of the query's symbol), so it cannot bear on how exactly far offsets are resolved."""
    shares = shortcuts("offset", 40, seed=1)
    assert 1.5 / SYMBOLS < shares["mode"] == pytest.approx(0.14, abs=0.02) and shares["best"] >= shares["mode"]
    tokens, targets = repeat_batch(128, torch.Generator().manual_seed(1), 40)
    repeat = shortcut_shares(repeat_symbols(tokens), targets)
    assert repeat["after_previous"] == repeat["best"] == 1.0 and repeat["offset"] < 0.1
    symbols = torch.tensor([[3, 3, 1, 2, 3, 1, 0]])  # hand-checked: the commonest symbol is 3, overall and at j - 3
    answers = torch.tensor([[-100, -100, -100, 3, 3, 3, 1]])
    checked = shortcut_shares(symbols, answers, beyond=3)
    assert checked["mode"] == 0.75 and checked["mode_beyond"] == 0.75 and checked["after_previous"] == 0.0


def test_the_committed_repeat_runs_record_their_shortcut_shares_and_none_fails():
    records = [json.loads(p.read_text()) for p in sorted((ROOT / OUTPUTS["repeat"]).glob("*_seed*.json"))]
    assert {r["mode"] for r in records} >= {"none", "relative:2"}
    for record in records:
        for length in map(str, EVAL_LENGTHS):
            assert record["shortcut_shares"][length]["offset"] < 1.5 / (int(length) // 2 - 1)
    for record in (r for r in records if r["mode"] == "none"):  # no position: it cannot tell which symbol follows
        assert all(a < 0.1 for a in record["accuracy"].values()), record["accuracy"]


def test_the_marker_tasks_shortcuts_are_chance_and_a_model_without_offsets_stays_at_them():
    """experiments/edge_values.py's marker task: positions alone answer about 1/16 (the marker is anywhere), content
    alone 1/16 + 15/16 * 1/16 (the marker knows its offset is 0); the committed runs without edge vectors score at
    the content shortcut, and every edge set that reads offsets far above it."""
    from experiments.edge_values import marker_shortcuts

    shares = marker_shortcuts(seed=1)
    assert shares["position"] == pytest.approx(1 / 16, abs=0.012)
    assert shares["content"] == pytest.approx(1 / 16 + 15 / 256, abs=0.008) and shares["best"] == shares["content"]
    for path in sorted((ROOT / "results" / "edge_values").glob("marker_*_seed1.json")):
        run = json.loads(path.read_text())
        if run["edges"] == "neither":
            assert run["score"] <= shares["best"] + 0.01, path.name
        else:
            assert run["score"] > 2 * shares["best"], path.name


def test_the_window_shortcut_is_the_commonest_symbol_of_the_places_to_the_left():
    """mode_window: what a content-blind bias spread over the `window` places left of j reads, against a literal
    count at every place."""
    generator = torch.Generator().manual_seed(0)
    symbols, targets = torch.randint(0, 5, (7, 30), generator=generator), torch.randint(0, 5, (7, 30), generator=generator)
    right = 0
    for i in range(7):
        for j in range(1, 30):
            right += int(torch.bincount(symbols[i, max(0, j - 6):j], minlength=5).argmax()) == int(targets[i, j])
    assert shortcut_shares(symbols, targets, window=6)["mode_window"] == pytest.approx(right / (7 * 30))


def test_a_weighted_share_is_the_mean_of_each_distances_share():
    """The offset task's accuracy is a mean over d: weights of 1 / (answers of its d) give each d's share alike."""
    generator = torch.Generator().manual_seed(1)
    parts = [batch(64, generator, d, 40) for d in (1, 20)]
    tokens, targets = torch.cat([t for t, _ in parts]), torch.cat([a for _, a in parts])
    answers = torch.cat([(a >= 0).sum().double().expand(len(a)) for _, a in parts])[:, None]
    weighted = shortcut_shares(offset_symbols(tokens), targets, weights=(1 / answers).expand_as(targets))
    each = [shortcut_shares(offset_symbols(t), a, chosen={"best_offset": -1, "best_position": 0}) for t, a in parts]
    chosen = shortcut_shares(offset_symbols(tokens), targets, weights=(1 / answers).expand_as(targets),
                             chosen={"best_offset": -1, "best_position": 0})
    assert chosen["offset"] == pytest.approx(sum(e["offset"] for e in each) / 2)  # d = 1 all right, d = 20 chance
    assert chosen["mode"] == pytest.approx(sum(e["mode"] for e in each) / 2)
    assert weighted["offset"] >= chosen["offset"] > 0.5


def test_population_chance_levels_are_the_tasks_own():
    """The repeat task's fixed offset and the marker task's position answer one of N/2 - 1 successors and one of 16
    answers by chance; picked on one sample and measured on another, their shares are those, not the maximum of a
    sample's noise (the evaluation batch of seed 1 gave 0.056 and 0.070)."""
    from experiments.chance import population_shares

    repeat = population_shares("repeat", 40)
    assert repeat["offset"] == pytest.approx(1 / 19, abs=0.002) and repeat["position"] == pytest.approx(1 / 19, abs=0.002)
    marker = population_shares("marker", 16)
    assert marker["position"] == pytest.approx(1 / 16, abs=0.004) and marker["constant"] == pytest.approx(1 / 16, abs=0.004)
