"""Relation-aware attention (Eq. 3-5) as one flash-style Triton pass: O(N) memory, no (N, N) tensor.

Each program owns a block of query rows of one (batch, head) and streams the key blocks through an online
softmax (FlashAttention). The two relative terms ride along:
- a^K (Eq. 4): the block's queries against the 2k+1 edge vectors once, (M, R), then gathered per pair by
  its distance bucket and added to the scores;
- a^V (Eq. 3): sum_j alpha_ij w^V_{clip(j-i)} = sum_r m_ir w^V_r, so each query row carries its R bucket
  masses m_ir, rescaled with the running maximum like the output accumulator. Inside the window a bucket
  holds exactly one key per row (j = i + r - k), so a key block's masses are a gather, not a scatter; the
  two edge buckets take the row sums of the keys beyond the window. The masses meet the table once, at the end.
Backward recomputes the probabilities from the saved log-sum-exp (two kernels: dK/dV per key block, dQ per
query block, which also sums the probabilities and the score gradients into buckets again); the tables'
gradients are small GEMMs over those bucket sums, outside the kernels. Only q, k, v, the output and the
log-sum-exp are kept for backward.
Dropout on the probabilities draws from Philox by (batch-head, i, j), so backward redraws the same mask.

Only the window of edge vectors that the lengths reach is passed in (the caller's `lo`), so the paper's
k = 256 costs no more than k = N. The whole thing is a torch custom op: torch.compile treats it as one
opaque node (no graph break) and autograd calls the backward op.
The device code is in nmt/kernels/relative_attention_triton.py; this file is the op around it. Tests run
the kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

from nmt.kernels import relative_attention_triton as triton_code

# Widest window of edge vectors (R = 2k+1, or the part of it the lengths reach) kept in registers per row.
MAX_BUCKETS = 128


def _meta(q: Tensor, rel_k, rel_v, key_padding_mask, dropout_p, causal, block_m, block_n) -> dict:
    r = (rel_k if rel_k is not None else rel_v).shape[-2]
    return dict(
        HAS_RK=rel_k is not None, HAS_RV=rel_v is not None, HAS_KPM=key_padding_mask is not None,
        CAUSAL=causal, DROPOUT=dropout_p > 0.0, ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=max(16, triton.next_power_of_2(q.shape[-1])),
        BLOCK_R=max(16, triton.next_power_of_2(r)),
        PREC="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",  # tf32: ignored for bf16/fp16
    )


def _table(table: Optional[Tensor], dtype) -> tuple[Tensor | None, int]:
    """Contiguous table in the compute dtype and its head stride (0: shared by every head)."""
    if table is None:
        return None, 0
    table = table.to(dtype).contiguous()
    return table, (table.stride(0) if table.dim() == 3 else 0)


def _key_padding(key_padding_mask: Optional[Tensor]) -> Tensor | None:
    return None if key_padding_mask is None else key_padding_mask.to(torch.int8).contiguous()


def _blocks(q: Tensor) -> tuple[int, int]:
    # 64 x 64 tiles at D = 64 fit the registers of every recent NVIDIA part; the interpreter (tests, CPU)
    # is quicker with the smallest tile tl.dot accepts.
    return (64, 64) if q.is_cuda else (16, 16)


@torch.library.custom_op("relnmt::relative_attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, rel_k: Optional[Tensor], rel_v: Optional[Tensor],
                  key_padding_mask: Optional[Tensor], seed: Optional[Tensor], clip: int, lo: int, causal: bool,
                  q_offset: int, dropout_p: float) -> tuple[Tensor, Tensor]:
    b, h, nq, d = q.shape
    nk = k.shape[2]
    block_m, block_n = _blocks(q)
    meta = _meta(q, rel_k, rel_v, key_padding_mask, dropout_p, causal, block_m, block_n)
    rk, s_rkh = _table(rel_k, q.dtype)
    rv, s_rvh = _table(rel_v, q.dtype)
    r = (rk if rk is not None else rv).shape[-2]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    # (B, N, H, D) in memory: the layer's merge of the heads is then a view, and one copy less is kept for backward
    out = torch.empty(b, nq, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(b, h, nq, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    triton_code.forward_kernel[(triton.cdiv(nq, block_m), b * h)](
        q, k, v, rk, rv, _key_padding(key_padding_mask), seed, out, lse,
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], s_rkh, s_rvh, *out.stride()[:3],
        h, nq, nk, d, r, clip, lo, q_offset, 1.0 / math.sqrt(d), dropout_p, **meta)
    return out, lse


@_attention_op.register_fake
def _(q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p):
    b, h, nq, _ = q.shape
    out = q.new_empty((b, nq, h, q.shape[-1])).transpose(1, 2)
    return out, q.new_empty((b, h, nq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)


@torch.library.custom_op("relnmt::relative_attention_backward", mutates_args=())
def _backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, rel_k: Optional[Tensor], rel_v: Optional[Tensor],
                 key_padding_mask: Optional[Tensor], seed: Optional[Tensor], out: Tensor, lse: Tensor, clip: int,
                 lo: int, causal: bool, q_offset: int, dropout_p: float
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dQ, dK, dV and per-row bucket sums of the score gradients and of the probabilities (for the gradients
    of the a^K and a^V tables)."""
    b, h, nq, d = q.shape
    nk = k.shape[2]
    block_m, block_n = _blocks(q)
    meta = _meta(q, rel_k, rel_v, key_padding_mask, dropout_p, causal, block_m, block_n)
    rk, s_rkh = _table(rel_k, q.dtype)
    rv, s_rvh = _table(rel_v, q.dtype)
    r = (rk if rk is not None else rv).shape[-2]
    q, k, v, grad_out = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v, grad_out))
    delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1).contiguous()  # dO_i . out_i
    # written in (B, H, N, D) order whatever the inputs' strides (heads are usually a transposed view)
    grad_q, grad_k, grad_v = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    ds_mass = torch.zeros(b, h, nq, r if rk is not None else 0, dtype=lse.dtype, device=q.device)
    p_mass = torch.zeros(b, h, nq, r if rv is not None else 0, dtype=lse.dtype, device=q.device)
    kpm = _key_padding(key_padding_mask)
    shape = (h, nq, nk, d, r, clip, lo, q_offset, 1.0 / math.sqrt(d), dropout_p)
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *grad_out.stride()[:3], s_rkh, s_rvh)
    triton_code.backward_kv_kernel[(triton.cdiv(nk, block_n), b * h)](
        q, k, v, rk, rv, kpm, seed, grad_out, lse, delta, grad_k, grad_v, *strides, *shape, **meta)
    triton_code.backward_q_kernel[(triton.cdiv(nq, block_m), b * h)](
        q, k, v, rk, rv, kpm, seed, grad_out, lse, delta, grad_q, ds_mass if rk is not None else None,
        p_mass if rv is not None else None, *strides, *shape, **meta)
    return grad_q, grad_k, grad_v, ds_mass, p_mass


