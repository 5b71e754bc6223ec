"""The PyTorch path of relation-aware attention (Eq. 3-5): what runs on CPUs, the reference the fused kernel is
checked against, and what torch.compile traces when the kernel is not in use.

The paper's formulation materializes a^K and a^V as (N, N, D) tensors. We never do: the key term is q against
the window's edge vectors, (Nq, R), gathered into the score matrix; the value term sums attention probabilities
into R distance buckets and multiplies the (Nq, R) bucket masses by the table. Both are O(Nq * Nk + Nq * R * D).
When a^V is off, the key term is an additive bias for `F.scaled_dot_product_attention` (measured faster on CPU,
benchmarks/attention.py).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.kernels.dropout import dropout, keep_mask
from nmt.kernels.masks import attention_mask
from nmt.kernels.window import EdgeWindow


def relative_attention(q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None,
                       window: EdgeWindow | None, key_padding_mask: Tensor | None = None, causal: bool = False,
                       q_offset: int = 0, dropout_p: float = 0.0) -> Tensor:
    """Eq. 3-5 as nmt.modeling.attention.relation_aware_attention documents it; window None: no tables (plain attention)."""
    nq, nk = q.shape[-2], k.shape[-2]
    mask, empty_rows = attention_mask(nq, nk, key_padding_mask, causal, q_offset, q.device)
    if window is None:
        return sdpa(q, k, v, None, mask, empty_rows, dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1])
    # a decoding step (one query, no backward): its layers share one step's buckets, made once
    step = nq == 1 and not torch.is_grad_enabled() and not torch.compiler.is_compiling()
    buckets = _step_buckets(window, nk, q_offset, q.device) if step else window.buckets(nq, nk, q_offset, q.device)
    rel_k = None if rel_k is None else window.cut(rel_k).to(q.dtype)
    if rel_v is None:
        # a^K only: the key term is an additive bias, so the fused SDPA kernel does the rest.
        edge_scores = _edge_scores(q.transpose(0, 1).contiguous() * scale, rel_k).transpose(0, 1)
        key_bias = edge_scores.gather(-1, buckets.expand(*q.shape[:-1], nk))  # (B, H, Nq, Nk)
        return sdpa(q, k, v, key_bias, mask, empty_rows, dropout_p)
    rel_v = window.cut(rel_v).to(q.dtype)
    # plain ops under the compiler (it derives the backward and fuses the n^2 work), and for a decoding step (one
    # query, no backward: the hand-written function's heads-first copies of the cache cost more than they save)
    if step:
        one_hot = _step_one_hot(window, nk, q_offset, q.device, rel_v.shape[-2], q.dtype)
        return _relative_composite(q, k, v, rel_k, rel_v, buckets, mask, empty_rows, dropout_p, scale, one_hot=one_hot)
    if torch.compiler.is_compiling():
        return _relative_composite(q, k, v, rel_k, rel_v, buckets, mask, empty_rows, dropout_p, scale)
    return _RelativeAttention.apply(q, k, v, rel_k, rel_v, buckets, mask, empty_rows, dropout_p, scale)


def reference_attention(q, k, v, rel_k, rel_v, window: EdgeWindow, key_padding_mask=None, causal=False, q_offset=0,
                        keep: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """Eq. 3-5 in plain differentiable ops, with the window's rows of the tables given and dropout as an explicit
    (B, H, Nq, Nk) keep mask: what the kernel's self-test and backward fallback compare against."""
    mask, empty_rows = attention_mask(q.shape[-2], k.shape[-2], key_padding_mask, causal, q_offset, q.device)
    buckets = window.buckets(q.shape[-2], k.shape[-2], q_offset, q.device)
    return _relative_composite(q, k, v, rel_k, rel_v, buckets, mask, empty_rows, dropout_p,
                               1.0 / math.sqrt(q.shape[-1]), keep)


