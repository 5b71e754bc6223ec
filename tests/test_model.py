import pytest
import torch

from nmt.modeling import transformer
from nmt.modeling.transformer import BOS, PAD, Transformer, reorder
from nmt.modes import Norm, Position
from tests.conftest import micro_config

VOCAB = 50


def small_model(seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = micro_config(**{**dict(encoder_layers=2, decoder_layers=2, heads=4, clip=3), **overrides})
    return Transformer(cfg, VOCAB).eval()


def tokens(b, n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, VOCAB, (b, n), generator=g)


def test_relative_encoder_is_shift_invariant_and_absolute_is_not():
    """Moving a sentence to later positions (padding before it) changes nothing for a relative-only model."""
    src = tokens(1, 6)
    padded = torch.cat([torch.full((1, 3), PAD), src], 1)
    for position, invariant in ((Position.relative, True), (Position.absolute, False), (Position.learned, False)):
        model = small_model(position=position)
        with torch.no_grad():
            plain, shifted = model.encode(src), model.encode(padded)[:, 3:]
        assert torch.allclose(plain, shifted, atol=1e-5) == invariant, position


@pytest.mark.parametrize("position", [Position.relative, Position.absolute, Position.both, Position.learned])
def test_swapping_two_tokens_changes_the_first_output(position):
    model = small_model(position=position)
    src = tokens(1, 6)
    swapped = src.clone()
    swapped[0, [2, 4]] = swapped[0, [4, 2]]
    with torch.no_grad():
        assert not torch.allclose(model.encode(src)[0, 0], model.encode(swapped)[0, 0], atol=1e-4)


def test_no_position_encoder_cannot_see_order():
    """The control for the test above: with position=none, the encoder is a bag of words."""
    model = small_model(position=Position.none)
    src = tokens(1, 6)
    swapped = src.clone()
    swapped[0, [2, 4]] = swapped[0, [4, 2]]
    with torch.no_grad():
        torch.testing.assert_close(model.encode(src)[0, 0], model.encode(swapped)[0, 0])


def incremental_logits(model, src, tgt):
    cache = model.start(model.encode(src), src)
    steps = []
    for t in range(tgt.shape[1]):
        logits, cache = model.decode(tgt[:, t : t + 1], cache)
        steps.append(logits)
    return torch.cat(steps, 1)


@pytest.mark.parametrize("position", [*Position, "edge_buckets"])
@pytest.mark.parametrize("norm", list(Norm))
@pytest.mark.parametrize("share_heads", [False, True])
def test_incremental_decoding_equals_teacher_forcing(position, norm, share_heads):
    buckets = dict(position=Position.relative, edge_buckets=8, clip=12) if position == "edge_buckets" else {}
    model = small_model(**{"position": position, "norm": norm, "share_heads": share_heads, **buckets})
    src = tokens(3, 7)
    src[1, 5:] = PAD
    tgt = torch.cat([torch.full((3, 1), BOS), tokens(3, 8, seed=2)], 1)
    with torch.no_grad():
        full = model(src, tgt)
        stepwise = incremental_logits(model, src, tgt)
    torch.testing.assert_close(stepwise, full, atol=1e-5, rtol=1e-5)


def test_cache_does_not_leak_between_calls():
    model = small_model()
    src, tgt = tokens(2, 5), tokens(2, 6, seed=3)
    with torch.no_grad():
        first = incremental_logits(model, src, tgt)
        cache = model.start(model.encode(src), src)
        model.decode(tgt[:, :1], cache)  # using a cache must not change it
        assert cache.step == 0 and cache.layers[0].self_kv is None
        second = incremental_logits(model, src, tgt)
    torch.testing.assert_close(first, second, rtol=0, atol=0)


def test_reorder_selects_rows():
    model = small_model()
    src, tgt = tokens(3, 5), tokens(3, 4, seed=4)
    with torch.no_grad():
        cache = model.start(model.encode(src), src)
        _, cache = model.decode(tgt[:, :2], cache)
        order = torch.tensor([2, 2, 0])
        logits, _ = model.decode(tgt[order, 2:3], reorder(cache, order, sentences=order))
        want, _ = model.decode(tgt[order, :3], model.start(model.encode(src[order]), src[order]))
    torch.testing.assert_close(logits[:, 0], want[:, 2], atol=1e-5, rtol=1e-5)


def test_padded_source_rows_match_unpadded():
    model = small_model()
    src = tokens(1, 5)
    tgt = torch.cat([torch.full((1, 1), BOS), tokens(1, 4, seed=5)], 1)
    padded = torch.cat([src, torch.full((1, 3), PAD)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_cross_attention_has_no_edge_tables():
    model = small_model(clip=1, rel_value=False)
    layer = model.decoder[0]
    assert layer.cross_attn.rel_k is None and layer.cross_attn.rel_v is None
    assert layer.self_attn.rel_k.shape[-2] == 3 and layer.self_attn.rel_v is None
    with pytest.raises(ValueError, match="clip"):
        small_model(clip=-1)


def test_learned_positions_are_trained_tables_one_per_side_with_a_clear_limit():
    model = small_model(position=Position.learned, max_positions=12)
    tables = {name: p for name, p in model.named_parameters() if name.endswith("positions.weight")}
    assert sorted(tables) == ["decoder_positions.weight", "encoder_positions.weight"]
    assert all(t.shape == (12, model.cfg.d_model) for t in tables.values())
    model.train()
    model(tokens(2, 5), torch.cat([torch.full((2, 1), BOS), tokens(2, 4)], 1)).sum().backward()
    assert tables["encoder_positions.weight"].grad[:5].abs().sum() > 0  # rows in use learn
    assert tables["encoder_positions.weight"].grad[5:].abs().sum() == 0  # rows past the sentence do not
    with pytest.raises(ValueError, match="exceeds model.max_positions=12"):
        model.encode(tokens(1, 13))
    sinusoid = small_model(position=Position.absolute)
    assert not any(name.endswith("positions.weight") for name, _ in sinusoid.named_parameters())


@pytest.mark.parametrize("position", list(Position))
def test_each_mode_builds_exactly_the_tables_its_predicates_name(position):
    """Position.edge_tables and Position.input_table are the one answer to which tables a mode has: the model built
    for each mode holds edge tables iff the first says so, input tables iff the second, and nothing else asks."""
    model = small_model(position=position)
    has_edges = any(layer.self_attn.rel_k is not None for layer in [*model.encoder, *model.decoder])
    assert has_edges == position.edge_tables
    assert (model.encoder_positions is not None) == (model.decoder_positions is not None) == position.input_table
    if position.input_table:
        assert model.encoder_positions.weight.shape == (model.cfg.max_positions, model.cfg.d_model)


def test_edge_buckets_build_n_rows_per_table_and_are_refused_outside_relative():
    from nmt.config import ConfigError

    model = small_model(edge_buckets=8, clip=12)
    for layer in (model.encoder[0], model.decoder[0]):
        assert layer.self_attn.rel_k.shape == (4, 8, 8) and layer.self_attn.rel_v.shape == (4, 8, 8)
    assert model.decoder[0].cross_attn.rel_k is None
    for overrides, field in ((dict(position=Position.t5), "model.edge_buckets"), (dict(edge_buckets=7), "edge_buckets"),
                             (dict(clip=4), "model.edge_buckets"), (dict(position=Position.both), "model.edge_buckets")):
        with pytest.raises(ConfigError, match=field):
            micro_config(**{"edge_buckets": 8, "clip": 12, **overrides}).check()


def saved_bytes_and_grads(model: Transformer, src, tgt, recompute: bool):
    """The bytes autograd keeps for the backward of a training forward (distinct storages, the parameters left
    out), then the loss and every parameter's gradient; the same dropout masks whatever `recompute`."""
    model.recompute_layers = recompute
    model.zero_grad(set_to_none=True)
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    torch.manual_seed(1)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(src, tgt[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
    loss.backward()
    return sum(saved.values()), loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("position", list(Position))
def test_recomputed_layers_give_the_same_loss_and_gradients_from_fewer_saved_activations(position, monkeypatch):
    """recompute_layers (train.checkpoint_activations) with dropout on, in fp32: the same loss and every parameter's
    gradient, bit for bit (the recomputation draws the same dropout masks), while autograd keeps under a quarter of
    the bytes for the backward (each layer's input instead of its activations)."""
    model = small_model(position=position, dropout=0.3).train()
    src = tokens(3, 9)
    src[1, 6:] = PAD
    tgt = torch.cat([torch.full((3, 1), BOS), tokens(3, 8, seed=2)], 1)
    tgt[2, 5:] = PAD
    kept, want_loss, want = saved_bytes_and_grads(model, src, tgt, recompute=False)
    kept_recomputing, loss, got = saved_bytes_and_grads(model, src, tgt, recompute=True)
    assert kept_recomputing < kept / 4, (kept_recomputing, kept)
    assert torch.equal(loss, want_loss)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name
    monkeypatch.setattr(transformer, "checkpoint", None)  # decoding, validation: no autograd, the layers as they are
    with torch.no_grad():
        incremental_logits(model.eval(), src, tgt)
        model(src, tgt[:, :-1])
