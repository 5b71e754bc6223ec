import dataclasses
import math

import pytest
import torch

from nmt.decoding.search import Uncached, beam_search, beam_search_nbest, greedy, length_penalty
from nmt.modeling.transformer import BOS, EOS, PAD, Transformer
from nmt.modeling.positions import NO_POSITIONS
from nmt.modes import Position, Stop
from tests.conftest import micro_config

A, B_ = 4, 5  # two real tokens of the scripted model's vocabulary (0-3 are PAD, UNK, BOS, EOS)


class ScriptedModel:
    """Next-token probabilities fixed by (step, previous token), as in fairseq's sequence generator tests."""

    def __init__(self, table, later):
        self.table, self.later = table, later

    def encode(self, src):
        return src

    def start(self, memory, src):
        return None  # the prefix, once the first tokens come (one row per hypothesis)

    def decode(self, tokens, prefix):
        prefix = tokens if prefix is None else torch.cat([prefix, tokens], 1)
        step = prefix.shape[1] - 1
        rows = [self.table.get((step, prev), self.later) for prev in prefix[:, -1].tolist()]
        return torch.tensor(rows).log()[:, None, :], prefix

    @staticmethod
    def reorder(prefix, indices, sentences=None):
        return prefix.index_select(0, indices)


def probs(eos=0.0, a=0.0, b=0.0):
    rest = 1.0 - eos - a - b
    return [rest / 2, rest / 2, 1e-12, eos, a, b]  # PAD and UNK share what is left


SCRIPT = {(0, BOS): probs(eos=0.40, a=0.39, b=0.20), (1, A): probs(eos=0.99, a=0.004, b=0.004),
          (1, B_): probs(eos=0.60, a=0.30, b=0.09)}
LATER = probs(eos=0.97, a=0.01, b=0.01)
SRC = torch.tensor([[7, 8, EOS]])


def test_length_penalty_values():
    assert length_penalty(1, 0.6) == 1.0 and length_penalty(7, 0.6, Stop.finished) == pytest.approx(7**0.6)
    assert length_penalty(7, 0.6) == pytest.approx(2**0.6)
    assert length_penalty(25, 1.0) == pytest.approx(5.0)
    assert length_penalty(13, 0.0) == 1.0


def test_scripted_beam_search_without_length_penalty_prefers_the_short_hypothesis():
    hyp, = beam_search(ScriptedModel(SCRIPT, LATER), SRC, beam=2, alpha=0.0, min_length=0)
    assert hyp.tokens == [] and hyp.score == pytest.approx(math.log(0.40))


def test_a_non_empty_source_never_gets_an_empty_translation():
    """End of sentence is the best first token here (0.40): min_length=1, the default, bans it at the first step,
    as fairseq and CTranslate2 do."""
    model = ScriptedModel(SCRIPT, LATER)
    hyp, = beam_search(model, SRC, beam=2, alpha=0.0)
    assert hyp.tokens == [A] and hyp.score == pytest.approx(math.log(0.39) + math.log(0.99))
    assert greedy(model, SRC)[0].tokens == [A] and greedy(model, SRC, min_length=0)[0].tokens == []
    assert len(beam_search(ScriptedModel({}, probs(eos=0.9, a=0.05)), SRC, beam=3, min_length=3)[0].tokens) == 3


def test_scripted_beam_search_length_penalty_flips_the_choice():
    hyp, = beam_search(ScriptedModel(SCRIPT, LATER), SRC, beam=2, alpha=0.6)
    assert hyp.tokens == [A]
    assert hyp.score == pytest.approx((math.log(0.39) + math.log(0.99)) / (7 / 6) ** 0.6)


class Counted(ScriptedModel):
    steps = 0

    def decode(self, tokens, prefix):
        self.steps += 1
        return super().decode(tokens, prefix)


# A long hypothesis wins under |Y|^alpha, but only a search that goes on after two have ended finds it:
# step 1: [] ends (0.30), A and B live on; step 2: B EOS ends (0.135), A A lives on (0.45); step 3: A A EOS (0.4365)
PATIENT = {(0, BOS): probs(eos=0.30, a=0.50, b=0.15), (1, A): probs(eos=0.05, a=0.90, b=0.04),
           (1, B_): probs(eos=0.90, a=0.05, b=0.04)}


