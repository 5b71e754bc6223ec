"""Relation-aware self-attention (Shaw, Uszkoreit & Vaswani 2018, Eq. 3-5): the interface, and the multi-head
module with its edge tables and decoding cache.

    e_ij = q_i . (k_j + a^K_ij) / sqrt(D)      (Eq. 4)
    z_i = sum_j alpha_ij (v_j + a^V_ij)         (Eq. 3),   a_ij = w_{clip(j - i, k)}

or, with model.edge_buckets=N, a_ij = w_{bucket(j - i)}: N edge vectors by T5's log-spaced buckets up to k.

Two implementations compute it, never materializing the (N, N, D) tensors of the paper's formulation:
nmt/kernels/torch_attention.py (the PyTorch path: CPUs, the reference) and nmt/kernels/relative_attention.py (one
flash-style Triton kernel on CUDA: O(N) memory). nmt/kernels/dispatch.py chooses, once per job and per case;
nmt/modeling/edges.py's EdgeIndex says which edge vector each pair reads, and what each implementation is given.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from nmt.kernels import torch_attention
from nmt.kernels.dispatch import AttentionBackend
from nmt.kernels.window import relative_buckets  # noqa: F401 (the index of Eq. 3-4, part of this API)
from nmt.modeling.edges import EdgeIndex
from nmt.modeling.positions import NO_POSITIONS, Rotation, StackPositions, rotate


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
    backend: AttentionBackend | None = None,
    edge_buckets: int = 0,
) -> Tensor:
    """Eq. 3-4 for q (B, H, Nq, D), k and v (B, H, Nk, D) -> (B, H, Nq, D).

    rel_k, rel_v: None, (R, D) shared across heads, or (H, R, D) per head; R = 2k+1 edge vectors, or edge_buckets.
    edge_buckets: 0 for a_ij = w_{clip(j - i, k)}; N for a_ij = w_{bucket(j - i)}, N log-spaced buckets up to k
    (bidirectional unless causal). clip and edge_buckets make the call's EdgeIndex (nmt/modeling/edges.py).
    key_padding_mask: (B, Nk) bool, True = padding. A query with no visible key outputs 0.
    q_offset: absolute position of the first query (incremental decoding: Nq=1, q_offset=t).
    backend: may send the call to the fused kernel (nmt/kernels/dispatch.py); None = the PyTorch path.
    """
    return attend(q, k, v, rel_k, rel_v, EdgeIndex(clip, edge_buckets, causal), key_padding_mask, causal, q_offset,
                  dropout_p, backend)


def attend(q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None, edges: EdgeIndex | None,
           key_padding_mask: Tensor | None = None, causal: bool = False, q_offset: int = 0, dropout_p: float = 0.0,
           backend: AttentionBackend | None = None) -> Tensor:
    """relation_aware_attention with the stack's edge index (None: no edge tables, plain attention)."""
    nq, nk = q.shape[-2], k.shape[-2]
    if rel_k is None and rel_v is None:
        return torch_attention.relative_attention(q, k, v, None, None, None, key_padding_mask, causal, q_offset,
                                                  dropout_p)
    edges.check_tables(rel_k=rel_k, rel_v=rel_v)
    window = edges.kernel_window(nq, nk, q_offset)
    if backend is not None and backend.use_kernel(q, rel_k, rel_v, window.size, key_padding_mask, causal, dropout_p):
        from nmt.kernels import relative_attention as fused_kernel

        return fused_kernel.relative_attention(q, k, v, edges.clipped(rel_k), edges.clipped(rel_v), window,
                                               key_padding_mask, causal, q_offset, dropout_p)
    return torch_attention.relative_attention(q, k, v, rel_k, rel_v, edges.window(nq, nk, q_offset), key_padding_mask,
                                              causal, q_offset, dropout_p)


@dataclass
class Room:
    """Buffers (B, H, capacity, D) that a decoding cache's keys and values are the first positions of, and how many
    positions are filled: shared by every KV that views them, so that only the KV that ends where they are filled
    appends in place (a cache that another step already extended is copied instead: no cache is ever modified)."""

    k: Tensor
    v: Tensor
    filled: int


@dataclass
class KV:
    """Keys and values of one attention layer, (B, H, N, D) each: the decoding cache; room: the buffers they view,
    with space for later steps (None: k and v are tensors of their own)."""

    k: Tensor
    v: Tensor
    room: Room | None = None

    def index_select(self, indices: Tensor) -> "KV":
        return KV(self.k.index_select(0, indices), self.v.index_select(0, indices))

    def extended(self, new: "KV", rows: Tensor | None = None) -> "KV":
        """These keys and values (rows `rows` of them, when given) followed by `new` along the sequence. Without
        `rows`, appended in place where the buffers have room (greedy decoding: no copy of the cache per step);
        otherwise copied once into new buffers with room to grow, where a reorder and then a concatenation took two
        copies."""
        n, end = self.k.shape[2], self.k.shape[2] + new.k.shape[2]
        room = self.room
        if rows is None and room is not None and room.filled == n and end <= room.k.shape[2]:
            room.k[:, :, n:end], room.v[:, :, n:end] = new.k, new.v
            room.filled = end
            return KV(room.k[:, :, :end], room.v[:, :, :end], room)

        capacity = 2 * end if rows is None else end  # a reordered cache (beam search) is reordered again next step

        def grow(old: Tensor, add: Tensor) -> Tensor:
            out = old.new_empty(add.shape[0], old.shape[1], capacity, old.shape[3])  # (B, H, capacity, D)
            if rows is None:
                out[:, :, :n] = old
            else:
                torch.index_select(old, 0, rows, out=out[:, :, :n])
            out[:, :, n:end] = add
            return out

        room = Room(grow(self.k, new.k), grow(self.v, new.v), end)
        return KV(room.k[:, :, :end], room.v[:, :, :end], room)


