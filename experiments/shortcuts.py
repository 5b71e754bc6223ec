"""The shortcut check of every synthetic task: how much of a task's answer a model could read at one fixed place.

A task that claims to test a mechanism (find a token by its content at any distance, or at an offset the token
itself names) must not be solvable by looking at one fixed offset, or at one fixed absolute position. For a batch,
`shortcut_shares` gives the best share of the targets that the token at a single fixed offset (every offset the
sequence allows, so every window up to the sequence's length) or at a single fixed absolute position holds. Each
study records these shares beside its accuracies, and tests/test_synthetic_tasks.py asserts them near chance.
"""

from __future__ import annotations

import torch


def shortcut_shares(symbols: torch.Tensor, targets: torch.Tensor, max_offset: int | None = None) -> dict:
    """symbols (n, length): the answer value each token carries (what a head reading that token could copy);
    targets (n, length): the answers, -100 where there is none. Returns {"offset": best share of targets equal to
    the symbol at j + o over every fixed o with 0 < |o| <= max_offset (default: length - 1), "best_offset": that o,
    "position": best share equal to the symbol at one fixed position p, "best_position": that p}. A position or
    offset past the sequence's ends holds no answer."""
    n, length = symbols.shape
    max_offset = length - 1 if max_offset is None else max_offset
    keep = targets >= 0
    total = int(keep.sum())
    positions = torch.arange(length)

    def share(source: torch.Tensor) -> float:  # source (length,) or (n, length): where to read each target
        inside = (source >= 0) & (source < length)
        read = symbols.gather(1, source.clamp(0, length - 1).expand(n, length))
        return int((keep & inside & (read == targets)).sum()) / total

    offsets = {o: share(positions + o) for o in range(-max_offset, max_offset + 1) if o}
    fixed = {p: share(torch.full((length,), p)) for p in range(length)}
    best_offset, best_position = max(offsets, key=offsets.get), max(fixed, key=fixed.get)
    return {"offset": offsets[best_offset], "best_offset": best_offset,
            "position": fixed[best_position], "best_position": best_position}