def test_stop_finished_ends_once_beam_times_patience_hypotheses_have():
    """fairseq's and CTranslate2's rule (src/decoding.cc: `result.hypotheses.size() >= _max_candidates`), scored by
    log p / |Y|^alpha with EOS counted: two ended at step 2, so beam 2 stops there with [B]; the exact rule goes on
    to [A, A]; patience 2 waits for four, [A, A] among them."""
    model = Counted(PATIENT, LATER)
    hyp, = beam_search(model, SRC, beam=2, alpha=1.0, min_length=0, stop=Stop.finished)
    assert model.steps == 2 and hyp.tokens == [B_] and hyp.score == pytest.approx(math.log(0.135) / 2)
    patient = Counted(PATIENT, LATER)
    hyp, = beam_search(patient, SRC, beam=2, alpha=1.0, min_length=0, stop=Stop.finished, patience=2.0)
    assert patient.steps == 3 and hyp.tokens == [A, A] and hyp.score == pytest.approx(math.log(0.45 * 0.97) / 3)
    assert beam_search(ScriptedModel(PATIENT, LATER), SRC, beam=2, alpha=1.0, min_length=0)[0].tokens == [A, A]


def test_scripted_beam_finds_what_greedy_misses():
    script = {(0, BOS): probs(a=0.5, b=0.4), (1, A): probs(eos=0.3, a=0.3, b=0.3), (1, B_): probs(eos=0.9)}
    model = ScriptedModel(script, probs(eos=0.98))
    assert greedy(model, SRC)[0].tokens[0] == A
    hyp, = beam_search(model, SRC, beam=2, alpha=0.0)
    assert hyp.tokens == [B_] and hyp.score == pytest.approx(math.log(0.4) + math.log(0.9))


def test_output_length_is_capped_at_source_length_plus_max_extra():
    never_ends = ScriptedModel({}, probs(eos=1e-6, a=0.9, b=0.05))
    src = torch.tensor([[7, EOS, PAD, PAD], [7, 8, 9, EOS]])
    for hyps in (greedy(never_ends, src, max_extra=5), beam_search(never_ends, src, beam=3, max_extra=5)):
        assert [len(h.tokens) for h in hyps] == [2 + 5 - 1, 4 + 5 - 1]  # EOS takes the last slot


def real_model(position=Position.relative, seed=0):
    torch.manual_seed(seed)
    cfg = micro_config(encoder_layers=2, decoder_layers=2, heads=4, clip=3, position=position)
    model = Transformer(cfg, 40).eval()
    with torch.no_grad():  # a peaked output distribution so that hypotheses end at varied lengths
        model.embed.weight[EOS] *= 3
    return model


def sources(seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (5, 7), generator=g)
    src[:, -1] = EOS
    src[1, 4:] = PAD
    src[1, 3] = EOS
    src[3, 2:] = PAD
    src[3, 1] = EOS
    return src


@pytest.mark.parametrize("position", [Position.relative, Position.absolute])
def test_cached_beam_search_equals_recomputing_the_prefix(position):
    model, src = real_model(position), sources()
    cached = beam_search(model, src, beam=4, alpha=0.6, max_extra=8)
    uncached = beam_search(Uncached(model), src, beam=4, alpha=0.6, max_extra=8)
    assert [h.tokens for h in cached] == [h.tokens for h in uncached]
    assert [h.score for h in cached] == pytest.approx([h.score for h in uncached], abs=1e-5)
    assert len({len(h.tokens) for h in cached}) > 1


def test_beam_one_without_penalty_equals_greedy():
    model, src = real_model(), sources(2)
    assert [h.tokens for h in beam_search(model, src, beam=1, alpha=0.0, max_extra=8)] == \
        [h.tokens for h in greedy(model, src, max_extra=8)]


def test_batched_search_equals_one_sentence_at_a_time():
    model, src = real_model(), sources(3)
    together = beam_search(model, src, beam=3, alpha=0.6, max_extra=8)
    for i in range(src.shape[0]):
        row = src[i : i + 1, : int(src[i].ne(PAD).sum())]
        alone, = beam_search(model, row, beam=3, alpha=0.6, max_extra=8)
        assert alone.tokens == together[i].tokens
        assert alone.score == pytest.approx(together[i].score, abs=1e-5)


class MaskEveryStep:
    """The model with cross-attention's padding mask built by every layer at every step from src_pad, as before
    the decoding cache carried it prebuilt (nmt.modeling.transformer.source_mask): the reference for the fast path."""

    def __init__(self, model):
        self.model, self.encode, self.decode, self.reorder = model, model.encode, model.decode, model.reorder

    def start(self, memory, src):
        cache = self.model.start(memory, src)
        assert cache.source_mask.bias is not None  # decoding does take the fast path
        return dataclasses.replace(cache, source_mask=NO_POSITIONS)


@pytest.mark.parametrize("position", [Position.relative, Position.absolute])
def test_the_prebuilt_source_mask_gives_exactly_the_reference_search(position):
    """Same hypotheses and bit-identical scores, in beam search (sentences leaving the batch) and greedy."""
    model, src = real_model(position), sources(4)
    for search in (lambda m: beam_search_nbest(m, src, beam=4, alpha=0.6, max_extra=8, nbest=2),
                   lambda m: [[h] for h in greedy(m, src, max_extra=8)]):
        fast, reference = search(model), search(MaskEveryStep(model))
        assert [[(h.tokens, h.score) for h in hyps] for hyps in fast] == \
            [[(h.tokens, h.score) for h in hyps] for hyps in reference]


