"""The unit of the fused kernel's self-test and choice: a Case (what selects a compiled variant), read off a call's
tensors; the warning a fall-back to the PyTorch path raises; and the cases whose backward failed in this process.
Triton-free, so that both the dispatcher and the kernel's launch code can import it."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from nmt.kernels.tiles import buckets_block


class KernelFallbackWarning(UserWarning):
    """The fused kernel failed its self-test (or a launch) for one case: that case runs the PyTorch path."""


class Case(NamedTuple):
    """What selects a compiled variant of the kernel; the unit of the self-test."""

    device: str
    dtype: torch.dtype
    head_dim: int
    buckets_block: int  # edge vectors held per row: the next power of two >= 16 of the window R
    causal: bool
    dropout: bool
    key_table: bool
    value_table: bool
    shared: bool  # one table for every head
    padding: bool  # a key padding mask
    decoding: bool  # at most 16 queries: the small-row tiles

    def __str__(self) -> str:
        tables = "+".join(name for name, on in (("a^K", self.key_table), ("a^V", self.value_table)) if on)
        flags = [name for name, on in (("causal", self.causal), ("dropout", self.dropout), ("shared", self.shared),
                                       ("padding", self.padding), ("decoding", self.decoding)) if on]
        return (f"{str(self.dtype).removeprefix('torch.')} head {self.head_dim}, {self.buckets_block} buckets, "
                f"{tables}{', ' + ', '.join(flags) if flags else ''} on {self.device}")


def case_of(q: Tensor, rel_k, rel_v, buckets: int, padding: bool, causal: bool, dropout_p: float) -> Case:
    table = rel_k if rel_k is not None else rel_v
    return Case(q.device.type, q.dtype, int(q.shape[-1]), buckets_block(buckets), causal, dropout_p > 0.0,
                rel_k is not None, rel_v is not None, table.dim() == 2, padding, q.shape[2] <= 16)


# Cases whose backward kernel raised after passing the self-test (the op then computed the gradients on the
# PyTorch path): from then on auto sends them to the PyTorch path in this process.
BACKWARD_FAILED: set[Case] = set()
