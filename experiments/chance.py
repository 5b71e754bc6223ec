"""The page's chance levels written again: every chance marker (nmt/lab/claims.py CHANCE) gets the population value
of the shortcut share it names (experiments/shortcuts.py), weighted as its task's accuracy is.

A study's evaluation batch is a sample; the best of many shortcuts on it is the maximum of sampling noise, above the
value the task has. The population value is the share on a sample POPULATION times the evaluation's size, drawn
apart from every study's, weighted as the study weights its answers: the offset task's accuracy is the mean over d
of each distance's accuracy, so each d weighs 1/24 whatever its count of answers; the repeat and marker tasks'
accuracy is pooled over answers, so each answer weighs alike.

    python -m experiments.chance --cite results/README.md README.md
"""

from __future__ import annotations

import functools

import torch

from nmt.lab.claims import CHANCE

from experiments.edge_values import MARKER_RULES, marker_batch
from experiments.extrapolate import PER_DISTANCE, REPEAT_EVAL, repeat_batch, repeat_symbols
from experiments.reach import MAX_DISTANCE, batch, offset_symbols
from experiments.shortcuts import shortcut_shares

POPULATION = 4  # times a study's evaluation sample: the share's sampling error about 0.001
SEED = 50_000  # the population's generator: no study draws from it


@functools.cache
def population_shares(task: str, length: int, beyond: int | None = None) -> dict:
    """The shortcut shares of `task` at `length` (the marker task: its one length) as population values: every shortcut
    that picks the best of many (an offset, a position, the commonest answer per key) picks on one sample and is
    measured on another, each POPULATION times the study's evaluation sample, weighted as the task's accuracy is (this
    module's docstring); the offset task's include the commonest symbol among the MAX_DISTANCE places to the left
    ("mode_window": a content-blind bias spread over the task's distances)."""
    if task == "marker":
        return marker_population(torch.Generator().manual_seed(SEED))
    chosen, (symbols, targets, weights) = picked_and_measured(task, length)
    return shortcut_shares(symbols, targets, beyond=beyond, window=MAX_DISTANCE if task == "offset" else None,
                           weights=weights, chosen=chosen)


@functools.cache
def picked_and_measured(task: str, length: int) -> tuple[dict, tuple]:
    """The offset and position the selection sample picks, and the measuring sample (symbols, targets, weights)."""
    generator = torch.Generator().manual_seed(SEED)

    def sample() -> tuple:
        if task == "repeat":
            tokens, targets = repeat_batch(REPEAT_EVAL * POPULATION, generator, length)
            return repeat_symbols(tokens), targets, None
        parts = [batch(PER_DISTANCE * POPULATION, generator, d, length) for d in range(1, MAX_DISTANCE + 1)]
        tokens, targets = torch.cat([t for t, _ in parts]), torch.cat([a for _, a in parts])
        answers = torch.cat([(a >= 0).sum().double().expand(len(a)) for _, a in parts])[:, None]  # each d's count
        return offset_symbols(tokens), targets, (1.0 / answers).expand_as(targets)
    symbols, targets, weights = sample()
    shares = shortcut_shares(symbols, targets, weights=weights)
    return {key: shares[key] for key in ("best_offset", "best_position")}, sample()


def marker_population(generator: torch.Generator) -> dict:
    """experiments/edge_values.py's MARKER_RULES (the commonest answer for each value of what a rule reads) with each
    value's commonest answer picked on one sample and measured on another."""
    (picked, answers), (tokens, target) = (marker_batch(2048 * POPULATION, generator) for _ in range(2))
    found = {}
    for rule, read in MARKER_RULES.items():
        keys, measured = read(picked), read(tokens)
        commonest = torch.full((int(max(keys.max(), measured.max())) + 1,), -1)
        for k in keys.unique():
            commonest[k] = torch.bincount(answers[keys == k]).argmax()
        found[rule] = float((commonest[measured] == target).double().mean())
    return {**found, "best": max(found.values())}


def cite_chance(text: str) -> str:
    """The text with every chance marker's figure (nmt/lab/claims.py CHANCE) computed again: the population value of
    the shortcut share it names (population_shares)."""
    def figure(marker) -> str:
        share, _, beyond = marker.group("share").partition("@")
        shares = population_shares(marker.group("task"), int(marker.group("length")), int(beyond) if beyond else None)
        return marker.group(0).replace(f"-->{marker.group('figure')}<!--", f"-->{shares[share]:.3f}<!--", 1)
    return CHANCE.sub(figure, text)


def main(argv: list[str] | None = None) -> None:
    """python -m experiments.chance --cite FILE ...: write the chance markers' figures of these files."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m experiments.chance", description=main.__doc__)
    parser.add_argument("--cite", nargs="+", type=Path, required=True, metavar="FILE")
    for path in parser.parse_args(argv).cite:
        text = path.read_text(encoding="utf-8")
        if (cited := cite_chance(text)) != text:
            path.write_text(cited, encoding="utf-8")
            print(f"{path}: chance levels written again")


if __name__ == "__main__":
    main()
