"""The Triton device code of the fused relation-aware attention (Eq. 3-5); nmt/kernels/relative_attention.py
launches it as a torch custom op and says how it works.

Every kernel takes its tensors, then `strides` (Strides), `sizes` (Sizes: what changes with the model), the
lengths that change with every batch (NQ, NK, R, LO, Q_OFFSET: never specialized), and the constexprs of Meta by
name (the three tuples: nmt/kernels/kernel_args.py): the terms present and the tile shapes BLOCK_M query rows, BLOCK_N keys, BLOCK_D head dims and BLOCK_R edge
vectors (the window rows lo..lo+R-1 of the 2k+1). Meta stays separate parameters rather than one constexpr tuple:
Triton 3.3 cannot read a constexpr tuple's fields, and 3.4-3.5 cannot hand one on to a helper."""

import triton
import triton.language as tl

# Integers that change with every batch (lengths, the edge window, the decoding step). Triton would otherwise
# specialize on them (== 1, divisible by 16) and compile all three kernels anew for n = 40 after n = 48. They stay
# separate parameters: do_not_specialize does not reach into a tuple's items.
BATCH_VARYING = ["NQ", "NK", "R", "LO", "Q_OFFSET"]


@triton.jit
def _program_head(H):
    """This program's batch-head (B * H on grid axis 0, up to 2**31 - 1; 64-bit offsets past 2**31), batch, head."""
    bh = tl.program_id(0).to(tl.int64)
    return bh, bh // H, bh % H


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
def _scores(q, k, q_edge, KPM, b, cols, qpos, NK, LO, sizes, HAS_RK: tl.constexpr, HAS_KPM: tl.constexpr,
            CAUSAL: tl.constexpr, BLOCK_R: tl.constexpr, PREC: tl.constexpr):
    """Eq. 4 for one (query block, key block): scaled scores, -inf where a key is not visible."""
    dist = cols[None, :] - qpos[:, None]  # j - i
    s = tl.dot(q, tl.trans(k), input_precision=PREC)
    if HAS_RK:
        s += tl.gather(q_edge, _buckets(dist, sizes.CLIP, LO, BLOCK_R), 1)
    visible = cols[None, :] < NK
    if HAS_KPM:
        visible = visible & (tl.load(KPM + b * NK + cols, mask=cols < NK, other=1)[None, :] == 0)
    if CAUSAL:
        visible = visible & (dist <= 0)
    return tl.where(visible, s * sizes.scale, float("-inf")), dist


@triton.jit
def _edge_table(T, h, s_th, rcol, dcol, R, D):
    """The (R, D) tile of edge vectors of head h (s_th = 0: one table shared by every head), zero-padded."""
    return tl.load(T + h * s_th + rcol[:, None] * D + dcol[None, :], mask=(rcol[:, None] < R) & (dcol[None, :] < D),
                   other=0.0)


@triton.jit
def _load_rows(BASE, b, h, rows, strides, dcol, N, D):
    """The (rows, BLOCK_D) tile of head h of batch b in a (B, H, N, D) tensor of (batch, head, row) `strides`,
    zero past N and D."""
    return tl.load(BASE + b * strides[0] + h * strides[1] + rows[:, None] * strides[2] + dcol[None, :],
                   mask=(rows[:, None] < N) & (dcol[None, :] < D), other=0.0)


@triton.jit
def _keep(SEED, bh, rows, cols, NQ, NK, dropout_p):
    seed = tl.load(SEED)
    return tl.rand(seed, (bh * NQ + rows[:, None]) * NK + cols[None, :]) >= dropout_p


