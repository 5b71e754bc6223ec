"""Token-budget, length-bucketed batches, deterministic given (seed, epoch), sharded by DDP rank."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import numpy as np
import torch

from nmt.data.shards import EncodedSplit
from nmt.data.vocab import BOS, EOS, PAD


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
    target_tokens: int  # real tokens of tgt_out, counted on the host: reading it never waits for a device

    def pin_memory(self) -> "Batch":
        return Batch(*(t.pin_memory() for t in (self.src, self.tgt_in, self.tgt_out)), self.target_tokens)

    def to(self, device) -> "Batch":
        """On CUDA, an asynchronous copy from pinned memory: the host does not wait for it."""
        device = torch.device(device)
        if device.type != "cuda":
            return Batch(self.src.to(device), self.tgt_in.to(device), self.tgt_out.to(device), self.target_tokens)
        pinned = self if self.src.is_pinned() else self.pin_memory()
        return Batch(*(t.to(device, non_blocking=True) for t in (pinned.src, pinned.tgt_in, pinned.tgt_out)),
                     self.target_tokens)


def gather_padded(flat: np.ndarray, offsets: np.ndarray, indices: np.ndarray, prefix: int | None = None,
                  suffix: int | None = None) -> np.ndarray:
    """Sentences flat[offsets[i]:offsets[i+1]] for i in indices as one right-padded (B, N) int64 array.

    One vectorized gather, no loop per sentence: collation stays off the training step's critical path.
    """
    starts = offsets[indices]
    lengths = offsets[indices + 1] - starts
    shift = int(prefix is not None)
    width = int(lengths.max(initial=0)) + shift + int(suffix is not None)
    position = np.arange(width)[None, :] - shift  # index inside the sentence, (1, N)
    inside = (position >= 0) & (position < lengths[:, None])  # (B, N)
    take = np.where(inside, starts[:, None] + position, 0)
    out = np.where(inside, flat[take] if len(flat) else 0, PAD).astype(np.int64)
    if prefix is not None:
        out[:, 0] = prefix
    if suffix is not None:
        out[np.arange(len(indices)), lengths + shift] = suffix
    return out


def pad_rows(rows: list[np.ndarray], prefix: int | None = None, suffix: int | None = None) -> torch.Tensor:
    """Right-padded (B, N) long tensor of rows, with an optional first and last token on each."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if len(rows) else np.zeros(0, np.int64)
    return torch.from_numpy(gather_padded(flat, offsets, np.arange(len(rows)), prefix, suffix))


def collate(shard: EncodedSplit, indices: np.ndarray) -> Batch:
    indices = np.asarray(indices, dtype=np.int64)
    tgt_in = gather_padded(shard.tgt, shard.tgt_offsets, indices, prefix=BOS)
    tgt_out = gather_padded(shard.tgt, shard.tgt_offsets, indices, suffix=EOS)
    target_tokens = int((shard.tgt_offsets[indices + 1] - shard.tgt_offsets[indices]).sum()) + len(indices)
    return Batch(torch.from_numpy(gather_padded(shard.src, shard.src_offsets, indices, suffix=EOS)),
                 torch.from_numpy(tgt_in), torch.from_numpy(tgt_out), target_tokens)


def epoch_batches(shard: EncodedSplit, max_tokens: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                  start: int = 0):
    """(position, Batch) for this rank's batches of one epoch, from position `start` (resume)."""
    batches = make_batches(shard.src_lengths + 1, shard.tgt_lengths + 1, max_tokens, seed, epoch, world_size)
    mine = rank_batches(batches, rank, world_size)
    for position in range(start, len(mine)):
        yield position, collate(shard, mine[position])


def global_batches(shard: EncodedSplit, max_tokens: int, seed: int, epoch: int, start: int):
    """Endless (epoch, position after it, pair indices) of the one global sequence of batches, epoch after epoch,
    from a data position. It does not depend on the world size: a run on 1 device and on 8 sees the same batches."""
    if len(shard) == 0:  # an epoch without a batch would loop here for ever
        raise ValueError("the training split holds no pair: no batch can come")
    while True:
        batches = make_batches(shard.src_lengths + 1, shard.tgt_lengths + 1, max_tokens, seed, epoch)
        for position in range(start, len(batches)):
            yield epoch, position + 1, batches[position]
        epoch, start = epoch + 1, 0


def training_stream(shard: EncodedSplit, max_tokens: int, seed: int, rank: int, world_size: int, epoch: int,
                    start: int):
    """Endless (epoch, position, Batch) for this rank: the global sequence dealt out world_size at a time, rank r
    taking the r-th of each deal (fairseq's sharded iterator). The position is the global one after the whole deal,
    the same on every rank, so an update of F micro-batches per rank consumes global batches [u*W*F, (u+1)*W*F) and
    a resume on another world size continues the same sequence.

    It may run ahead of the trainer (Prefetcher), so the trainer keeps as its data position the last item it
    consumed, never how far the stream has read."""
    deal = []
    for item in global_batches(shard, max_tokens, seed, epoch, start):
        deal.append(item)
        if len(deal) == world_size:
            yield deal[-1][0], deal[-1][1], collate(shard, deal[rank][2])
            deal = []


class Prefetcher:
    """Runs an iterator in a background thread, `depth` items ahead, so batches are gathered (and pinned,
    for CUDA) while the device computes. Yields exactly what the iterator yields, in order; an exception
    in the iterator is raised here, at the item where it happened."""

    _END = object()

    def __init__(self, iterator, depth: int = 4, pin_memory: bool = False):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(iterator, pin_memory), daemon=True)
        self._thread.start()

    def _fill(self, iterator, pin_memory: bool) -> None:
        try:
            for item in iterator:
                if pin_memory:
                    item = tuple(x.pin_memory() if isinstance(x, Batch) else x for x in item)
                if not self._put(item):
                    return
            self._put(self._END)
        except BaseException as err:  # handed to the consumer
            self._put(err)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        return self

    def __next__(self):
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