@_backward_op.register_fake
def _(grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse, clip, lo, causal, q_offset, dropout_p):
    b, h, nq, _ = q.shape
    r = (rel_k if rel_k is not None else rel_v).shape[-2]
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((b, h, nq, r if rel_k is not None else 0), dtype=lse.dtype),
            q.new_empty((b, h, nq, r if rel_v is not None else 0), dtype=lse.dtype))


def _setup_context(ctx, inputs, output):
    q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p = inputs
    out, lse = output  # O(N): no (N, N) tensor and no bucket masses are kept
    ctx.save_for_backward(q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse)
    ctx.args = (clip, lo, causal, q_offset, dropout_p)


def _table_grad(weights: Tensor, x: Tensor, table: Tensor) -> Tensor:
    """sum over (b, i) of bucket weights (B, H, Nq, R) times rows x (B, H, Nq, D): (H, R, D), or (R, D) shared."""
    grad = torch.einsum("bhir,bhid->hrd", weights, x.to(weights.dtype))
    return (grad.sum(0) if table.dim() == 2 else grad).to(table.dtype)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse = ctx.saved_tensors
    grad_q, grad_k, grad_v, ds_mass, p_mass = _backward_op(
        grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse, *ctx.args)
    scale = 1.0 / math.sqrt(q.shape[-1])
    grad_rel_k = None if rel_k is None else _table_grad(ds_mass, q, rel_k) * scale
    grad_rel_v = None if rel_v is None else _table_grad(p_mass, grad_out, rel_v)
    return grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v, None, None, None, None, None, None, None


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def supports(q: Tensor, num_buckets: int) -> bool:
    """Shapes the kernel handles: head size a tl.dot can tile, the edge window within the register budget."""
    return 16 <= q.shape[-1] <= 256 and num_buckets <= MAX_BUCKETS


def relative_attention(q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None, clip: int,
                       lo: int, key_padding_mask: Tensor | None = None, causal: bool = False, q_offset: int = 0,
                       dropout_p: float = 0.0) -> Tensor:
    """Eq. 3-5 like nmt.attention.relation_aware_attention, with the tables already cut to the window of
    edge vectors that occurs (rows lo..lo+R-1 of the 2k+1). At least one table must be given."""
    # drawn on the device (no host sync), and only when there is dropout (decoding and eval launch nothing for it)
    seed = torch.randint(0, 2**31 - 1, (1,), device=q.device) if dropout_p > 0.0 else None
    out, _ = _attention_op(q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p)
    return out


def dropout_keep_mask(seed: Tensor, b: int, h: int, nq: int, nk: int, dropout_p: float) -> Tensor:
    """The (B, H, Nq, Nk) keep mask the kernels draw for `seed` (for tests against a reference)."""
    keep = torch.empty(b * h, nq, nk, dtype=torch.int8, device=seed.device)
    triton_code.draw_keep_kernel[(b * h, nq)](seed, keep, nq, nk, dropout_p,
                                              BLOCK_N=max(16, triton.next_power_of_2(nk)))
    return keep.view(b, h, nq, nk).bool()