@triton.jit(do_not_specialize=BATCH_VARYING)
def forward_kernel(
        Q, K, V, RK, RV, KPM, SEED, OUT, LSE, strides, sizes, NQ, NK, R, LO, Q_OFFSET,
        HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
        ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
        PREC: tl.constexpr):
    bh, b, h = _program_head(sizes.H)
    D, CLIP = sizes.D, sizes.CLIP
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    dcol, rcol = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
    qpos = rows + Q_OFFSET
    q = _load_rows(Q, b, h, rows, strides.q, dcol, NQ, D)
    q_edge = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    if HAS_RK:
        q_edge = tl.dot(q, tl.trans(_edge_table(RK, h, strides.rk, rcol, dcol, R, D)), input_precision=PREC)

    m_i = tl.full((BLOCK_M,), float("-inf"), ACC)
    l_i = tl.zeros((BLOCK_M,), ACC)
    acc = tl.zeros((BLOCK_M, BLOCK_D), ACC)
    mass = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    end = NK
    if CAUSAL:  # key blocks wholly right of the block's last query are never visible
        end = tl.minimum(NK, Q_OFFSET + (tl.program_id(1) + 1) * BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, b, h, cols, strides.k, dcol, NK, D)
        s, dist = _scores(q, k, q_edge, KPM, b, cols, qpos, NK, LO, sizes, HAS_RK, HAS_KPM, CAUSAL, BLOCK_R, PREC)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing visible yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(_keep(SEED, bh, rows, cols, NQ, NK, sizes.dropout_p), p / (1.0 - sizes.dropout_p), 0.0)
        v = _load_rows(V, b, h, cols, strides.v, dcol, NK, D)
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
        rv = _edge_table(RV, h, strides.rv, rcol, dcol, R, D)
        out += tl.dot(mass.to(rv.dtype), rv, input_precision=PREC)  # Eq. 3's sum_j alpha_ij a^V_ij
    so = strides.o
    tl.store(OUT + b * so[0] + h * so[1] + rows[:, None] * so[2] + dcol[None, :], out.to(OUT.dtype.element_ty),
             mask=row_mask[:, None] & (dcol[None, :] < D))
    tl.store(LSE + bh * NQ + rows, tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("inf")), mask=row_mask)


@triton.jit
def _probs_and_grads(q, k, v, do, q_edge, do_edge, lse, delta, KPM, SEED, b, bh, rows, cols, qpos, NQ, NK, LO, sizes,
                     HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr,
                     DROPOUT: tl.constexpr, BLOCK_R: tl.constexpr, PREC: tl.constexpr):
    """Recomputed probabilities (as used: after dropout) and score gradients of one (query, key) block."""
    s, dist = _scores(q, k, q_edge, KPM, b, cols, qpos, NK, LO, sizes, HAS_RK, HAS_KPM, CAUSAL, BLOCK_R, PREC)
    p = tl.exp(s - lse[:, None])  # lse = +inf on rows with nothing visible: p = 0
    dp = tl.dot(do, tl.trans(v), input_precision=PREC)  # d alpha_ij = dO_i . (v_j + a^V_ij)
    if HAS_RV:
        dp += tl.gather(do_edge, _buckets(dist, sizes.CLIP, LO, BLOCK_R), 1)
    used = p
    if DROPOUT:
        keep = _keep(SEED, bh, rows, cols, NQ, NK, sizes.dropout_p)
        used = tl.where(keep, p / (1.0 - sizes.dropout_p), 0.0)
        dp = tl.where(keep, dp / (1.0 - sizes.dropout_p), 0.0)
    ds = p * (dp - delta[:, None])  # softmax backward; sum_j alpha_ij d alpha_ij = dO_i . out_i
    return used, ds, dist


@triton.jit
def _load_query_side(Q, DO, RK, RV, LSE, DELTA, b, h, bh, rows, dcol, rcol, strides, NQ, D, R, HAS_RK: tl.constexpr,
                     HAS_RV: tl.constexpr, ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
                     PREC: tl.constexpr):
    q = _load_rows(Q, b, h, rows, strides.q, dcol, NQ, D)
    do = _load_rows(DO, b, h, rows, strides.o, dcol, NQ, D)
    q_edge = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    do_edge = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    if HAS_RK:
        q_edge = tl.dot(q, tl.trans(_edge_table(RK, h, strides.rk, rcol, dcol, R, D)), input_precision=PREC)
    if HAS_RV:
        do_edge = tl.dot(do, tl.trans(_edge_table(RV, h, strides.rv, rcol, dcol, R, D)), input_precision=PREC)
    lse = tl.load(LSE + bh * NQ + rows, mask=rows < NQ, other=float("inf"))
    delta = tl.load(DELTA + bh * NQ + rows, mask=rows < NQ, other=0.0)
    return q, do, q_edge, do_edge, lse, delta


