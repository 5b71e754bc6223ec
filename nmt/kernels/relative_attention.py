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
Tests run these kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor

# Widest window of edge vectors (R = 2k+1, or the part of it the lengths reach) kept in registers per row.
MAX_BUCKETS = 128


@triton.jit
def _buckets(dist, CLIP, LO, BLOCK_R: tl.constexpr):
    """Window column of each pair's edge vector: clip(j - i, k) + k - lo, kept inside the register block."""
    bucket = tl.minimum(tl.maximum(dist, -CLIP), CLIP) + CLIP - LO
    return tl.minimum(tl.maximum(bucket, 0), BLOCK_R - 1)


@triton.jit
def _bucket_sums(w, dist, qpos, start_n, rcol, CLIP, LO, BLOCK_N: tl.constexpr):
    """(M, N) weights of one key block summed into (M, R) distance buckets, without a scatter.

    A block wholly left (right) of every row's window only adds its row sums to the first (last) bucket;
    only blocks within k of the diagonal need per-distance sums."""
    r_abs = (rcol + LO)[None, :]
    largest = start_n + BLOCK_N - 1 - tl.min(qpos, 0)  # the block's largest and smallest j - i
    smallest = start_n - tl.max(qpos, 0)
    if largest <= -CLIP:
        sums = tl.where(r_abs == 0, tl.sum(w, 1)[:, None], 0.0)
    elif (smallest >= CLIP) & (smallest > -CLIP):
        sums = tl.where(r_abs == 2 * CLIP, tl.sum(w, 1)[:, None], 0.0)
    else:
        key = qpos[:, None] + r_abs - CLIP - start_n  # the one key of an interior bucket, as a block column
        interior = (key >= 0) & (key < BLOCK_N) & (r_abs > 0) & (r_abs < 2 * CLIP)
        sums = tl.where(interior, tl.gather(w, tl.minimum(tl.maximum(key, 0), BLOCK_N - 1), 1), 0.0)
        left = tl.sum(tl.where(dist <= -CLIP, w, 0.0), 1)
        right = tl.sum(tl.where((dist >= CLIP) & (dist > -CLIP), w, 0.0), 1)  # k = 0: one bucket, counted once
        sums += tl.where(r_abs == 0, left[:, None], 0.0)
        sums += tl.where(r_abs == 2 * CLIP, right[:, None], 0.0)
    return sums


@triton.jit
def _scores(q, k, q_edge, KPM, b, cols, qpos, NK, CLIP, LO, scale,
            HAS_RK: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_R: tl.constexpr,
            PREC: tl.constexpr):
    """Eq. 4 for one (query block, key block): scaled scores, -inf where a key is not visible."""
    dist = cols[None, :] - qpos[:, None]  # j - i
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    if HAS_RK:
        s += tl.gather(q_edge, _buckets(dist, CLIP, LO, BLOCK_R), 1)
    visible = cols[None, :] < NK
    if HAS_KPM:
        visible = visible & (tl.load(KPM + b * NK + cols, mask=cols < NK, other=1)[None, :] == 0)
    if CAUSAL:
        visible = visible & (dist <= 0)
    return tl.where(visible, s * scale, float("-inf")), dist


@triton.jit
def _keep(SEED, bh, rows, cols, NQ, NK, dropout_p):
    seed = tl.load(SEED)
    return tl.rand(seed, (bh * NQ + rows[:, None]) * NK + cols[None, :]) >= dropout_p


