"""Position schemes other than Shaw et al.'s edge tables (those live with the attention core, nmt/modeling/attention.py).

At the input: sinusoids (Vaswani et al. 2017) or a learned table, added to the embeddings (input_positions, the one
factory). In self-attention, each a function of the
relative distance j - i (query i, key j) alone, built once per forward for a whole stack and shared by its layers:

- T5's relative attention bias (Raffel et al. 2020): a learned logit per (bucket of j - i, head); the buckets are
  exact for short distances, logarithmic up to a maximum distance, then saturate.
- ALiBi (Press et al. 2022): the logit -m_h * |i - j|, a fixed slope per head; no parameters.
- Rotary embeddings (Su et al. 2021): q and k rotated by their absolute positions, so that q_i . k_j depends on
  j - i only; no parameters. Interleaved layout: dimension 2c pairs with 2c + 1, as in Su et al.'s notation,
  Meta's LLaMA and CTranslate2's default (rotary_interleave), not the half-split c with c + D/2 of GPT-NeoX and
  Hugging Face's LLaMA.

nmt/modeling/transformer.py chooses the scheme once (self_attention_positions); each returns a StackPositions that the stack's
self-attention layers read (nmt/modeling/attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.config import ModelConfig
from nmt.kernels.masks import attention_mask
from nmt.modes import Position

ROPE_BASE = 10_000.0


def sinusoids(n: int, d: int, offset: int = 0) -> Tensor:
    """Vaswani et al. 2017 sinusoidal encodings for positions offset..offset+n-1 -> (n, d)."""
    pos = torch.arange(offset, offset + n, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n, d)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return table


class Sinusoids(nn.Module):
    """The sinusoids as a table of max_positions rows, rebuilt at load (not saved: a checkpoint holds no constant)."""

    def __init__(self, max_positions: int, d: int):
        super().__init__()
        self.register_buffer("weight", sinusoids(max_positions, d), persistent=False)


def input_positions(cfg: ModelConfig) -> tuple[nn.Module, nn.Module] | tuple[None, None]:
    """The one factory of the tables added to the embeddings, as fairseq's PositionalEmbedding: (the encoder's, the
    decoder's), each with a `weight` of (max_positions, d_model) rows; (None, None) where positions enter elsewhere
    (edge tables, T5, ALiBi, RoPE) or nowhere."""
    if not cfg.position.input_table:
        return None, None
    if cfg.position != Position.learned:  # absolute, both: one constant table serves both stacks
        table = Sinusoids(cfg.max_positions, cfg.d_model)
        return table, table
    # learned: fairseq's LearnedPositionalEmbedding, N(0, d^-0.5), not scaled; both made before either is
    # initialized, so that the random stream (and every trained model) is what it was with this order
    tables = nn.Embedding(cfg.max_positions, cfg.d_model), nn.Embedding(cfg.max_positions, cfg.d_model)
    for table in tables:
        nn.init.normal_(table.weight, 0.0, cfg.d_model**-0.5)
    return tables


def t5_bucket(distance: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative distance j - i (Raffel et al. 2020, Mesh TensorFlow's
    _relative_position_bucket), a long tensor of distance's shape in [0, num_buckets).

    Bidirectional (encoder): half the buckets for keys after the query (j > i), half for the rest; causal
    (decoder): every bucket for j <= i (later keys are masked anyway and get bucket 0). Within a half of n buckets,
    distances below n/2 have a bucket each, then the other n/2 buckets split [n/2, max_distance) logarithmically,
    and every longer distance shares the last bucket."""
    if bidirectional:
        num_buckets //= 2
        base = (distance > 0).long() * num_buckets
        far = distance.abs()
    else:
        base = 0
        far = (-distance).clamp(min=0)
    exact = num_buckets // 2
    # float32 logarithms, as T5 computes them: an exported model (CTranslate2) agrees at the bucket edges
    log_ratio = torch.log(far.float().clamp(min=1.0) / exact) / math.log(max_distance / exact)
    logarithmic = (exact + (log_ratio * (num_buckets - exact)).long()).clamp(max=num_buckets - 1)
    return base + torch.where(far < exact, far, logarithmic)