class MultiHeadAttention(nn.Module):
    """Projections, optional edge tables (a^K, a^V) and the attention core.

    edges: the stack's edge index (nmt/modeling/edges.py); None: no edge tables (cross-attention, positions elsewhere).
    """

    def __init__(
        self,
        d_model: int,
        heads: int,
        dropout: float = 0.0,
        edges: EdgeIndex | None = None,
        rel_key: bool = True,
        rel_value: bool = True,
        share_heads: bool = False,
        backend: AttentionBackend | None = None,
    ):
        super().__init__()
        self.backend = backend  # None: the PyTorch path
        if d_model % heads:
            raise ValueError(f"d_model={d_model} is not divisible by heads={heads}")
        self.heads, self.d_head, self.dropout, self.edges = heads, d_model // heads, dropout, edges
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        if edges is not None:
            shape = (edges.rows, self.d_head) if share_heads else (heads, edges.rows, self.d_head)
        self.rel_k = nn.Parameter(torch.randn(shape) * self.d_head**-0.5) if edges and rel_key else None
        self.rel_v = nn.Parameter(torch.randn(shape) * self.d_head**-0.5) if edges and rel_value else None
        self.fused_qkv = None  # x -> [Q K V] in one GEMM, which decoding may give (nmt.decoding.fused)

    def split_heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.d_head).transpose(1, 2)  # (B, H, N, D)

    def project_kv(self, x: Tensor, rotation: Rotation | None = None) -> KV:
        """K and V of x (B, N, d_model); rotation: rotary angles of x's positions (the cache keeps rotated keys)."""
        k = self.split_heads(self.k_proj(x))
        return KV(k if rotation is None else rotate(k, rotation), self.split_heads(self.v_proj(x)))

    def project_qkv(self, x: Tensor, rotation: Rotation | None = None) -> tuple[Tensor, KV]:
        """Q (B, H, N, D) and the K and V of x (B, N, d_model) for self-attention: one GEMM where fused_qkv is
        given, else three."""
        if self.fused_qkv is None:  # K and V first, then Q: training's order of ops (so its gradients' sums) as before
            kv = self.project_kv(x, rotation)
            q = self.split_heads(self.q_proj(x))
            return (q if rotation is None else rotate(q, rotation)), kv
        q, k, v = (self.split_heads(part) for part in self.fused_qkv(x).chunk(3, dim=-1))
        if rotation is not None:
            q, k = rotate(q, rotation), rotate(k, rotation)
        return q, KV(k, v)

    def self_attention_weights(self, x: Tensor, key_padding_mask: Tensor | None = None, causal: bool = False,
                               positions: StackPositions = NO_POSITIONS) -> Tensor:
        """x (B, N, d_model) attending to itself: alpha (B, H, N, N) as forward weighs the values, for analysis
        (eval mode, no dropout). positions: the stack's (model.stack_positions): RoPE's rotation of queries and
        keys, or T5's / ALiBi's additive bias, which already holds the masks."""
        q, k = self.split_heads(self.q_proj(x)), self.split_heads(self.k_proj(x))
        if positions.rotation is not None:
            q, k = rotate(q, positions.rotation), rotate(k, positions.rotation)
        if positions.bias is not None:
            scores = q @ k.transpose(-1, -2) * self.d_head**-0.5 + positions.bias
            probs = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
            return probs if positions.empty_rows is None else probs.masked_fill(positions.empty_rows, 0.0)
        window = None if self.rel_k is None else self.edges.window(x.shape[1], x.shape[1])
        return torch_attention.attention_weights(q, k, self.rel_k, window, key_padding_mask, causal)

    def clipped_tables(self) -> tuple[Tensor | None, Tensor | None]:
        """a^K and a^V as (2k+1)-row tables of a_ij = w_{clip(j - i, k)} (what CTranslate2 holds)."""
        return self.edges.clipped(self.rel_k), self.edges.clipped(self.rel_v)

    def forward(
        self,
        x: Tensor,
        kv: KV,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        q_offset: int = 0,
        positions: StackPositions = NO_POSITIONS,
        q: Tensor | None = None,
    ) -> Tensor:
        """x (B, Nq, d_model) attends to precomputed kv -> (B, Nq, d_model).

        positions: what the stack's position scheme built for this forward (nmt/modeling/positions.py): rotary angles for
        the queries, or an additive bias that already holds the padding and causal masks. q: x's queries (B, H, Nq, D),
        rotated, where project_qkv made them."""
        if q is None:
            q = self.split_heads(self.q_proj(x))  # (B, H, Nq, D)
            if positions.rotation is not None:
                q = rotate(q, positions.rotation)
        dropout_p = self.dropout if self.training else 0.0
        if positions.bias is not None:  # T5, ALiBi: SDPA's fused kernels take the bias as attn_mask
            z = torch_attention.sdpa(q, kv.k, kv.v, positions.bias, None, positions.empty_rows, dropout_p)
        else:
            z = attend(q, kv.k, kv.v, self.rel_k, self.rel_v, self.edges, key_padding_mask, causal, q_offset, dropout_p,
                       self.backend)
        b, _, n, _ = z.shape
        return self.out_proj(z.transpose(1, 2).reshape(b, n, -1))  # (B, Nq, d_model)
