"""Eq. 3-4's a_ij = w_{clip(j - i, k)} for one call: the window of the 2k+1 edge vectors its queries and keys reach,
cut once for both tables and both implementations. With k >= N (the paper's k = 256) the work stays O(N) edge
vectors, not O(k). Which index a stack uses (this, or log-spaced buckets) is nmt/modeling/edges.py's EdgeIndex's to say.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


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
