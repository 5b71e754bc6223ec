"""Batched beam search with the GNMT length penalty, and greedy decoding, over the incremental API.

The model supplies encode(src), start(memory, src) -> cache, decode(tokens, cache) -> (logits, cache)
and reorder(cache, indices). Cross-attention K/V are computed once in start(); each step feeds one
token per hypothesis and extends the cache (relative attention sees the step through q_offset).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.modeling.transformer import BOS, EOS, PAD
from nmt.modes import Stop, hypotheses_to_end


def length_penalty(length, alpha: float, stop: Stop = Stop.exact):
    """lp(Y) that a finished hypothesis' log p(Y|X) is divided by (|Y| counts EOS): GNMT's and tensor2tensor's
    ((5 + |Y|) / 6) ** alpha for the exact rule, fairseq's and CTranslate2's |Y| ** alpha for stop=finished."""
    return ((5.0 + length) / 6.0) ** alpha if stop == Stop.exact else length**alpha


@functools.cache  # a step's row length is one of a few (beam x vocabulary, or the vocabulary): looked up once each
def block_size(length: int) -> int:
    """The largest divisor of `length` from 64 to 512 (0: none, or a row too short for blocks to pay)."""
    if length < 16 * 64:
        return 0
    return next((size for size in range(512, 63, -1) if length % size == 0), 0)


def top_k(scores: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """scores.topk(count) of each row (n, L), by blocks of the row: the `count` best lie in the `count` blocks of the
    highest maxima (a block whose maximum is not among them holds no value above `count` others), so one pass takes
    each block's maximum and top-k reads those blocks alone, where torch.topk copies and partly sorts the whole row.
    The same values; of equal values, perhaps another one's index."""
    n, length = scores.shape
    size = block_size(length)
    if not size or count * size * 4 > length:
        return scores.topk(count)
    blocks = scores.view(n, length // size, size)
    chosen = blocks.amax(-1).topk(count).indices  # (n, count)
    values, within = blocks.gather(1, chosen[:, :, None].expand(n, count, size)).view(n, -1).topk(count)
    return values, chosen.gather(1, within // size) * size + within % size


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # log-probability / length penalty


def max_lengths(src: Tensor, max_extra: int) -> Tensor:
    """Longest output per sentence, EOS included: source length + max_extra (Vaswani et al.)."""
    return src.ne(PAD).sum(1) + max_extra


def ban_early_eos(log_probs: Tensor, t: int, min_length: int) -> Tensor:
    """No end of sentence before `min_length` tokens (1: a non-empty source never gets an empty translation, as
    fairseq and CTranslate2 decode). log_probs (..., V) at step t (the first step is 1)."""
    if t > min_length:
        return log_probs
    return log_probs.index_fill(-1, torch.tensor([EOS], device=log_probs.device), float("-inf"))


@torch.inference_mode()
def greedy(model, src: Tensor, max_extra: int = SearchConfig.max_extra,
           min_length: int = SearchConfig.min_length) -> list[Hypothesis]:
    """The most probable next token, step by step; a sentence leaves the batch when it ends."""
    limit = max_lengths(src, max_extra)
    cache = model.start(model.encode(src), src)
    active = torch.arange(src.shape[0], device=src.device)  # the sentences still decoded, by their row in src
    tokens = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    logp = torch.zeros(src.shape[0], device=src.device)
    done: list[Hypothesis | None] = [None] * src.shape[0]
    for t in range(1, int(limit.max()) + 1):
        logits, cache = model.decode(tokens[:, -1:], cache)
        log_probs = ban_early_eos(logits[:, -1].float().log_softmax(-1), t, min_length)
        best = log_probs.argmax(-1).masked_fill(t >= limit[active], EOS)
        logp = logp + log_probs.gather(1, best[:, None]).squeeze(1)
        tokens = torch.cat([tokens, best[:, None]], 1)
        ended = best == EOS
        if not ended.any():
            continue
        for i in ended.nonzero().squeeze(1).tolist():
            done[int(active[i])] = Hypothesis(tokens[i, 1:-1].tolist(), float(logp[i]))
        keep = (~ended).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        tokens, logp, active = tokens.index_select(0, keep), logp.index_select(0, keep), active.index_select(0, keep)
        cache = model.reorder(cache, keep, sentences=keep)
    return done


def beam_search(model, src: Tensor, beam: int = SearchConfig.beam, alpha: float = SearchConfig.alpha,
                max_extra: int = SearchConfig.max_extra, min_length: int = SearchConfig.min_length,
                stop: Stop = SearchConfig.stop, patience: float = SearchConfig.patience) -> list[Hypothesis]:
    """Best hypothesis per sentence under log p(Y|X) / lp(Y) (beam_search_nbest with nbest=1)."""
    return [hyps[0] for hyps in beam_search_nbest(model, src, beam, alpha, max_extra, min_length, stop=stop,
                                                  patience=patience)]


@torch.inference_mode()
def beam_search_nbest(model, src: Tensor, beam: int = SearchConfig.beam, alpha: float = SearchConfig.alpha,
                      max_extra: int = SearchConfig.max_extra, min_length: int = SearchConfig.min_length,
                      nbest: int = 1, stop: Stop = SearchConfig.stop,
                      patience: float = SearchConfig.patience) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses per sentence (nbest <= beam), best first, under log p(Y|X) / lp(Y).

    Each step ranks the 2K best extensions of the K live beams; an EOS among the first K finishes a
    hypothesis, the K best non-EOS extensions live on. When a sentence is done is `stop`'s rule:
    - exact (tensor2tensor's): when its best finished score cannot be beaten by any live beam
      (log-probabilities only fall, so a live beam's best possible score is its log-probability divided by the
      penalty at the maximum length; with nbest > 1: its nbest-th best finished score, so the list is the search's
      exact n best);
    - finished (fairseq's and CTranslate2's, whose src/decoding.cc this follows): once round(K x patience)
      hypotheses have finished, whatever the live beams could still reach.
    A sentence done leaves the batch (OpenNMT-py's remove_finished_batches): the steps after it cost only the
    sentences still going. The source side is computed once per sentence; its K hypotheses share it
    (nmt.modeling.transformer.DecoderCache).
    """
    k, stop = beam, Stop(stop)
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest={nbest} must be in [1, beam={beam}]")
    enough = max(nbest, hypotheses_to_end(k, patience))  # stop=finished: the hypotheses a sentence ends with
    limit = max_lengths(src, max_extra)  # (B,)
    cache = model.start(model.encode(src), src)
    active = torch.arange(src.shape[0], device=src.device)  # the sentences still decoded, by their row in src
    # the first step expands one hypothesis per sentence (K identical ones would cost K times as much)
    tokens = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    alive = torch.zeros((src.shape[0], 1), device=src.device)  # (n, hypotheses per sentence): 1, then K
    finished: list[list[Hypothesis]] = [[] for _ in range(src.shape[0])]
    best_finished = torch.full((src.shape[0],), float("-inf"), device=src.device)  # exact: the score to beat
    ended = torch.zeros(src.shape[0], dtype=torch.long, device=src.device)  # finished: hypotheses so far
    limit_penalty = length_penalty(limit.float(), alpha)  # exact: a live beam's penalty at its longest
    for t in range(1, int(limit.max()) + 1):
        n, width = alive.shape
        logits, cache = model.decode(tokens[:, -1:], cache)
        log_probs = ban_early_eos(logits[:, -1].float().log_softmax(-1), t, min_length).view(n, width, -1)
        vocab = log_probs.shape[-1]
        at_limit = t >= limit[active]
        if at_limit.any():  # the last allowed step must end with EOS
            forced = torch.full_like(log_probs, float("-inf"))
            forced[..., EOS] = log_probs[..., EOS]
            log_probs = torch.where(at_limit[:, None, None], forced, log_probs)
        scores, ids = top_k(log_probs.add_(alive[:, :, None]).view(n, -1), 2 * k)  # (n, 2K)
        origin, token = ids // vocab, ids % vocab
        is_eos = token == EOS
        ending = is_eos[:, :k] & scores[:, :k].isfinite()  # (n, K): hypotheses that end here
        if ending.any():  # one copy to the host per step, not a few per hypothesis
            i, j = ending.nonzero().unbind(1)
            sentences, penalty = active[i].tolist(), length_penalty(t, alpha, stop)
            values = [value / penalty for value in scores[i, j].tolist()]  # in double, as the scores returned
            prefixes = tokens.index_select(0, i * width + origin[i, j])[:, 1:].tolist()
            for b, value, prefix in zip(sentences, values, prefixes):
                finished[b].append(Hypothesis(prefix, value))
            if stop == Stop.finished:
                ended[active] += ending.sum(1)
            else:
                touched = sorted(set(sentences))
                for b in touched:
                    finished[b] = sorted(finished[b], key=lambda h: -h.score)[:k]
                # the score a live beam must beat to change the n-best list
                best = [finished[b][nbest - 1].score if len(finished[b]) >= nbest else float("-inf") for b in touched]
                best_finished[touched] = torch.tensor(best, device=src.device)
        alive, pick = scores.masked_fill(is_eos, float("-inf")).topk(k)  # K best live extensions
        rows = torch.arange(n, device=src.device)[:, None] * width + origin.gather(1, pick)  # (n, K): rows continued
        if stop == Stop.finished:
            done = at_limit | (ended[active] >= enough)
        else:
            best_possible = alive.max(1).values / limit_penalty[active]
            done = at_limit | (best_finished[active] >= best_possible)
        if done.all():
            break
        keep = None if not done.any() else (~done).nonzero().squeeze(1)
        if keep is not None:  # finished sentences leave the batch
            rows, alive, pick, token, active = rows[keep], alive[keep], pick[keep], token[keep], active[keep]
        rows = rows.view(-1)
        tokens = torch.cat([tokens.index_select(0, rows), token.gather(1, pick).view(-1, 1)], 1)
        cache = model.reorder(cache, rows, sentences=keep)
    if stop == Stop.finished:  # ranked once, at the end (CTranslate2's finalize_result)
        finished = [sorted(hyps, key=lambda h: -h.score) for hyps in finished]
    return [hyps[:nbest] for hyps in finished]


class Uncached:
    """The same decoding interface without a cache: every step re-runs the decoder on the whole
    prefix. For tests (cached == uncached) and the benchmark (what the cache buys)."""

    def __init__(self, model):
        self.model = model
        self.encode = model.encode

    def start(self, memory: Tensor, src: Tensor):
        return (memory, src, None)  # a row per sentence; the prefix a row per hypothesis

    def decode(self, tokens: Tensor, state):
        memory, src, prefix = state
        prefix = tokens if prefix is None else torch.cat([prefix, tokens], 1)
        logits, _ = self.model.decode(prefix, self.model.start(memory, src))
        return logits[:, -tokens.shape[1]:], (memory, src, prefix)

    @staticmethod
    def reorder(state, indices: Tensor, sentences: Tensor | None = None):
        memory, src, prefix = state
        if sentences is not None:
            memory, src = memory.index_select(0, sentences), src.index_select(0, sentences)
        return memory, src, prefix.index_select(0, indices)