@triton.jit
def _forward(Q, K, V, RK, RV, KPM, SEED, OUT, LSE,
             sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, s_rkh, s_rvh, s_ob, s_oh, s_on,
             H, NQ, NK, D, R, CLIP, LO, Q_OFFSET, scale, dropout_p,
             HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr,
             DROPOUT: tl.constexpr, ACC: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
             PREC: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B * H * N * D may pass 2**31
    b, h = bh // H, bh % H
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dcol, rcol = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
    qpos = rows + Q_OFFSET
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dcol[None, :],
                mask=(rows[:, None] < NQ) & (dcol[None, :] < D), other=0.0)
    table_mask = (rcol[:, None] < R) & (dcol[None, :] < D)
    q_edge = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    if HAS_RK:
        rk = tl.load(RK + h * s_rkh + rcol[:, None] * D + dcol[None, :], mask=table_mask, other=0.0)
        q_edge = tl.dot(q, tl.trans(rk), input_precision=PREC)

    m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
    l_i = tl.zeros((BLOCK_M,), ACC)
    acc = tl.zeros((BLOCK_M, BLOCK_D), ACC)
    mass = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    end = NK
    if CAUSAL:  # key blocks wholly right of the block's last query are never visible
        end = tl.minimum(NK, Q_OFFSET + (tl.program_id(0) + 1) * BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < NK) & (dcol[None, :] < D)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skn + dcol[None, :], mask=kv_mask, other=0.0)
        s, dist = _scores(q, k, q_edge, KPM, b, cols, qpos, NK, CLIP, LO, scale, HAS_RK, HAS_KPM, CAUSAL, BLOCK_R, PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(_keep(SEED, bh, rows, cols, NQ, NK, dropout_p), p / (1.0 - dropout_p), 0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + dcol[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        if HAS_RV:
            mass = mass * alpha[:, None] + _bucket_sums(p, dist, qpos, start_n, rcol, CLIP, LO, BLOCK_N)
        m_i = m_new

    seen = l_i > 0.0  # rows with no visible key (all padding) output 0
    inv = tl.where(seen, 1.0 / tl.where(seen, l_i, 1.0), 0.0)
    out = acc * inv[:, None]
    row_mask = rows < NQ
    if HAS_RV:
        mass = mass * inv[:, None]
        rv = tl.load(RV + h * s_rvh + rcol[:, None] * D + dcol[None, :], mask=table_mask, other=0.0)
        out += tl.dot(mass.to(rv.dtype), rv, input_precision=PREC)  # Eq. 3's sum_j alpha_ij a^V_ij
    tl.store(OUT + b * s_ob + h * s_oh + rows[:, None] * s_on + dcol[None, :], out.to(OUT.dtype.element_ty),
             mask=row_mask[:, None] & (dcol[None, :] < D))
    tl.store(LSE + bh * NQ + rows, tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("inf")), mask=row_mask)


@triton.jit
def _probs_and_grads(q, k, v, do, q_edge, do_edge, lse, delta, KPM, SEED, b, bh, rows, cols, qpos,
                     NQ, NK, CLIP, LO, scale, dropout_p,
                     HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr,
                     DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, PREC: tl.constexpr):
    """Recomputed probabilities (as used: after dropout) and score gradients of one (query, key) block."""
    s, dist = _scores(q, k, q_edge, KPM, b, cols, qpos, NK, CLIP, LO, scale, HAS_RK, HAS_KPM, CAUSAL, BLOCK_R, PREC)
    p = tl.exp(s - lse[:, None])  # lse = +inf on rows with nothing visible: p = 0
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # d alpha_ij = dO_i . (v_j + a^V_ij)
    if HAS_RV:
        dp += tl.gather(do_edge, _buckets(dist, CLIP, LO, BLOCK_R), 1)
    used = p
    if DROPOUT:
        keep = _keep(SEED, bh, rows, cols, NQ, NK, dropout_p)
        used = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
    ds = p * (dp - delta[:, None])  # softmax backward; sum_j alpha_ij d alpha_ij = dO_i . out_i
    return used, ds, dist


@triton.jit
def _load_query_side(Q, DO, RK, RV, LSE, DELTA, b, h, bh, rows, dcol, rcol,
                     sqb, sqh, sqn, sdb, sdh, sdn, s_rkh, s_rvh, NQ, D, R,
                     HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, ACC: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr, PREC: tl.constexpr):
    mask = (rows[:, None] < NQ) & (dcol[None, :] < D)
    q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqn + dcol[None, :], mask=mask, other=0.0)
    do = tl.load(DO + b * sdb + h * sdh + rows[:, None] * sdn + dcol[None, :], mask=mask, other=0.0)
    table_mask = (rcol[:, None] < R) & (dcol[None, :] < D)
    q_edge = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    do_edge = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    if HAS_RK:
        rk = tl.load(RK + h * s_rkh + rcol[:, None] * D + dcol[None, :], mask=table_mask, other=0.0)
        q_edge = tl.dot(q, tl.trans(rk), input_precision=PREC)
    if HAS_RV:
        rv = tl.load(RV + h * s_rvh + rcol[:, None] * D + dcol[None, :], mask=table_mask, other=0.0)
        do_edge = tl.dot(do, tl.trans(rv), input_precision=PREC)
    lse = tl.load(LSE + bh * NQ + rows, mask=rows < NQ, other=float("inf"))
    delta = tl.load(DELTA + bh * NQ + rows, mask=rows < NQ, other=0.0)
    return q, do, q_edge, do_edge, lse, delta


@triton.jit
def _backward_kv(Q, K, V, RK, RV, KPM, SEED, DO, LSE, DELTA, DK, DV,
                 sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, s_rkh, s_rvh,
                 H, NQ, NK, D, R, CLIP, LO, Q_OFFSET, scale, dropout_p,
                 HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr,
                 DROPOUT: tl.constexpr, ACC: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
             PREC: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B * H * N * D may pass 2**31
    b, h = bh // H, bh % H
    start_n = tl.program_id(0) * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    dcol, rcol = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
    kv_mask = (cols[:, None] < NK) & (dcol[None, :] < D)
    k = tl.load(K + b * skb + h * skh + cols[:, None] * skn + dcol[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + dcol[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    dv = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    begin = 0
    if CAUSAL:  # query blocks wholly before this key block never see it
        begin = tl.maximum(start_n - Q_OFFSET, 0) // BLOCK_M * BLOCK_M
    for start_m in range(begin, NQ, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q, do, q_edge, do_edge, lse, delta = _load_query_side(
            Q, DO, RK, RV, LSE, DELTA, b, h, bh, rows, dcol, rcol, sqb, sqh, sqn, sdb, sdh, sdn, s_rkh, s_rvh, NQ, D, R,
            HAS_RK, HAS_RV, ACC, BLOCK_M, BLOCK_R, PREC)
        used, ds, dist = _probs_and_grads(q, k, v, do, q_edge, do_edge, lse, delta, KPM, SEED, b, bh, rows, cols,
                                          rows + Q_OFFSET, NQ, NK, CLIP, LO, scale, dropout_p,
                                          HAS_RK, HAS_RV, HAS_KPM, CAUSAL, DROPOUT, BLOCK_R, PREC)
        dv += tl.dot(tl.trans(used.to(do.dtype)), do, input_precision=PREC)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    tl.store(DK + (bh * NK + cols[:, None]) * D + dcol[None, :], (dk * scale).to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + (bh * NK + cols[:, None]) * D + dcol[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _backward_q(Q, K, V, RK, RV, KPM, SEED, DO, LSE, DELTA, DQ, DS_MASS, P_MASS,
                sqb, sqh, sqn, skb, skh, skn, svb, svh, svn, sdb, sdh, sdn, s_rkh, s_rvh,
                H, NQ, NK, D, R, CLIP, LO, Q_OFFSET, scale, dropout_p,
                HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr,
                DROPOUT: tl.constexpr, ACC: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
             PREC: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)  # 64-bit offsets: B * H * N * D may pass 2**31
    b, h = bh // H, bh % H
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    qpos = rows + Q_OFFSET
    dcol, rcol = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
    q, do, q_edge, do_edge, lse, delta = _load_query_side(
        Q, DO, RK, RV, LSE, DELTA, b, h, bh, rows, dcol, rcol, sqb, sqh, sqn, sdb, sdh, sdn, s_rkh, s_rvh, NQ, D, R,
        HAS_RK, HAS_RV, ACC, BLOCK_M, BLOCK_R, PREC)
    dq = tl.zeros((BLOCK_M, BLOCK_D), ACC)
    ds_mass = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    p_mass = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, Q_OFFSET + (tl.program_id(0) + 1) * BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (cols[:, None] < NK) & (dcol[None, :] < D)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skn + dcol[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + dcol[None, :], mask=kv_mask, other=0.0)
        used, ds, dist = _probs_and_grads(q, k, v, do, q_edge, do_edge, lse, delta, KPM, SEED, b, bh, rows, cols, qpos,
                                       NQ, NK, CLIP, LO, scale, dropout_p,
                                       HAS_RK, HAS_RV, HAS_KPM, CAUSAL, DROPOUT, BLOCK_R, PREC)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
        if HAS_RK:
            ds_mass += _bucket_sums(ds, dist, qpos, start_n, rcol, CLIP, LO, BLOCK_N)
        if HAS_RV:
            p_mass += _bucket_sums(used, dist, qpos, start_n, rcol, CLIP, LO, BLOCK_N)
    row_mask = rows < NQ
    if HAS_RV:
        tl.store(P_MASS + (bh * NQ + rows[:, None]) * R + rcol[None, :], p_mass,
                 mask=row_mask[:, None] & (rcol[None, :] < R))
    if HAS_RK:  # d q_i gets sum_j ds_ij a^K_ij = (bucket sums of ds) @ w^K
        bucket_mask = rcol[None, :] < R
        rk = tl.load(RK + h * s_rkh + rcol[:, None] * D + dcol[None, :], mask=(rcol[:, None] < R) & (dcol[None, :] < D),
                     other=0.0)
        dq += tl.dot(ds_mass.to(rk.dtype), rk, input_precision=PREC)
        tl.store(DS_MASS + (bh * NQ + rows[:, None]) * R + rcol[None, :], ds_mass, mask=row_mask[:, None] & bucket_mask)
    tl.store(DQ + (bh * NQ + rows[:, None]) * D + dcol[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=row_mask[:, None] & (dcol[None, :] < D))


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
                  key_padding_mask: Optional[Tensor], seed: Tensor, clip: int, lo: int, causal: bool,
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
    _forward[(triton.cdiv(nq, block_m), b * h)](
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
                 key_padding_mask: Optional[Tensor], seed: Tensor, out: Tensor, lse: Tensor, clip: int, lo: int,
                 causal: bool, q_offset: int, dropout_p: float) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
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
    _backward_kv[(triton.cdiv(nk, block_n), b * h)](
        q, k, v, rk, rv, kpm, seed, grad_out, lse, delta, grad_k, grad_v, *strides, *shape, **meta)
    _backward_q[(triton.cdiv(nq, block_m), b * h)](
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
    seed = torch.randint(0, 2**31 - 1, (1,), device=q.device)  # on the device: no host sync
    out, _ = _attention_op(q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p)
    return out


def dropout_keep_mask(seed: Tensor, b: int, h: int, nq: int, nk: int, dropout_p: float) -> Tensor:
    """The (B, H, Nq, Nk) keep mask the kernels draw for `seed` (for tests against a reference)."""
    keep = torch.empty(b * h, nq, nk, dtype=torch.int8, device=seed.device)
    _draw_keep[(b * h, nq)](seed, keep, nq, nk, dropout_p, BLOCK_N=max(16, triton.next_power_of_2(nk)))
    return keep.view(b, h, nq, nk).bool()


@triton.jit
def _draw_keep(SEED, KEEP, NQ, NK, dropout_p, BLOCK_N: tl.constexpr):
    bh, row = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    keep = _keep(SEED, bh, row + tl.zeros((1,), tl.int32), cols, NQ, NK, dropout_p)
    tl.store(KEEP + (bh * NQ + row) * NK + cols[None, :], keep.to(tl.int8), mask=cols[None, :] < NK)
