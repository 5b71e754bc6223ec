"""The shortcut check of every synthetic task: how much of a task's answer a model could get without the mechanism
the task claims to test.

A task that claims to test a mechanism (find a token by its content at any distance, or at an offset the token
itself names) must not be solvable by looking at one fixed offset or one fixed absolute position, nor by counting.
For a batch, `shortcut_shares` gives the share of the targets that each shortcut gets right: the token at the best
single fixed offset (every offset the sequence allows, so every window up to the sequence's length) or at the best
single fixed absolute position; the sequence's most frequent symbol (a head that averages over every key and reads
the commonest value); the most frequent symbol `beyond` or more places to the left (what a window of k = beyond - 1
still sees beyond itself, through its shared far vector); and the symbol after the previous occurrence of the
query's own symbol (an induction head: content matching plus offset 1). "best" is the highest of them: the chance
level a study's accuracy must beat. Each study records these shares beside its accuracies, and
tests/test_synthetic_tasks.py asserts them.
"""

from __future__ import annotations

import torch


def shortcut_shares(symbols: torch.Tensor, targets: torch.Tensor, max_offset: int | None = None,
                    beyond: int | None = None, window: int | None = None, weights: torch.Tensor | None = None,
                    chosen: dict | None = None) -> dict:
    """symbols (n, length): the answer value each token carries (what a head reading that token could copy);
    targets (n, length): the answers, -100 where there is none. Returns {"offset": best share of targets equal to
    the symbol at j + o over every fixed o with 0 < |o| <= max_offset (default: length - 1), "best_offset": that o,
    "position": best share equal to the symbol at one fixed position p, "best_position": that p, "mode": share equal
    to the row's most frequent symbol, "after_previous": share equal to the symbol after the previous occurrence of
    the symbol at j, and with `beyond`, "mode_beyond": share equal to the most frequent symbol at positions <= j -
    beyond; with `window`, "mode_window": share equal to the most frequent symbol among the `window` places left of j
    (what a content-blind bias that spreads a head over them reads); "best": the highest share}. A position or offset
    past the sequence's ends holds no answer; ties go to the smallest symbol. `weights` (n, length): each target's
    weight in every share (default: alike), so a share can be weighted as a study's accuracy is. `chosen`: the
    "best_offset" and "best_position" picked on another sample, whose shares this batch measures (the best of many
    on the batch that picks it is biased up by its sampling noise)."""
    n, length = symbols.shape
    max_offset = length - 1 if max_offset is None else max_offset
    keep = targets >= 0
    weight = (torch.ones(n, length, dtype=torch.float64) if weights is None else weights.double()) * keep
    total = float(weight.sum())
    positions = torch.arange(length)

    def share(source: torch.Tensor) -> float:  # source (length,) or (n, length): where to read each target
        inside = (source >= 0) & (source < length)
        read = symbols.gather(1, source.clamp(0, length - 1).expand(n, length))
        return float((weight * (inside & (read == targets))).sum()) / total

    def right(guess: torch.Tensor) -> float:  # guess (n, length): a predicted answer per place, -1 for none
        return float((weight * (guess == targets)).sum()) / total

    offsets = {o: share(positions + o) for o in ([chosen["best_offset"]] if chosen else
                                                 range(-max_offset, max_offset + 1)) if o}
    fixed = {p: share(torch.full((length,), p)) for p in ([chosen["best_position"]] if chosen else range(length))}
    best_offset, best_position = max(offsets, key=offsets.get), max(fixed, key=fixed.get)
    found = {"offset": offsets[best_offset], "best_offset": best_offset,
             "position": fixed[best_position], "best_position": best_position}
    counts = torch.nn.functional.one_hot(symbols, int(symbols.max()) + 1).cumsum(1)  # (n, length, symbols): up to p
    found["mode"] = right(counts[:, -1].argmax(-1, keepdim=True).expand(n, length))
    if beyond is not None:  # the commonest symbol at j - beyond or further left; none where there is no such place
        seen = torch.cat([torch.zeros_like(counts[:, :beyond]), counts[:, :length - beyond]], 1)
        found["mode_beyond"] = right(torch.where(seen.sum(-1) > 0, seen.argmax(-1), -1))
    if window is not None:  # the commonest symbol among places j - window .. j - 1
        before = torch.cat([torch.zeros_like(counts[:, :1]), counts[:, :-1]], 1)  # counts up to j - 1
        start = torch.cat([torch.zeros_like(counts[:, :window + 1]), counts[:, :length - window - 1]], 1)[:, :length]
        seen = before - start  # counts over j - window .. j - 1
        found["mode_window"] = right(torch.where(seen.sum(-1) > 0, seen.argmax(-1), -1))
    last = torch.full_like(symbols, -1)  # the previous occurrence's place of the symbol at j, -1 for none
    seen = torch.full((n, int(symbols.max()) + 1), -1)  # each symbol's latest place so far: O(n x symbols) memory
    for j in range(length):
        here = symbols[:, j:j + 1]
        last[:, j:j + 1] = seen.gather(1, here)
        seen.scatter_(1, here, j)
    after = symbols.gather(1, (last + 1).clamp(0, length - 1))
    found["after_previous"] = right(torch.where((last >= 0) & (last + 1 < length), after, -1))
    found["best"] = max(found[k] for k in ("offset", "position", "mode", "mode_beyond", "mode_window", "after_previous")
                        if k in found)
    return found