def distance_rows(clip: int, num_buckets: int, causal: bool, device=None) -> Tensor:
    """(2k+1,) long: the edge bucket of each distance -k..k. table.index_select(-2, rows) is the clipped table with
    a_ij = w_{bucket(j - i)}: bucket(d) saturates at |d| = k, so clip(d, k) loses nothing."""
    return t5_bucket(torch.arange(-clip, clip + 1, device=device), not causal, num_buckets, clip)


@dataclass(frozen=True)
class LogBuckets:
    """Shaw's edge vectors read through T5's buckets of j - i up to clip (model.edge_buckets; bidirectional unless
    causal): the window the PyTorch attention path takes (nmt/kernels/window.py's EdgeWindow interface), every
    row of the table in use. nmt/modeling/edges.py's EdgeIndex builds it and holds the rule on its sizes."""

    clip: int
    num_buckets: int
    causal: bool

    @property
    def size(self) -> int:
        return self.num_buckets

    def cut(self, table: Tensor | None) -> Tensor | None:
        return table

    def buckets(self, nq: int, nk: int, q_offset: int, device) -> Tensor:
        queries = torch.arange(q_offset, q_offset + nq, device=device)
        distance = torch.arange(nk, device=device)[None, :] - queries[:, None]  # (Nq, Nk), j - i
        return t5_bucket(distance, not self.causal, self.num_buckets, self.clip)


def alibi_slopes(heads: int, device=None) -> Tensor:
    """Press et al. 2022's head slopes, (H,) float32: for H a power of two the geometric sequence 2^(-8h/H),
    h = 1..H; otherwise the slopes for the power of two p below H, then the odd-numbered slopes of the sequence
    for 2p (h = 1, 3, 5, ...), as many as H - p."""
    p = 2 ** int(math.log2(heads))
    first = torch.exp2(-8.0 / p * torch.arange(1, p + 1, device=device, dtype=torch.float32))
    odd = 2 * torch.arange(heads - p, device=device, dtype=torch.float32) + 1
    rest = torch.exp2(-8.0 / (2 * p) * odd)
    return torch.cat([first, rest])


@dataclass(frozen=True)
class Rotation:
    """Rotary angles of N consecutive positions: cos and sin, (N, D/2) each."""

    cos: Tensor
    sin: Tensor


def rotation(n: int, d: int, offset: int, device, dtype=torch.float32) -> Rotation:
    """Angles t * base^(-2c/D) for positions t = offset..offset+n-1 and pairs c = 0..D/2-1 (Su et al. 2021)."""
    inv_freq = ROPE_BASE ** (-torch.arange(0, d, 2, device=device, dtype=dtype) / d)  # (D/2,)
    angles = torch.arange(offset, offset + n, device=device, dtype=dtype)[:, None] * inv_freq  # (N, D/2)
    return Rotation(angles.cos(), angles.sin())


def rotate(x: Tensor, r: Rotation) -> Tensor:
    """x (B, H, N, D) with each pair (x_2c, x_2c+1), read as the complex number x_2c + i x_2c+1, times e^(i angle):
    computed in the angles' precision (fp32 at least: bf16 would blur the phase of far positions), returned in x's
    dtype. One complex multiplication: a single pass over x forward and backward (the half-split layout's four
    real products took twice as long on a CPU in a one-off timing beside it)."""
    work = x.to(r.cos.dtype)
    if torch.compiler.is_compiling():  # real ops, which the compiler fuses into one kernel
        even, odd = work[..., 0::2], work[..., 1::2]
        out = torch.stack([even * r.cos - odd * r.sin, odd * r.cos + even * r.sin], -1).flatten(-2)
    else:
        pairs = torch.view_as_complex(work.unflatten(-1, (-1, 2)))  # (B, H, N, D/2)
        out = torch.view_as_real(pairs * torch.complex(r.cos, r.sin)).flatten(-2)
    return out.to(x.dtype)


