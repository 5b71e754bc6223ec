import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from nmt.kernels.dropout import keep_mask
from nmt.modeling.attention import MultiHeadAttention, relation_aware_attention, relative_buckets
from nmt.modeling.edges import EdgeIndex


def literal_attention(q, k, v, rel_k, rel_v, clip, key_padding_mask=None, causal=False, q_offset=0, row=None):
    """Eq. 3-4 written pair by pair, as in the paper. Rows with no visible key give 0.
    row: the table row of a distance j - i (default: clip(j - i, k) + k)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    out = torch.zeros(B, H, Nq, D, dtype=q.dtype)
    row = row or (lambda distance: max(-clip, min(clip, distance)) + clip)

    def edge(table, h, i, j):
        if table is None:
            return torch.zeros(D, dtype=q.dtype)
        r = row(j - (i + q_offset))
        return table[r] if table.dim() == 2 else table[h, r]

    for b, h, i in itertools.product(range(B), range(H), range(Nq)):
        visible = [
            j for j in range(Nk)
            if not (causal and j > i + q_offset)
            and not (key_padding_mask is not None and key_padding_mask[b, j])
        ]
        if not visible:
            continue
        e = torch.stack([q[b, h, i] @ (k[b, h, j] + edge(rel_k, h, i, j)) / math.sqrt(D) for j in visible])
        alpha = e.softmax(0)
        out[b, h, i] = sum(alpha[n] * (v[b, h, j] + edge(rel_v, h, i, j)) for n, j in enumerate(visible))
    return out


def make_inputs(B=2, H=3, Nq=5, Nk=5, D=4, clip=2, shared=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    table = (2 * clip + 1, D) if shared else (H, 2 * clip + 1, D)
    return r(B, H, Nq, D), r(B, H, Nk, D), r(B, H, Nk, D), r(*table), r(*table)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("terms", ["both", "key", "value", "none"])
@pytest.mark.parametrize("clip", [0, 1, 2, 100])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_literal_equations(shared, terms, clip, causal):
    q, k, v, rk, rv = make_inputs(clip=clip, shared=shared)
    rk = rk if terms in ("both", "key") else None
    rv = rv if terms in ("both", "value") else None
    got = relation_aware_attention(q, k, v, rk, rv, clip, causal=causal)
    want = literal_attention(q, k, v, rk, rv, clip, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("terms", ["both", "key", "none"])
@pytest.mark.parametrize("causal", [False, True])
def test_padding_matches_literal_and_gets_no_mass(side, terms, causal):
    q, k, v, rk, rv = make_inputs(Nq=6, Nk=6, clip=2)
    rk = None if terms == "none" else rk
    rv = rv if terms == "both" else None
    pad = torch.zeros(2, 6, dtype=torch.bool)
    if side == "left":
        pad[0, :2] = True
        pad[1, :1] = True
    else:
        pad[0, 4:] = True
        pad[1, 5:] = True
    got = relation_aware_attention(q, k, v, rk, rv, 2, key_padding_mask=pad, causal=causal)
    want = literal_attention(q, k, v, rk, rv, 2, key_padding_mask=pad, causal=causal)
    assert not got.isnan().any()
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    # Changing what sits in padded keys must not change anything.
    k2, v2 = k.clone(), v.clone()
    k2.transpose(1, 2)[pad] = 1e3  # (B, Nk, H, D) view, indexed by (B, Nk)
    v2.transpose(1, 2)[pad] = -1e3
    again = relation_aware_attention(q, k2, v2, rk, rv, 2, key_padding_mask=pad, causal=causal)
    torch.testing.assert_close(again, got, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("terms", ["both", "key", "none"])
def test_fully_padded_row_is_zero_not_nan(terms):
    q, k, v, rk, rv = make_inputs(clip=1)
    rk = None if terms == "none" else rk
    rv = rv if terms == "both" else None
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1] = True
    q.requires_grad_(True)
    out = relation_aware_attention(q, k, v, rk, rv, 1, key_padding_mask=pad)
    assert not out.isnan().any()
    assert out[1].abs().max() == 0
    out.sum().backward()
    assert not q.grad.isnan().any()


@pytest.mark.parametrize("nq,q_offset", [(1, 0), (1, 4), (1, 7), (3, 2), (4, 4)])
@pytest.mark.parametrize("shared", [False, True])
def test_q_offset_matches_literal(nq, q_offset, shared):
    nk = q_offset + nq
    q, k, v, rk, rv = make_inputs(Nq=nq, Nk=nk, clip=2, shared=shared)
    got = relation_aware_attention(q, k, v, rk, rv, 2, causal=True, q_offset=q_offset)
    want = literal_attention(q, k, v, rk, rv, 2, causal=True, q_offset=q_offset)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_q_offset_rows_equal_full_rows():
    """A query at position t sees the same distances as row t of the full computation."""
    q, k, v, rk, rv = make_inputs(Nq=7, Nk=7, clip=3)
    full = relation_aware_attention(q, k, v, rk, rv, 3, causal=True)
    for t in range(7):
        step = relation_aware_attention(q[:, :, t : t + 1], k[:, :, : t + 1], v[:, :, : t + 1], rk, rv, 3,
                                        causal=True, q_offset=t)
        torch.testing.assert_close(step, full[:, :, t : t + 1], rtol=1e-10, atol=1e-10)


def test_no_tables_equals_sdpa():
    q, k, v, _, _ = make_inputs(Nq=5, Nk=7)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[0, 5:] = True
    got = relation_aware_attention(q, k, v, None, None, 0, key_padding_mask=pad)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_relative_buckets_direction_and_clip():
    b = relative_buckets(3, 5, clip=2)
    # row i, column j holds clip(j - i, 2) + 2: distance +2 and -2 are different vectors
    assert b.tolist() == [[2, 3, 4, 4, 4], [1, 2, 3, 4, 4], [0, 1, 2, 3, 4]]
    assert relative_buckets(1, 4, clip=1, q_offset=3).tolist() == [[0, 0, 0, 1]]
    assert relative_buckets(4, 4, clip=0).unique().tolist() == [0]


def test_wrong_table_size_is_refused():
    q, k, v, rk, rv = make_inputs(clip=2)
    with pytest.raises(ValueError, match="clip=3 needs 7"):
        relation_aware_attention(q, k, v, rk, rv, 3)


def test_gradients_reach_both_tables():
    torch.manual_seed(0)
    for share in (False, True):
        mha = MultiHeadAttention(16, 4, edges=EdgeIndex(2), share_heads=share)
        x = torch.randn(2, 6, 16)
        mha(x, mha.project_kv(x), causal=True).pow(2).sum().backward()
        assert mha.rel_k.grad is not None and mha.rel_k.grad.abs().sum() > 0
        assert mha.rel_v.grad is not None and mha.rel_v.grad.abs().sum() > 0
        assert mha.rel_k.shape == ((5, 4) if share else (4, 5, 4))


def test_separate_key_and_value_tables():
    """a^K and a^V are two tables: a gradient through the key term reaches w^K only, one through the value term
    w^V only."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 4, edges=EdgeIndex(2))
    x = torch.randn(2, 5, 16)
    q, kv = mha.split_heads(mha.q_proj(x)), mha.project_kv(x)
    key_only = relation_aware_attention(q, kv.k, kv.v, mha.rel_k, None, 2)
    value_only = relation_aware_attention(q, kv.k, kv.v, None, mha.rel_v, 2)
    grad_k = torch.autograd.grad(key_only.sum(), (mha.rel_k, mha.rel_v), allow_unused=True)
    grad_v = torch.autograd.grad(value_only.sum(), (mha.rel_k, mha.rel_v), allow_unused=True)
    assert grad_k[0].abs().sum() > 0 and grad_k[1] is None
    assert grad_v[0] is None and grad_v[1].abs().sum() > 0
    assert not torch.equal(mha.rel_k, mha.rel_v)  # drawn apart, not one table twice
    only_k = MultiHeadAttention(16, 4, edges=EdgeIndex(2), rel_value=False)
    assert only_k.rel_v is None and only_k.rel_k is not None
    absolute = MultiHeadAttention(16, 4, edges=None)
    assert absolute.rel_k is None and absolute.rel_v is None


