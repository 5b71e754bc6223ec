"""What the fused kernels take besides their tensors (nmt/kernels/relative_attention_triton.py's contract with its
launch code, nmt/kernels/relative_attention.py): plain tuples, Triton-free."""

from __future__ import annotations

from typing import NamedTuple


class Meta(NamedTuple):
    """The constexprs every kernel ends with (passed by name): what a kernel is compiled for."""

    HAS_RK: bool  # a^K (Eq. 4)
    HAS_RV: bool  # a^V (Eq. 3)
    HAS_KPM: bool  # a key padding mask
    CAUSAL: bool
    DROPOUT: bool
    ACC: object  # the accumulators' dtype (tl.float32; tl.float64 for float64 inputs)
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_D: int
    BLOCK_R: int
    PREC: str  # tl.dot's input_precision


class Sizes(NamedTuple):
    """The scalars that change with the model, not the batch."""

    H: int  # heads
    D: int  # head size
    CLIP: int  # k
    scale: float  # 1 / sqrt(D)
    dropout_p: float


class Strides(NamedTuple):
    """(batch, head, row) strides of q, k, v and of the output (forward) or its gradient (backward); head strides
    of the a^K and a^V tables (0: one table shared by every head)."""

    q: tuple
    k: tuple
    v: tuple
    o: tuple
    rk: int
    rv: int