def attention_weights(q: Tensor, k: Tensor, rel_k: Tensor | None, window: EdgeWindow | None,
                      key_padding_mask: Tensor | None = None, causal: bool = False, q_offset: int = 0) -> Tensor:
    """alpha_ij, Eq. 4's scores through the softmax, (B, H, Nq, Nk): for looking at where attention goes
    (experiments/plot_attention_distance.py). rel_k: the whole table (its window's rows are read), or None."""
    mask, empty_rows = attention_mask(q.shape[-2], k.shape[-2], key_padding_mask, causal, q_offset, q.device)
    buckets = None if rel_k is None else window.buckets(q.shape[-2], k.shape[-2], q_offset, q.device)
    rel_k = None if rel_k is None else window.cut(rel_k).to(q.dtype)
    return _weights(q, k, rel_k, buckets, mask, empty_rows, 1.0 / math.sqrt(q.shape[-1]))


def _weights(q, k, rel_k, buckets, mask, empty_rows, scale) -> Tensor:
    """Eq. 4 and its softmax in differentiable torch ops, (B, H, Nq, Nk); rel_k: the window's rows."""
    scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, Nq, Nk)
    if rel_k is not None:  # Eq. 4's q_i . a^K_ij, gathered from q against the 2k+1 edge vectors
        edge = q @ rel_k.transpose(-1, -2).unsqueeze(0) if rel_k.dim() == 3 else q @ rel_k.t()
        scores = scores + edge.gather(-1, buckets.expand(*q.shape[:-1], -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    probs = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
    return probs if empty_rows is None else probs.masked_fill(empty_rows, 0.0)


@functools.lru_cache(maxsize=4)
def _step_buckets(window: EdgeWindow, nk: int, q_offset: int, device: torch.device) -> Tensor:
    return window.buckets(1, nk, q_offset, device)


@functools.lru_cache(maxsize=4)
def _step_one_hot(window: EdgeWindow, nk: int, q_offset: int, device: torch.device, rows: int, dtype) -> Tensor:
    return (_step_buckets(window, nk, q_offset, device).unsqueeze(-1) == torch.arange(rows, device=device)).to(dtype)


def _relative_composite(q, k, v, rel_k, rel_v, buckets, mask, empty_rows, dropout_p, scale, keep=None,
                        one_hot=None) -> Tensor:
    """Eq. 3-5 in differentiable torch ops, (B, H, N, D) throughout: what torch.compile traces.
    keep: a given dropout mask instead of a fresh draw; one_hot: buckets as (Nq, Nk, R) indicators, when made."""
    probs = _weights(q, k, rel_k, buckets, mask, empty_rows, scale)
    if keep is not None:
        probs = probs * keep * (1.0 / (1.0 - dropout_p))
    elif dropout_p > 0.0:
        probs = dropout(probs, dropout_p)
    if rel_v is None:
        return probs @ v
    if one_hot is None:
        one_hot = (buckets.unsqueeze(-1) == torch.arange(rel_v.shape[-2], device=q.device)).to(q.dtype)
    bucket_mass = torch.einsum("bhij,ijr->bhir", probs, one_hot)  # (B, H, Nq, 2k+1)
    edge_values = bucket_mass @ rel_v.unsqueeze(0) if rel_v.dim() == 3 else bucket_mass @ rel_v
    return probs @ v + edge_values  # Eq. 3


# The hand-written core works heads-first, (H, B, N, D): a per-head edge table then meets its
# (B * N, D) rows in one batched GEMM per head, with no permuted copies (einsum made four per step).


def _edge_scores(x: Tensor, table: Tensor) -> Tensor:
    """x (H, B, N, D) against edge vectors (R, D) or (H, R, D) -> (H, B, N, R)."""
    if table.dim() == 2:
        return x @ table.t()
    h, b, n, d = x.shape
    return torch.bmm(x.view(h, b * n, d), table.transpose(1, 2)).view(h, b, n, -1)


def _edge_values(bucket_weights: Tensor, table: Tensor) -> Tensor:
    """(H, B, N, R) weights times edge vectors (R, D) or (H, R, D) -> (H, B, N, D)."""
    if table.dim() == 2:
        return bucket_weights @ table
    h, b, n, r = bucket_weights.shape
    return torch.bmm(bucket_weights.reshape(h, b * n, r), table).view(h, b, n, -1)


def _table_grad(bucket_weights: Tensor, x: Tensor, shared: bool) -> Tensor:
    """Gradient of an edge table from per-bucket weights (H, B, N, R) and x (H, B, N, D)."""
    h, r, d = x.shape[0], bucket_weights.shape[-1], x.shape[-1]
    if shared:
        return bucket_weights.reshape(-1, r).t() @ x.reshape(-1, d)
    return torch.bmm(bucket_weights.reshape(h, -1, r).transpose(1, 2), x.reshape(h, -1, d))


# Up to this many buckets, summing by a one-hot GEMM beats scatter_add (serialized on CPU);
# beyond it the (Nq, Nk, R) one-hot grows too large.
ONE_HOT_MAX_BUCKETS = 64


def _bucket_sums(weights: Tensor, buckets: Tensor, num_buckets: int, one_hot: Tensor | None) -> Tensor:
    """Sum (..., Nq, Nk) weights into (..., Nq, R) distance buckets; buckets is (Nq, Nk)."""
    if one_hot is not None:
        return torch.einsum("xyij,ijr->xyir", weights, one_hot)
    out = weights.new_zeros(*weights.shape[:-1], num_buckets)
    return out.scatter_add_(-1, buckets.expand_as(weights), weights)


def _one_hot(buckets: Tensor, num_buckets: int, dtype) -> Tensor | None:
    """(Nq, Nk, R) indicator for bucket sums by GEMM, or None where scatter_add is cheaper."""
    if num_buckets > ONE_HOT_MAX_BUCKETS:
        return None
    return (buckets.unsqueeze(-1) == torch.arange(num_buckets, device=buckets.device)).to(dtype)


def _bmm(a: Tensor, b: Tensor, bias: Tensor | None = None, alpha: float = 1.0) -> Tensor:
    """alpha * a @ b (+ bias) over the two leading dims; bias and scale are applied inside the GEMM."""
    *lead, n, _ = a.shape
    m = b.shape[-1]
    a3, b3 = a.reshape(-1, n, a.shape[-1]), b.reshape(-1, b.shape[-2], m)
    if bias is None:
        out = torch.bmm(a3, b3) if alpha == 1.0 else torch.baddbmm(a3.new_empty(()), a3, b3, beta=0.0, alpha=alpha)
    else:
        out = torch.baddbmm(bias.reshape(-1, n, m), a3, b3, alpha=alpha)
    return out.view(*lead, n, m)


class _RelativeAttention(torch.autograd.Function):
    """Eq. 3-5 with a^V, written out so that the (Nq, Nk) matrices are touched as few times as
    possible and only the probabilities (plus the dropout mask) are kept for backward.
    The 1/sqrt(D) scale is folded into the GEMMs and the (tiny) a^K table."""

    @staticmethod
    def forward(ctx, q, k, v, rel_k, rel_v, buckets, mask, empty_rows, dropout_p, scale):
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))  # (H, B, N, D)
        mask = None if mask is None else mask.transpose(0, 1)
        key_bias = None
        if rel_k is not None:
            key_bias = _edge_scores(q, rel_k * scale).gather(-1, buckets.expand(*q.shape[:-1], -1))
        scores = _bmm(q, k.transpose(-1, -2), key_bias, alpha=scale)  # (H, B, Nq, Nk), Eq. 5
        if mask is not None:
            scores.masked_fill_(mask, torch.finfo(scores.dtype).min)
        probs = scores.softmax(-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(q.dtype)
        if empty_rows is not None:
            probs.masked_fill_(empty_rows.transpose(0, 1), 0.0)
        keep = None
        dropped = probs
        if dropout_p > 0.0:
            keep, keep_scale = keep_mask(probs.transpose(0, 1).shape, dropout_p, probs.device)  # in (B, H) order
            keep = keep.transpose(0, 1)
            dropped = probs * keep * keep_scale
        # Eq. 3: sum_j alpha_ij (v_j + w^V_{clip(j-i)}) = alpha @ v + (bucket masses) @ w^V
        num_buckets = rel_v.shape[-2]
        bucket_mass = _bucket_sums(dropped, buckets, num_buckets, _one_hot(buckets, num_buckets, q.dtype))
        out = _bmm(dropped, v, _edge_values(bucket_mass, rel_v))
        ctx.save_for_backward(q, k, v, rel_k, rel_v, buckets, probs, keep, out)
        ctx.keep_scale, ctx.scale = (keep_scale if keep is not None else 1.0), scale
        return out.transpose(0, 1)  # (B, H, Nq, D)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, rel_k, rel_v, buckets, probs, keep, out = ctx.saved_tensors
        keep_scale, scale = ctx.keep_scale, ctx.scale
        num_buckets = rel_v.shape[-2]
        one_hot = _one_hot(buckets, num_buckets, q.dtype)
        grad_out = grad_out.transpose(0, 1).contiguous()  # (H, B, Nq, D)
        dropped = probs if keep is None else probs * keep * keep_scale
        grad_v = _bmm(dropped.transpose(-1, -2), grad_out)
        grad_rel_v = _table_grad(_bucket_sums(dropped, buckets, num_buckets, one_hot), grad_out, rel_v.dim() == 2)
        # d alpha_ij = dO_i . (v_j + w^V_r(i,j))
        edge_grad = _edge_scores(grad_out, rel_v).gather(-1, buckets.expand(*grad_out.shape[:-1], -1))
        grad_probs = _bmm(grad_out, v.transpose(-1, -2), edge_grad)
        if keep is not None:
            grad_probs = grad_probs * keep * keep_scale
        # softmax backward; sum_j alpha_ij d alpha_ij = dO_i . out_i (as in FlashAttention)
        delta = (grad_out * out).sum(-1, keepdim=True)
        grad_scores = grad_probs.sub_(delta).mul_(probs)  # masked entries have probs == 0
        grad_rel_k, edge_q = None, None
        if rel_k is not None:
            bucket_grad = _bucket_sums(grad_scores, buckets, num_buckets, one_hot)
            edge_q = _edge_values(bucket_grad, rel_k * scale)
            grad_rel_k = _table_grad(bucket_grad, q, rel_k.dim() == 2) * scale
        grad_q = _bmm(grad_scores, k, edge_q, alpha=scale)
        grad_k = _bmm(grad_scores.transpose(-1, -2), q, alpha=scale)
        grad_q, grad_k, grad_v = (g.transpose(0, 1) for g in (grad_q, grad_k, grad_v))
        return grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v, None, None, None, None, None


# At most this many queries per head against contiguous keys and values, without autograd, on a CPU: attention as
# two batched products around a softmax, cheaper there than SDPA's flash kernel, whose blocking pays for long query
# blocks (a decoding step's cross-attention: a sentence's few hypotheses against its source, laid out by start())
FEW_QUERIES = 16


def sdpa(q, k, v, bias, mask, empty_rows, dropout_p) -> Tensor:
    """F.scaled_dot_product_attention with an additive bias and a boolean mask folded into one float mask."""
    if mask is not None:
        blocked = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            mask, torch.finfo(q.dtype).min
        )
        bias = blocked if bias is None else bias + blocked
    if (q.device.type == "cpu" and q.shape[-2] <= FEW_QUERIES and not dropout_p and not torch.is_grad_enabled()
            and k.is_contiguous() and v.is_contiguous()):
        scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
        out = torch.matmul((scores if bias is None else scores.add_(bias)).softmax(-1), v)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p)
    return out if empty_rows is None else out.masked_fill(empty_rows, 0.0)