@dataclass(frozen=True)
class StackPositions:
    """What a stack's position scheme gives each of its self-attention layers for one forward.

    bias: additive logits (1 or B, H, Nq, Nk) in the attention's dtype, the padding and causal masks folded in
    (masked logits at the dtype's lowest value); when set, the layer's own masks are not read.
    empty_rows: (B, 1, Nq, 1) True where a query sees no key at all (its output is 0), or None.
    rotation: the angles of the new queries' and keys' positions (rotary), or None."""

    bias: Tensor | None = None
    empty_rows: Tensor | None = None
    rotation: Rotation | None = None


NO_POSITIONS = StackPositions()


def toeplitz(by_distance: Tensor, nq: int, nk: int) -> Tensor:
    """(..., Nq + Nk - 1) values for the distances j - i of relative_distances(nq, nk, ...), in order, ->
    (..., Nq, Nk) with [i, j] the value of j - i: windows of the vector, so that a learned table's gradient
    gathers from Nq + Nk - 1 entries, not from Nq x Nk."""
    return by_distance.unfold(-1, nk, 1).flip(-2)


def relative_distances(nq: int, nk: int, q_offset: int, device) -> Tensor:
    """Every distance j - i between queries at q_offset..q_offset+Nq-1 and keys at 0..Nk-1, ascending: (Nq+Nk-1,)."""
    return torch.arange(-(q_offset + nq - 1), nk - q_offset, device=device)


class _AttentionBias(nn.Module):
    """A scheme that adds logits b_h(j - i) in self-attention: the masks folded in once per forward."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal

    def logits(self, distance: Tensor) -> Tensor:  # (R,) distances j - i -> (H, R) float32
        raise NotImplementedError

    def forward(self, nq: int, nk: int, q_offset: int, key_padding_mask: Tensor | None, device,
                dtype) -> StackPositions:
        by_distance = self.logits(relative_distances(nq, nk, q_offset, device))  # (H, Nq + Nk - 1)
        bias = toeplitz(by_distance.to(dtype), nq, nk)[None]  # (1, H, Nq, Nk): broadcast over the batch
        mask, empty_rows = attention_mask(nq, nk, key_padding_mask, self.causal, q_offset, device)
        if mask is not None:  # (B, H, Nq, Nk) only with padding: once per stack, shared by its layers
            bias = bias.masked_fill(mask, torch.finfo(dtype).min)
        return StackPositions(bias=bias, empty_rows=empty_rows)


class T5Bias(_AttentionBias):
    """One learned logit per (bucket, head), shared by every layer of the stack (as T5; OpenNMT-py keeps one table
    per layer). Initialized at zero: training starts from position-free attention."""

    def __init__(self, heads: int, num_buckets: int, max_distance: int, causal: bool):
        super().__init__(causal)
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.table = nn.Parameter(torch.zeros(heads, num_buckets))  # (H, buckets)

    def logits(self, distance: Tensor) -> Tensor:
        return self.table[:, t5_bucket(distance, not self.causal, self.num_buckets, self.max_distance)]


class ALiBi(_AttentionBias):
    """-m_h |i - j|: symmetric in the encoder (as OpenNMT-py; Press et al. define only the causal form, the
    decoder's -m_h (i - j) for j <= i, which the causal mask makes the same formula)."""

    def __init__(self, heads: int, causal: bool):
        super().__init__(causal)
        self.heads = heads

    def logits(self, distance: Tensor) -> Tensor:
        return -alibi_slopes(self.heads, distance.device)[:, None] * distance.abs()


class Rotary(nn.Module):
    """Rotary embedding of the whole head dimension in self-attention (base 10,000)."""

    def __init__(self, head_dim: int):
        super().__init__()
        self.head_dim = head_dim

    def forward(self, nq: int, nk: int, q_offset: int, key_padding_mask: Tensor | None, device,
                dtype) -> StackPositions:
        # the new queries and the new keys share positions q_offset..: cached keys were rotated when they were new
        precision = torch.promote_types(dtype, torch.float32)
        return StackPositions(rotation=rotation(nq, self.head_dim, q_offset, device, precision))