@triton.jit(do_not_specialize=BATCH_VARYING)
def backward_kv_kernel(
        Q, K, V, RK, RV, KPM, SEED, DO, LSE, DELTA, DK, DV, strides, sizes, NQ, NK, R, LO, Q_OFFSET,
        HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
        ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
        PREC: tl.constexpr):
    bh, b, h = _program_head(sizes.H)
    D = sizes.D
    start_n = tl.program_id(1) * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    dcol, rcol = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
    kv_mask = (cols[:, None] < NK) & (dcol[None, :] < D)
    k = _load_rows(K, b, h, cols, strides.k, dcol, NK, D)
    v = _load_rows(V, b, h, cols, strides.v, dcol, NK, D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    dv = tl.zeros((BLOCK_N, BLOCK_D), ACC)
    begin = 0
    if CAUSAL:  # query blocks wholly before this key block never see it
        begin = tl.maximum(start_n - Q_OFFSET, 0) // BLOCK_M * BLOCK_M
    for start_m in range(begin, NQ, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        q, do, q_edge, do_edge, lse, delta = _load_query_side(Q, DO, RK, RV, LSE, DELTA, b, h, bh, rows, dcol, rcol,
                                                              strides, NQ, D, R, HAS_RK, HAS_RV, ACC, BLOCK_M,
                                                              BLOCK_R, PREC)
        used, ds, _ = _probs_and_grads(q, k, v, do, q_edge, do_edge, lse, delta, KPM, SEED, b, bh, rows, cols,
                                       rows + Q_OFFSET, NQ, NK, LO, sizes, HAS_RK, HAS_RV, HAS_KPM, CAUSAL, DROPOUT,
                                       BLOCK_R, PREC)
        dv += tl.dot(tl.trans(used.to(do.dtype)), do, input_precision=PREC)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    tl.store(DK + (bh * NK + cols[:, None]) * D + dcol[None, :], (dk * sizes.scale).to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + (bh * NK + cols[:, None]) * D + dcol[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit(do_not_specialize=BATCH_VARYING)
def backward_q_kernel(
        Q, K, V, RK, RV, KPM, SEED, DO, LSE, DELTA, DQ, DS_MASS, P_MASS, strides, sizes, NQ, NK, R, LO, Q_OFFSET,
        HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_KPM: tl.constexpr, CAUSAL: tl.constexpr, DROPOUT: tl.constexpr,
        ACC: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
        PREC: tl.constexpr):
    bh, b, h = _program_head(sizes.H)
    D, CLIP = sizes.D, sizes.CLIP
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    qpos = rows + Q_OFFSET
    dcol, rcol = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_R)
    q, do, q_edge, do_edge, lse, delta = _load_query_side(Q, DO, RK, RV, LSE, DELTA, b, h, bh, rows, dcol, rcol,
                                                          strides, NQ, D, R, HAS_RK, HAS_RV, ACC, BLOCK_M, BLOCK_R,
                                                          PREC)
    dq = tl.zeros((BLOCK_M, BLOCK_D), ACC)
    ds_mass = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    p_mass = tl.zeros((BLOCK_M, BLOCK_R), ACC)
    end = NK
    if CAUSAL:
        end = tl.minimum(NK, Q_OFFSET + (tl.program_id(1) + 1) * BLOCK_M)
    for start_n in range(0, end, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        k = _load_rows(K, b, h, cols, strides.k, dcol, NK, D)
        v = _load_rows(V, b, h, cols, strides.v, dcol, NK, D)
        used, ds, dist = _probs_and_grads(q, k, v, do, q_edge, do_edge, lse, delta, KPM, SEED, b, bh, rows, cols, qpos,
                                          NQ, NK, LO, sizes, HAS_RK, HAS_RV, HAS_KPM, CAUSAL, DROPOUT, BLOCK_R, PREC)
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
        rk = _edge_table(RK, h, strides.rk, rcol, dcol, R, D)
        dq += tl.dot(ds_mass.to(rk.dtype), rk, input_precision=PREC)
        tl.store(DS_MASS + (bh * NQ + rows[:, None]) * R + rcol[None, :], ds_mass,
                 mask=row_mask[:, None] & (rcol[None, :] < R))
    tl.store(DQ + (bh * NQ + rows[:, None]) * D + dcol[None, :], (dq * sizes.scale).to(DQ.dtype.element_ty),
             mask=row_mask[:, None] & (dcol[None, :] < D))


@triton.jit
def draw_keep_kernel(SEED, KEEP, NQ, NK, dropout_p, BLOCK_N: tl.constexpr):
    bh, row = tl.program_id(0), tl.program_id(1)
    cols = tl.arange(0, BLOCK_N)
    keep = _keep(SEED, bh, row + tl.zeros((1,), tl.int32), cols, NQ, NK, dropout_p)
    tl.store(KEEP + (bh * NQ + row) * NK + cols[None, :], keep.to(tl.int8), mask=cols[None, :] < NK)
