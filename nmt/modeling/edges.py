"""Which edge vector each (query i, key j) pair reads in relation-aware self-attention (Shaw et al. 2018, Eq. 3-4):
the one home of that rule. nmt/modeling/transformer.py builds one EdgeIndex per stack from the mode; attention (nmt/modeling/attention.py),
the fused kernel's inputs and the export (nmt/export.py) ask it and never look at the mode themselves.

- Shaw's clip: a_ij = w_{clip(j - i, k)}, 2k+1 vectors. A call reaches only the window of distances its lengths
  span (nmt/kernels/window.py's EdgeWindow): O(N) vectors even at the paper's k = 256.
- model.edge_buckets=N: a_ij = w_{bucket(j - i)}, N vectors indexed by T5's log-spaced buckets of j - i up to k
  (nmt/modeling/positions.py's LogBuckets; bidirectional in the encoder, causal in the decoder). bucket(d) saturates at
  |d| = k, so the table expanded to the 2k+1 distances is an ordinary clipped table: what the fused kernel and
  CTranslate2 read.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from nmt.kernels.window import EdgeWindow
from nmt.modeling.positions import LogBuckets, distance_rows
from nmt.modes import bucket_rule


@dataclass(frozen=True)
class EdgeIndex:
    """The edge vectors of one stack's self-attention: clip k, buckets (0: Shaw's clip), causal (the decoder)."""

    clip: int
    buckets: int = 0
    causal: bool = False

    def __post_init__(self):
        if self.clip < 0:
            raise ValueError(f"clip must be >= 0, got {self.clip}")
        if (problem := bucket_rule(self.clip, self.buckets)) is not None:
            raise ValueError(problem)

    @property
    def rows(self) -> int:
        """Vectors per edge table."""
        return self.buckets or 2 * self.clip + 1

    def check_tables(self, **tables: Tensor | None) -> None:
        """Each given table, (R, D) or (H, R, D), has this index's R rows."""
        for name, table in tables.items():
            if table is not None and table.shape[-2] != self.rows:
                need = f"edge_buckets={self.buckets}" if self.buckets else f"clip={self.clip}"
                raise ValueError(f"{name} has {table.shape[-2]} edge vectors, {need} needs {self.rows}")

    def window(self, nq: int, nk: int, q_offset: int = 0) -> EdgeWindow | LogBuckets:
        """What the PyTorch path reads for queries at q_offset.. and keys 0..nk-1: the clip's window of the
        distances they span (`cut` its rows, `buckets` each pair's row), or every bucket of the table."""
        if self.buckets:
            return LogBuckets(self.clip, self.buckets, self.causal)
        return EdgeWindow.of(nq, nk, self.clip, q_offset)

    def kernel_window(self, nq: int, nk: int, q_offset: int = 0) -> EdgeWindow:
        """The window of clipped distances the fused kernel reads from the clipped tables (`clipped`)."""
        return EdgeWindow.of(nq, nk, self.clip, q_offset)

    def clipped(self, table: Tensor | None) -> Tensor | None:
        """The table as its 2k+1 distances' vectors, a_ij = w_{clip(j - i, k)}: itself for Shaw's clip, each
        distance's bucket vector with buckets (exactly the same a_ij)."""
        if table is None or not self.buckets:
            return table
        return table.index_select(-2, distance_rows(self.clip, self.buckets, self.causal, table.device))
