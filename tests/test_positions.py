"""Shaw's descendants (nmt/modeling/positions.py) against their papers' definitions, written out here one pair at a time."""

import math

import pytest
import torch

from nmt.config import ConfigError
from nmt.modeling.attention import MultiHeadAttention
from nmt.modeling.positions import ALiBi, Rotary, T5Bias, alibi_slopes, rotate, rotation, t5_bucket
from nmt.modeling.transformer import BOS, PAD, Transformer, self_attention_positions, stack_positions
from nmt.modes import Position
from tests.conftest import micro_config

VOCAB = 40
DESCENDANTS = [Position.t5, Position.alibi, Position.rope]


def t5_bucket_reference(relative_position: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's _relative_position_bucket for one distance j - i, as Raffel et al.'s code describes it: n = i - j;
    bidirectional: half the buckets for n < 0 (the key after the query), then |n|; causal: max(n, 0). Below
    max_exact = half of the buckets, one bucket per n; then max_exact + log(n / max_exact) / log(max_distance /
    max_exact) * (num_buckets - max_exact), truncated, at most num_buckets - 1."""
    n, ret = -relative_position, 0
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(large, num_buckets - 1)


def press_get_slopes(n: int) -> list[float]:
    """Press et al. 2022's get_slopes, as published with ALiBi."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 64), (8, 20)])
def test_t5_buckets_equal_t5s_definition_at_every_distance(bidirectional, num_buckets, max_distance):
    distance = torch.arange(-1000, 1001)
    got = t5_bucket(distance, bidirectional, num_buckets, max_distance)
    want = torch.tensor([t5_bucket_reference(int(d), bidirectional, num_buckets, max_distance) for d in distance])
    assert torch.equal(got, want)
    assert int(got.max()) == num_buckets - 1  # saturated far away


@pytest.mark.parametrize("heads", [1, 4, 6, 8, 12, 16])
def test_alibi_slopes_equal_press_et_al(heads):
    torch.testing.assert_close(alibi_slopes(heads), torch.tensor(press_get_slopes(heads), dtype=torch.float32),
                               rtol=1e-6, atol=0)


def literal_layer(attn: MultiHeadAttention, x, logit, pad=None, causal=False):
    """One self-attention layer pair by pair: e_ij = logit(b, h, i, j, q, k), softmax over the visible j,
    z_i = sum_j alpha_ij v_j, then the output projection."""
    b_size, n, _ = x.shape
    q, k, v = (attn.split_heads(proj(x)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
    z = torch.zeros_like(q)
    for b in range(b_size):
        for h in range(attn.heads):
            for i in range(n):
                visible = [j for j in range(n) if not (pad is not None and pad[b, j]) and not (causal and j > i)]
                scores = torch.stack([logit(b, h, i, j, q, k) for j in visible])
                alpha = scores.softmax(0)
                z[b, h, i] = sum(a * v[b, h, j] for a, j in zip(alpha, visible))
    return attn.out_proj(z.transpose(1, 2).reshape(b_size, n, -1))


def layer_through_model(attn, scheme, x, pad=None, causal=False):
    positions = stack_positions(scheme, x, x.shape[1], 0, pad)
    return attn(x, attn.project_kv(x, positions.rotation), key_padding_mask=pad, causal=causal, positions=positions)


def layer_inputs(heads=3, d_head=4, n=10, seed=0):
    torch.manual_seed(seed)
    attn = MultiHeadAttention(heads * d_head, heads).double().eval()
    x = torch.randn(2, n, heads * d_head, dtype=torch.float64)
    pad = torch.zeros(2, n, dtype=torch.bool)
    pad[1, 7:] = True
    return attn, x, pad


@pytest.mark.parametrize("causal", [False, True])
def test_t5_layer_equals_the_literal_per_pair_computation(causal):
    attn, x, pad = layer_inputs()
    scheme = T5Bias(attn.heads, num_buckets=8, max_distance=6, causal=causal).double()  # n=10: past max_distance
    torch.nn.init.normal_(scheme.table)
    pad = None if causal else pad
    scale = attn.d_head**-0.5

    def logit(b, h, i, j, q, k):
        return q[b, h, i] @ k[b, h, j] * scale + scheme.table[h, t5_bucket_reference(j - i, not causal, 8, 6)]

    with torch.no_grad():
        torch.testing.assert_close(layer_through_model(attn, scheme, x, pad, causal),
                                   literal_layer(attn, x, logit, pad, causal))


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_layer_equals_the_literal_per_pair_computation(causal):
    """Encoder: -m |i - j| on both sides; decoder: -m (i - j) for j <= i."""
    attn, x, pad = layer_inputs(heads=6)
    scheme = ALiBi(attn.heads, causal=causal)
    slopes = press_get_slopes(attn.heads)
    pad = None if causal else pad
    scale = attn.d_head**-0.5

    def logit(b, h, i, j, q, k):
        return q[b, h, i] @ k[b, h, j] * scale - slopes[h] * ((i - j) if causal else abs(i - j))

    with torch.no_grad():
        torch.testing.assert_close(layer_through_model(attn, scheme, x, pad, causal),
                                   literal_layer(attn, x, logit, pad, causal))


def complex_score(qi, kj, i, j, d):
    """q_i . k_j after rotation, by complex numbers: pair c is the number x_2c + i x_2c+1, turned by angle
    t * 10000^(-2c/D) at position t, and the dot product of two rotated vectors is Re(sum_c q_c conj(k_c))."""
    theta = torch.tensor([10000.0 ** (-2 * c / d) for c in range(d // 2)], dtype=torch.float64)
    zq = torch.complex(qi[0::2], qi[1::2]) * torch.exp(1j * i * theta)
    zk = torch.complex(kj[0::2], kj[1::2]) * torch.exp(1j * j * theta)
    return (zq * zk.conj()).sum().real


def test_rope_equals_complex_rotation_and_depends_only_on_the_distance():
    torch.manual_seed(0)
    d, n = 8, 6
    q, k = torch.randn(2, 3, n, d, dtype=torch.float64), torch.randn(2, 3, n, d, dtype=torch.float64)
    scores = {}
    for offset in (0, 37, 500):
        r = rotation(n, d, offset, "cpu", torch.float64)
        scores[offset] = rotate(q, r) @ rotate(k, r).transpose(-1, -2)
        for b, h, i, j in ((0, 0, 0, 0), (1, 2, 5, 1), (0, 1, 2, 4), (1, 0, 3, 3)):
            want = complex_score(q[b, h, i], k[b, h, j], offset + i, offset + j, d)
            torch.testing.assert_close(scores[offset][b, h, i, j], want)
    torch.testing.assert_close(scores[37], scores[0])  # shifted positions, the same scores
    torch.testing.assert_close(scores[500], scores[0])
    assert not torch.allclose(scores[0][..., 0, 1], (q @ k.transpose(-1, -2))[..., 0, 1])  # it did rotate


@pytest.mark.parametrize("causal", [False, True])
def test_rope_layer_equals_the_literal_per_pair_computation(causal):
    attn, x, pad = layer_inputs(heads=2, d_head=6, n=8)
    pad = None if causal else pad
    scale = attn.d_head**-0.5

    def logit(b, h, i, j, q, k):
        return complex_score(q[b, h, i], k[b, h, j], i, j, attn.d_head) * scale

    with torch.no_grad():
        torch.testing.assert_close(layer_through_model(attn, Rotary(attn.d_head), x, pad, causal),
                                   literal_layer(attn, x, logit, pad, causal))


def model(position, seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = micro_config(**{**dict(encoder_layers=2, decoder_layers=2, heads=4, clip=3, position=position,
                                 t5_buckets=8, t5_max_distance=6), **overrides})
    net = Transformer(cfg, VOCAB).eval()
    for scheme in (net.encoder_self_positions, net.decoder_self_positions):
        if isinstance(scheme, T5Bias):  # zero at initialization: make the bias matter
            torch.nn.init.normal_(scheme.table)
    return net


def tokens(b, n, seed=1):
    return torch.randint(4, VOCAB, (b, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("position", list(Position))
def test_incremental_decoding_equals_full_decoding_in_float64(position):
    net = model(position).double()
    src = tokens(3, 9)
    src[1, 6:] = PAD
    tgt = torch.cat([torch.full((3, 1), BOS), tokens(3, 10, seed=2)], 1)  # past t5_max_distance
    with torch.no_grad():
        full = net(src, tgt)
        cache = net.start(net.encode(src), src)
        steps = []
        for t in range(tgt.shape[1]):
            logits, cache = net.decode(tgt[:, t : t + 1], cache)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("position", DESCENDANTS)
def test_descendants_see_order_and_are_shift_invariant(position):
    """A relative scheme: the encoder tells a swap apart, and moving a sentence right (padding before it, masked)
    changes nothing."""
    net = model(position)
    src = tokens(1, 6)
    swapped = src.clone()
    swapped[0, [1, 4]] = swapped[0, [4, 1]]
    shifted = torch.cat([torch.full((1, 3), PAD), src], 1)
    with torch.no_grad():
        assert not torch.allclose(net.encode(src)[0, 0], net.encode(swapped)[0, 0], atol=1e-4)
        torch.testing.assert_close(net.encode(shifted)[:, 3:], net.encode(src), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position", DESCENDANTS)
def test_decoding_builds_one_row_per_step_and_the_batch_is_broadcast(position):
    scheme = self_attention_positions(micro_config(position=position, heads=4), causal=True)
    x = torch.zeros(5, 1, 32)
    step = stack_positions(scheme, x, 12, 11)
    square = stack_positions(scheme, torch.zeros(5, 12, 32), 12, 0)
    if position == Position.rope:
        assert step.rotation.cos.shape == (1, 4) and square.rotation.cos.shape == (12, 4)
        torch.testing.assert_close(step.rotation.cos, square.rotation.cos[-1:])
    else:
        assert step.bias.shape == (1, 4, 1, 12) and square.bias.shape == (1, 4, 12, 12)  # not (B, H, N, N)
        torch.testing.assert_close(step.bias, square.bias[:, :, -1:])


@pytest.mark.parametrize("position", [Position.relative, Position.none, *DESCENDANTS])
def test_a_source_longer_than_any_table_encodes_and_translates(position):
    from nmt.config import SearchConfig
    from nmt.decoding.decode import input_limit, translate_ids

    net = model(position, max_positions=64)
    assert input_limit(net, 50) is None
    long_source = tokens(1, 600, seed=7)[0].tolist()
    search = SearchConfig(beam=2, max_extra=3)
    out = translate_ids(net, [long_source, long_source[:5]], search, torch.device("cpu"))
    assert len(out) == 2 and out[0] and out[1] == translate_ids(net, [long_source[:5]], search, torch.device("cpu"))[0]
    with torch.no_grad():
        assert torch.isfinite(net.encode(torch.tensor([long_source]))).all()


def test_parameter_counts():
    counts = {p: sum(t.numel() for t in model(p).parameters()) for p in (Position.none, *DESCENDANTS)}
    assert counts[Position.alibi] == counts[Position.rope] == counts[Position.none]
    assert counts[Position.t5] - counts[Position.none] == 2 * 4 * 8  # encoder + decoder tables, heads x buckets
    t5 = model(Position.t5)
    assert {k for k in t5.state_dict() if "self_positions" in k} == {"encoder_self_positions.table",
                                                                     "decoder_self_positions.table"}
    assert not any("self_positions" in k for k in model(Position.alibi).state_dict())


def test_mode_settings_are_checked():
    with pytest.raises(ConfigError, match="position=rope"):
        micro_config(position=Position.rope, d_model=30, heads=2).check()  # head dimension 15
    with pytest.raises(ConfigError, match="model.t5_buckets"):
        micro_config(t5_buckets=7).check()
    with pytest.raises(ConfigError, match="model.t5_max_distance"):
        micro_config(t5_buckets=32, t5_max_distance=16).check()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the GPU check's tests stage runs it "
                    "(scripts/gpu_check.sh, benchmarks/gpu_stages.py)")
@pytest.mark.parametrize("position", [Position.t5, Position.alibi])
def test_bias_modes_reach_sdpas_memory_efficient_kernel(position):
    """With only the memory-efficient kernel allowed, SDPA raises instead of falling back to its math path."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    net = model(position, d_model=64, heads=4, dropout=0.1).cuda().train()
    src = tokens(4, 37).cuda()
    src[2, 30:] = PAD
    tgt = torch.cat([torch.full((4, 1), BOS), tokens(4, 29, seed=2)], 1).cuda()
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]), torch.autocast("cuda", torch.bfloat16):
        net(src, tgt).float().sum().backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad and p.dim() > 0)
