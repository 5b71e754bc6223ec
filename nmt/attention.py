"""Relation-aware self-attention (Shaw, Uszkoreit & Vaswani 2018, Eq. 3-5).

The paper's formulation materializes a^K and a^V as (N, N, D) tensors. We never do:
the key term is q against the 2k+1 edge vectors, (Nq, 2k+1), gathered into the score
matrix; the value term sums attention probabilities into 2k+1 distance buckets and
multiplies the (Nq, 2k+1) bucket masses by the table. Both are O(Nq * Nk + Nq * k * D).
When a^V is off, the key term is an additive bias for the fused
`F.scaled_dot_product_attention` kernel (measured faster on CPU, scripts/bench_attention.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def relative_buckets(nq: int, nk: int, clip: int, q_offset: int = 0, device=None) -> Tensor:
    """Index of the edge vector for each (query i, key j) pair: clip(j - i, k) + k.

    Query row r sits at absolute position q_offset + r; keys sit at 0..nk-1.
    Returns (Nq, Nk) long in [0, 2k]. With clip=0 every pair maps to the one vector.
    """
    query_pos = torch.arange(q_offset, q_offset + nq, device=device)
    key_pos = torch.arange(nk, device=device)
    distance = key_pos[None, :] - query_pos[:, None]  # (Nq, Nk), j - i
    return distance.clamp(-clip, clip) + clip


def _attention_mask(nq, nk, key_padding_mask, causal, q_offset, device) -> Tensor | None:
    """Boolean (B or 1, 1, Nq, Nk) mask, True = may not attend; None when nothing is masked."""
    mask = None
    if causal:
        query_pos = torch.arange(q_offset, q_offset + nq, device=device)
        mask = (torch.arange(nk, device=device)[None, :] > query_pos[:, None])[None, None]
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = pad if mask is None else (mask | pad)
    return mask


def relation_aware_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    rel_k: Tensor | None,
    rel_v: Tensor | None,
    clip: int,
    key_padding_mask: Tensor | None = None,
    causal: bool = False,
    q_offset: int = 0,
    dropout_p: float = 0.0,
) -> Tensor:
    """Eq. 3-4 for q (B, H, Nq, D), k and v (B, H, Nk, D) -> (B, H, Nq, D).

    rel_k, rel_v: None, (2k+1, D) shared across heads, or (H, 2k+1, D) per head.
    key_padding_mask: (B, Nk) bool, True = padding. A query with no visible key outputs 0.
    q_offset: absolute position of the first query (incremental decoding: Nq=1, q_offset=t).
    """
    if clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    for name, table in (("rel_k", rel_k), ("rel_v", rel_v)):
        if table is not None and table.shape[-2] != 2 * clip + 1:
            raise ValueError(f"{name} has {table.shape[-2]} edge vectors, clip={clip} needs {2 * clip + 1}")
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    mask = _attention_mask(nq, nk, key_padding_mask, causal, q_offset, q.device)
    # Rows with no visible key (fully padded) must give 0, not NaN nor a uniform average.
    empty_rows = None if mask is None or key_padding_mask is None else mask.all(-1, keepdim=True)

    if rel_k is None and rel_v is None:
        return _fused(q, k, v, None, mask, empty_rows, dropout_p)

    q = q * (1.0 / math.sqrt(d))
    buckets = relative_buckets(nq, nk, clip, q_offset, q.device).expand(*q.shape[:-1], nk)
    key_bias = None
    if rel_k is not None:
        # Eq. 5, second term: q_i . w^K_r for the 2k+1 vectors, then placed at (i, j).
        edge_scores = q @ rel_k.transpose(-1, -2)  # (B, H, Nq, 2k+1)
        key_bias = edge_scores.gather(-1, buckets)  # (B, H, Nq, Nk)
    if rel_v is None:
        return _fused(q, k, v, key_bias, mask, empty_rows, dropout_p, scale=1.0)

    scores = q @ k.transpose(-1, -2)  # (B, H, Nq, Nk)
    if key_bias is not None:
        scores = scores + key_bias
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(-1)
    if empty_rows is not None:
        probs = probs.masked_fill(empty_rows, 0.0)
    if dropout_p > 0.0:
        probs = F.dropout(probs, dropout_p)
    # Eq. 3, a^V term: sum_j alpha_ij w^V_{clip(j-i)} = sum_r (mass of bucket r) w^V_r.
    bucket_mass = probs.new_zeros(*probs.shape[:-1], rel_v.shape[-2]).scatter_add_(-1, buckets, probs)
    return probs @ v + bucket_mass @ rel_v  # (B, H, Nq, D)


def _fused(q, k, v, bias, mask, empty_rows, dropout_p, scale=None) -> Tensor:
    if mask is not None:
        blocked = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            mask, torch.finfo(q.dtype).min
        )
        bias = blocked if bias is None else bias + blocked
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)


@dataclass
class KV:
    """Keys and values of one attention layer, (B, H, N, D) each: the decoding cache."""

    k: Tensor
    v: Tensor

    def index_select(self, indices: Tensor) -> "KV":
        return KV(self.k.index_select(0, indices), self.v.index_select(0, indices))


class MultiHeadAttention(nn.Module):
    """Projections, optional edge tables (a^K, a^V) and the attention core.

    clip=None means no relative positions (cross-attention, or position=absolute|none).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float = 0.0,
        clip: int | None = None,
        rel_key: bool = True,
        rel_value: bool = True,
        share_heads: bool = False,
    ):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads, self.d_head, self.dropout, self.clip = heads, d_model // heads, dropout, clip
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        relative = clip is not None
        edges = 2 * (clip or 0) + 1
        table_shape = (edges, self.d_head) if share_heads else (heads, edges, self.d_head)
        self.rel_k = nn.Parameter(torch.randn(table_shape) * self.d_head**-0.5) if relative and rel_key else None
        self.rel_v = nn.Parameter(torch.randn(table_shape) * self.d_head**-0.5) if relative and rel_value else None

    def split_heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.d_head).transpose(1, 2)  # (B, H, N, D)

    def project_kv(self, x: Tensor) -> KV:
        return KV(self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x)))

    def forward(
        self,
        x: Tensor,
        kv: KV,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        q_offset: int = 0,
    ) -> Tensor:
        """x (B, Nq, d_model) attends to precomputed kv -> (B, Nq, d_model)."""
        q = self.split_heads(self.q_proj(x))  # (B, H, Nq, D)
        z = relation_aware_attention(
            q, kv.k, kv.v, self.rel_k, self.rel_v, self.clip or 0,
            key_padding_mask=key_padding_mask, causal=causal, q_offset=q_offset,
            dropout_p=self.dropout if self.training else 0.0,
        )
        b, _, n, _ = z.shape
        return self.out_proj(z.transpose(1, 2).reshape(b, n, -1))  # (B, Nq, d_model)