@pytest.mark.parametrize("buckets,clip", [(4, 3), (8, 5), (16, 40)])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("terms", ["both", "key", "value"])
@pytest.mark.parametrize("causal", [False, True])
def test_edge_buckets_match_literal_equations(buckets, clip, shared, terms, causal):
    """model.edge_buckets: a_ij = w_{bucket(j - i)} with T5's buckets up to k, pair by pair, with padding and at
    a decoding offset; the expanded (2k+1)-row table (what the kernel and CTranslate2 read) gives the same."""
    from nmt.modeling.positions import distance_rows
    from tests.test_positions import t5_bucket_reference

    g = torch.Generator().manual_seed(buckets + clip)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    table = (buckets, 4) if shared else (3, buckets, 4)
    rk = torch.randn(*table, generator=g, dtype=torch.float64) if terms in ("both", "key") else None
    rv = torch.randn(*table, generator=g, dtype=torch.float64) if terms in ("both", "value") else None
    row = lambda distance: t5_bucket_reference(distance, not causal, buckets, clip)  # noqa: E731
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    got = relation_aware_attention(q, k, v, rk, rv, clip, pad, causal, edge_buckets=buckets)
    want = literal_attention(q, k, v, rk, rv, clip, pad, causal, row=row)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    if causal:  # one query at offset 6 against the 7 keys so far (incremental decoding)
        step = relation_aware_attention(q[:, :, 6:7], k[:, :, :7], v[:, :, :7], rk, rv, clip, causal=True,
                                        q_offset=6, edge_buckets=buckets)
        want = literal_attention(q[:, :, 6:7], k[:, :, :7], v[:, :, :7], rk, rv, clip, causal=True, q_offset=6,
                                 row=row)
        torch.testing.assert_close(step, want, rtol=1e-10, atol=1e-10)
    rows = distance_rows(clip, buckets, causal)
    expanded = [None if t is None else t.index_select(-2, rows) for t in (rk, rv)]
    torch.testing.assert_close(relation_aware_attention(q, k, v, *expanded, clip, pad, causal), got,
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_edge_buckets_gradients_match_gradcheck(causal):
    """The hand-written backward (a^V on) and autograd (a^K only) with N bucket rows."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 7, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rk, rv = (torch.randn(2, 8, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for tables in ((rk, rv), (rk,)):
        fn = lambda q, k, v, rk, rv=None: relation_aware_attention(  # noqa: E731
            q, k, v, rk, rv, 12, causal=causal, edge_buckets=8)
        assert torch.autograd.gradcheck(fn, (q, k, v, *tables))


def test_edge_buckets_are_exact_near_and_saturate_at_k():
    """16 buckets up to k = 40: the encoder's distances -3..3 each their own vector (exact below 16/4 = 4 each way),
    coarser with distance, every distance from k on in one vector per direction; the decoder's 0..7 exact."""
    from nmt.modeling.positions import LogBuckets

    encoder = LogBuckets(40, 16, causal=False).buckets(1, 121, 60, None)[0].tolist()  # distances -60..60
    at = lambda d: encoder[d + 60]  # noqa: E731
    assert len({at(d) for d in range(-3, 4)}) == 7
    assert {at(d) for d in range(40, 61)} == {15} and {at(-d) for d in range(40, 61)} == {7}
    assert all(at(d) <= at(d + 1) for d in range(1, 60)) and all(at(-d) <= at(-d - 1) for d in range(60))
    assert at(4) == at(5) and len({at(d) for d in range(4, 40)}) == 4  # the logarithmic buckets between
    decoder = LogBuckets(40, 16, causal=True).buckets(1, 61, 60, None)[0].tolist()  # distances -60..0
    assert decoder[-8:] == [7, 6, 5, 4, 3, 2, 1, 0] and set(decoder[:21]) == {15}


def test_wrong_bucket_count_is_refused():
    q, k, v, rk, rv = make_inputs(clip=2)  # 5 rows
    with pytest.raises(ValueError, match="edge_buckets=8 needs 8"):
        relation_aware_attention(q, k, v, rk, rv, 12, edge_buckets=8)


@pytest.mark.parametrize("terms", ["both", "key"])
def test_many_buckets_path_matches_literal_and_autograd(terms, monkeypatch):
    """Long sequences with a large k take the scatter_add path instead of the one-hot GEMM."""
    from nmt.kernels import torch_attention

    q, k, v, rk, rv = make_inputs(B=1, H=2, Nq=12, Nk=12, D=3, clip=20)
    rv = rv if terms == "both" else None
    monkeypatch.setattr(torch_attention, "ONE_HOT_MAX_BUCKETS", 4)
    got = relation_aware_attention(q, k, v, rk, rv, 20, causal=True)
    torch.testing.assert_close(got, literal_attention(q, k, v, rk, rv, 20, causal=True), rtol=1e-10, atol=1e-10)
    inputs = [t.requires_grad_(True) for t in (q, k, v, rk) + ((rv,) if rv is not None else ())]
    fn = lambda q, k, v, rk, rv=None: relation_aware_attention(q, k, v, rk, rv, 20, causal=True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("clip", [0, 2, 9])
def test_hand_written_backward_matches_gradcheck(shared, clip):
    q, k, v, rk, rv = make_inputs(B=2, H=2, Nq=4, Nk=6, D=3, clip=clip, shared=shared)
    pad = torch.zeros(2, 6, dtype=torch.bool)
    pad[1, 4:] = True
    inputs = [t.requires_grad_(True) for t in (q, k, v, rk, rv)]
    for causal, offset in ((False, 0), (True, 2)):
        fn = lambda q, k, v, rk, rv: relation_aware_attention(  # noqa: E731
            q, k, v, rk, rv, clip, key_padding_mask=pad, causal=causal, q_offset=offset)
        assert torch.autograd.gradcheck(fn, inputs)


def reference_with_dropout(q, k, v, rk, rv, clip, p):
    """Plain autograd version of Eq. 3-4 that draws its dropout mask exactly like the fast path."""
    b = relative_buckets(q.shape[2], k.shape[2], clip)
    scale = q.shape[-1] ** -0.5
    gather = lambda t: t.gather(-1, b.expand(*t.shape[:-1], -1))  # noqa: E731
    scores = (q @ k.transpose(-1, -2) + gather(torch.einsum("bhnd,hrd->bhnr", q, rk))) * scale
    probs = scores.softmax(-1)
    keep, keep_scale = keep_mask(probs.shape, p, probs.device)
    dropped = probs * keep * keep_scale
    one_hot = F.one_hot(b, 2 * clip + 1).to(q.dtype)
    return dropped @ v + torch.einsum("bhij,ijr,hrd->bhid", dropped, one_hot, rv)


def test_dropout_forward_and_backward_match_autograd_reference():
    q, k, v, rk, rv = make_inputs(clip=2)
    grads = []
    for fn in (relation_aware_attention, None):
        inputs = [t.detach().clone().requires_grad_(True) for t in (q, k, v, rk, rv)]
        torch.manual_seed(7)
        if fn is None:
            out = reference_with_dropout(*inputs, 2, 0.3)
        else:
            out = fn(*inputs, 2, dropout_p=0.3)
        out.pow(2).sum().backward()
        grads.append([out] + [t.grad for t in inputs])
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shared", [False, True])
def test_self_attention_weights_are_the_literal_alphas(shared):
    """MultiHeadAttention.self_attention_weights (for analysis, experiments/plot_attention_distance.py) gives Eq. 4's
    alpha_ij: the literal equations' output when each key's value is its one-hot position."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(d_model=15, heads=3, edges=EdgeIndex(2), share_heads=shared).double().eval()
    x = torch.randn(2, 5, 15, dtype=torch.float64)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    q, k = layer.split_heads(layer.q_proj(x)), layer.split_heads(layer.k_proj(x))
    one_hot = torch.eye(5, dtype=torch.float64).expand(2, 3, 5, 5)
    want = literal_attention(q, k, one_hot, layer.rel_k, None, 2, key_padding_mask=pad)
    got = layer.self_attention_weights(x, pad).detach()
    torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-10)
    assert got[1, :, :, 3:].eq(0).all()  # no weight on padding


@pytest.mark.parametrize("position", ["relative", "edge_buckets", "absolute", "t5", "alibi", "rope"])
@pytest.mark.parametrize("causal", [False, True])
def test_self_attention_weights_are_the_ones_forward_uses(position, causal):
    """The weights reported for analysis, with the stack's positions (T5's and ALiBi's bias, RoPE's rotation, the
    edge tables), are the ones forward weighs the values with: forward's output = out_proj(alpha @ V)."""
    from nmt.config import ModelConfig
    from nmt.modeling.transformer import self_attention_positions, stack_positions

    torch.manual_seed(0)
    buckets = 8 if position == "edge_buckets" else 0
    position = "relative" if buckets else position
    cfg = ModelConfig(position=position, d_model=16, heads=2, clip=2, dropout=0.0)
    edges = EdgeIndex(12 if buckets else 2, buckets, causal) if position == "relative" else None
    layer = MultiHeadAttention(16, 2, edges=edges).double().eval()
    scheme = self_attention_positions(cfg, causal)
    scheme = scheme.double() if scheme is not None else None
    if position == "t5":
        torch.nn.init.normal_(scheme.table)  # the table starts at zero: ignoring it would go unnoticed
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    positions = stack_positions(scheme, x, 6, 0, pad)
    alpha = layer.self_attention_weights(x, pad, causal, positions)
    out = layer(x, layer.project_kv(x, positions.rotation), pad, causal=causal, positions=positions)
    values = layer.split_heads(layer.v_proj(x))
    want = layer.out_proj((alpha @ values).transpose(1, 2).reshape(2, 6, 16))
    if position == "relative":  # a^V adds its edge vectors to the values: compare the key side only
        layer.rel_v = None
        out = layer(x, layer.project_kv(x), pad, causal=causal, positions=positions)
        want = layer.out_proj((layer.self_attention_weights(x, pad, causal, positions) @ values)
                              .transpose(1, 2).reshape(2, 6, 16))
    torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-9)
    assert torch.allclose(alpha.sum(-1)[0], torch.ones(2, 6, dtype=torch.float64))  # every real query's row sums to 1
    if causal:
        assert alpha[..., 0, 1:].eq(0).all()  # the first query sees only itself


def test_edge_buckets_that_would_divide_by_log_one_are_refused():
    """k <= N/2 leaves no room for the logarithmic buckets (T5's log(k / exact) would be <= 0): a ValueError, not
    garbage indices."""
    q, k, v, _, _ = make_inputs()
    table = torch.randn(3, 8, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="below 2 x clip=4"):
        relation_aware_attention(q, k, v, table, table, 4, causal=True, edge_buckets=8)
