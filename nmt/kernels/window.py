"""Which edge vector each (query, key) pair reads, cut once for both tables and both implementations.

EdgeWindow: Eq. 3-4's a_ij = w_{clip(j - i, k)}, the window of the 2k+1 edge vectors a call reaches: with k >= N
(the paper's k = 256) the work stays O(N) edge vectors, not O(k).
LogBuckets (model.edge_buckets=N): a_ij = w_{bucket(j - i)}, N edge vectors indexed by T5's log-spaced buckets of
j - i (nmt.positions.t5_bucket) up to k, where they saturate: exact near the query, coarser with distance. Its
table expanded to the 2k+1 distances (distance_rows) is an ordinary clipped table, which is how the fused kernel
and CTranslate2 take it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.positions import t5_bucket


def relative_buckets(nq: int, nk: int, clip: int, q_offset: int = 0, device=None) -> Tensor:
    """Index of the edge vector for each (query i, key j) pair: clip(j - i, k) + k.

    Query row r sits at absolute position q_offset + r; keys sit at 0..nk-1.
    Returns (Nq, Nk) long in [0, 2k]. With clip=0 every pair maps to the one vector.
    """
    query_pos = torch.arange(q_offset, q_offset + nq, device=device)
    key_pos = torch.arange(nk, device=device)
    distance = key_pos[None, :] - query_pos[:, None]  # (Nq, Nk), j - i
    return distance.clamp(-clip, clip) + clip


@dataclass(frozen=True)
class EdgeWindow:
    """Rows lo..hi of the 2k+1 edge vectors: the relative distances that queries at q_offset..q_offset+Nq-1 and
    keys at 0..Nk-1 reach."""

    clip: int
    lo: int
    hi: int

    @classmethod
    def of(cls, nq: int, nk: int, clip: int, q_offset: int = 0) -> "EdgeWindow":
        if torch.compiler.is_compiling():
            # Under torch.compile with dynamic shapes the symbolic min/max of lengths has no valid range
            # (InductorError: ValueRangeError): the whole table is used, a no-op unless k >= N.
            return cls(clip, 0, 2 * clip)
        lo = min(clip, max(-clip, -(q_offset + nq - 1))) + clip
        hi = min(clip, max(-clip, nk - 1 - q_offset)) + clip
        return cls(clip, lo, hi)

    @property
    def size(self) -> int:
        return self.hi - self.lo + 1

    def cut(self, table: Tensor | None) -> Tensor | None:
        """The window's rows of a (2k+1, D) or (H, 2k+1, D) table."""
        return None if table is None else table[..., self.lo : self.hi + 1, :]

    def buckets(self, nq: int, nk: int, q_offset: int, device) -> Tensor:
        """(Nq, Nk) row of each pair's edge vector within the window, in [0, size)."""
        return relative_buckets(nq, nk, self.clip, q_offset, device) - self.lo


def distance_rows(clip: int, num_buckets: int, causal: bool, device=None) -> Tensor:
    """(2k+1,) long: the bucket of each distance -k..k. table.index_select(-2, rows) is the clipped table with
    a_ij = w_{bucket(j - i)}: bucket(d) saturates at |d| = k, so clip(d, k) loses nothing."""
    return t5_bucket(torch.arange(-clip, clip + 1, device=device), not causal, num_buckets, clip)


@dataclass(frozen=True)
class LogBuckets:
    """num_buckets edge vectors read through T5's buckets of j - i up to clip (bidirectional unless causal): the
    same interface as EdgeWindow for the PyTorch path, with every row of the table in use."""

    clip: int
    num_buckets: int
    causal: bool

    def __post_init__(self):
        if self.num_buckets < 4 or self.num_buckets % 2 or self.clip <= self.num_buckets // 2:
            raise ValueError(f"edge_buckets={self.num_buckets} must be even, >= 4 and below 2 x clip={self.clip} "
                             "(k, where the logarithmic buckets end)")

    @property
    def size(self) -> int:
        return self.num_buckets

    def cut(self, table: Tensor | None) -> Tensor | None:
        return table

    def buckets(self, nq: int, nk: int, q_offset: int, device) -> Tensor:
        queries = torch.arange(q_offset, q_offset + nq, device=device)
        distance = torch.arange(nk, device=device)[None, :] - queries[:, None]  # (Nq, Nk), j - i
        return t5_bucket(distance, not self.causal, self.num_buckets, self.clip)