def test_a_cache_extended_in_place_is_never_changed_by_a_later_step():
    """Greedy steps append to the cache's buffers in place; a second step from the same cache must copy, leaving
    the first step's cache (and its keys) as they were."""
    model, src = real_model(), sources(5)
    with torch.inference_mode():
        cache = model.start(model.encode(src), src)
        for token in (BOS, A, B_):  # the second step copies into buffers with room; the third appends in place
            _, cache = model.decode(torch.full((src.shape[0], 1), token), cache)
        room = cache.layers[0].self_kv.room
        assert room is not None and room.filled == 3 and cache.layers[0].self_kv.k.data_ptr() == room.k.data_ptr()
        _, first = model.decode(torch.full((src.shape[0], 1), A), cache)
        keys = [layer.self_kv.k.clone() for layer in first.layers]
        logits, second = model.decode(torch.full((src.shape[0], 1), B_), cache)  # the same cache, another token
        assert all(torch.equal(layer.self_kv.k, k) for layer, k in zip(first.layers, keys))
        assert second.layers[0].self_kv.k.data_ptr() != first.layers[0].self_kv.k.data_ptr()
        again, _ = model.decode(torch.full((src.shape[0], 1), B_), cache)
        assert torch.equal(again, logits)


def test_patience_belongs_to_stop_finished_and_holds_the_nbest_list():
    from nmt.config import ConfigError, DecodeJob, SearchConfig

    SearchConfig(stop=Stop.finished, patience=1.5).check()
    with pytest.raises(ConfigError, match=r"^patience=2.0 is invalid: it must be 1.0 unless stop=finished"):
        SearchConfig(patience=2.0).check()
    with pytest.raises(ConfigError, match=r"^patience=0.1 is invalid"):
        SearchConfig(stop=Stop.finished, patience=0.1).check()
    with pytest.raises(ConfigError, match=r"^nbest=3 is invalid: it must be in \[1, 2\]"):
        DecodeJob(checkpoint="x", nbest=3, stop=Stop.finished, patience=0.5).check()


@pytest.mark.parametrize("length", [40, 32_000, 8_192 * 4, 7_919 * 4])
def test_top_k_by_blocks_is_torch_topk(length):
    """The blocks' top-k gives torch.topk's values and indices (no ties among random values), including a best
    value that sits alone in its block, and rows of -inf beside the best (a banned or forced token)."""
    from nmt.decoding.search import top_k

    g = torch.Generator().manual_seed(length)
    scores = torch.randn(5, length, generator=g)
    scores[0, 7] = 100.0
    scores[1, : length // 2] = float("-inf")
    values, ids = top_k(scores, 8)
    expected = scores.topk(8)
    assert torch.equal(values, expected.values) and torch.equal(ids, expected.indices)


def test_fused_projections_decode_as_the_three_and_follow_the_weights():
    """nmt.decoding.fused: one GEMM for Q, K and V gives the searches of three; a weight changed in place after the
    first search is read again (the fused matrix is remade when a version counter moves)."""
    from nmt.decoding.fused import fuse_self_attention

    src = sources(5)
    plain, fused = real_model(), fuse_self_attention(real_model(), onednn=False)
    for _ in range(2):
        ours, theirs = beam_search(fused, src, beam=4, alpha=0.6, max_extra=8), beam_search(plain, src, beam=4,
                                                                                          alpha=0.6, max_extra=8)
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)
        with torch.no_grad():
            for model in (plain, fused):
                model.decoder[0].self_attn.k_proj.weight.mul_(-1.5)


def test_few_queries_attend_as_sdpa():
    """A decoding step's cross-attention (few queries, contiguous K/V, no autograd) as two products around a softmax
    gives SDPA's output, with a padding mask."""
    import torch.nn.functional as F

    from nmt.kernels.torch_attention import sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 8, generator=g) for n in (4, 6, 6))
    pad = torch.zeros(3, 1, 1, 6, dtype=torch.bool)
    pad[1, ..., 4:] = True
    with torch.inference_mode():
        got = sdpa(q, k, v, None, pad, None, 0.0)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=torch.zeros(pad.shape).masked_fill(pad, -3.4e38))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_patience_rounds_half_up_as_ctranslate2():
    """CTranslate2 ends a sentence after std::round(beam x patience) hypotheses: 4 x 0.625 = 2.5 is 3 there (Python's
    round() says 2)."""
    from nmt.modes import hypotheses_to_end

    assert hypotheses_to_end(4, 0.625) == 3 and hypotheses_to_end(4, 1.0) == 4 and hypotheses_to_end(4, 0.1) == 0
