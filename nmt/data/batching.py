"""Token-budget, length-bucketed batches, deterministic given (seed, epoch), sharded by DDP rank."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from nmt.data.shards import Shard
from nmt.model import BOS, EOS, PAD


def make_batches(src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int,
                 seed: int, epoch: int, world_size: int = 1) -> list[np.ndarray]:
    """All batches of one epoch (every pair exactly once), in the order the ranks consume them.

    Lengths include the EOS/BOS each side gets. A batch's cost is its padded size on the longer
    side, sentences x max(longest source, longest target), as fairseq's --max-tokens; it never
    exceeds max_tokens. Pairs are sorted by length (random tie-breaking) so batches hold similar
    lengths, then the batch order is shuffled. The count is made divisible by world_size by
    splitting the largest batches, so every rank runs the same number of steps.
    """
    longest = np.maximum(src_lengths, tgt_lengths)
    if len(longest) and longest.max() > max_tokens:
        raise ValueError(f"a pair of {longest.max()} tokens exceeds train.max_tokens={max_tokens}; "
                         f"raise max_tokens or lower data.max_len")
    rng = np.random.default_rng([seed, epoch])
    order = np.lexsort((rng.random(len(longest)), longest))  # by length, ties shuffled
    batches, start, width = [], 0, 0
    for position, index in enumerate(order):
        width_with = max(width, longest[index])
        if position > start and (position - start + 1) * width_with > max_tokens:
            batches.append(order[start:position])
            start, width_with = position, longest[index]
        width = width_with
    if start < len(order):
        batches.append(order[start:])
    while len(batches) % world_size:
        largest = max(range(len(batches)), key=lambda b: len(batches[b]))
        if len(batches[largest]) < 2:
            raise ValueError(f"{len(longest)} pairs cannot be spread evenly over {world_size} ranks")
        half = len(batches[largest]) // 2
        batches[largest:largest + 1] = [batches[largest][:half], batches[largest][half:]]
    return [batches[i] for i in rng.permutation(len(batches))]


def rank_batches(batches: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray]:
    return batches[rank::world_size]


@dataclass
class Batch:
    src: torch.Tensor  # (B, Ns) ids + EOS, right-padded
    tgt_in: torch.Tensor  # (B, Nt) BOS + ids, right-padded
    tgt_out: torch.Tensor  # (B, Nt) ids + EOS, right-padded

    def to(self, device) -> "Batch":
        return Batch(*(t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out)))

    @property
    def target_tokens(self) -> int:
        return int(self.tgt_out.ne(PAD).sum())


def pad_rows(rows: list[np.ndarray], prefix: int | None = None, suffix: int | None = None) -> torch.Tensor:
    extra = (prefix is not None) + (suffix is not None)
    out = torch.full((len(rows), max(len(r) for r in rows) + extra), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        ids = torch.from_numpy(row.astype(np.int64))
        start = 0
        if prefix is not None:
            out[i, 0] = prefix
            start = 1
        out[i, start : start + len(ids)] = ids
        if suffix is not None:
            out[i, start + len(ids)] = suffix
    return out


def collate(shard: Shard, indices: np.ndarray) -> Batch:
    pairs = [shard[int(i)] for i in indices]
    return Batch(
        src=pad_rows([s for s, _ in pairs], suffix=EOS),
        tgt_in=pad_rows([t for _, t in pairs], prefix=BOS),
        tgt_out=pad_rows([t for _, t in pairs], suffix=EOS),
    )


def epoch_batches(shard: Shard, max_tokens: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                  start: int = 0):
    """(position, Batch) for this rank's batches of one epoch, from position `start` (resume)."""
    batches = make_batches(shard.src_lengths + 1, shard.tgt_lengths + 1, max_tokens, seed, epoch, world_size)
    mine = rank_batches(batches, rank, world_size)
    for position in range(start, len(mine)):
        yield position, collate(shard, mine[position])
