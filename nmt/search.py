"""Batched beam search with the GNMT length penalty, and greedy decoding, over the incremental API.

The model supplies encode(src), start(memory, src) -> cache, decode(tokens, cache) -> (logits, cache)
and reorder(cache, indices). Cross-attention K/V are computed once in start(); each step feeds one
token per hypothesis and extends the cache (relative attention sees the step through q_offset).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from nmt.config import SearchConfig
from nmt.model import BOS, EOS, PAD


def length_penalty(length, alpha: float):
    """GNMT / tensor2tensor: lp(Y) = ((5 + |Y|) / 6) ** alpha (|Y| counts EOS)."""
    return ((5.0 + length) / 6.0) ** alpha


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


@torch.no_grad()
def greedy(model, src: Tensor, max_extra: int = SearchConfig.max_extra,
           min_length: int = SearchConfig.min_length) -> list[Hypothesis]:
    limit = max_lengths(src, max_extra)
    cache = model.start(model.encode(src), src)
    tokens = torch.full((src.shape[0], 1), BOS, dtype=torch.long, device=src.device)
    logp = torch.zeros(src.shape[0], device=src.device)
    finished = torch.zeros(src.shape[0], dtype=torch.bool, device=src.device)
    for t in range(1, int(limit.max()) + 1):
        logits, cache = model.decode(tokens[:, -1:], cache)
        log_probs = ban_early_eos(logits[:, -1].float().log_softmax(-1), t, min_length)
        best = log_probs.argmax(-1).masked_fill(t >= limit, EOS).masked_fill(finished, PAD)
        logp += log_probs.gather(1, best.clamp(min=0)[:, None]).squeeze(1).masked_fill(finished, 0.0)
        tokens = torch.cat([tokens, best[:, None]], 1)
        finished |= best == EOS
        if finished.all():
            break
    return [Hypothesis(_strip(row), float(score)) for row, score in zip(tokens[:, 1:].tolist(), logp)]


def _strip(row: list[int]) -> list[int]:
    return row[: row.index(EOS)] if EOS in row else [t for t in row if t != PAD]


@torch.no_grad()
def beam_search(model, src: Tensor, beam: int = SearchConfig.beam, alpha: float = SearchConfig.alpha,
                max_extra: int = SearchConfig.max_extra, min_length: int = SearchConfig.min_length) -> list[Hypothesis]:
    """Best hypothesis per sentence under log p(Y|X) / lp(Y).

    Each step ranks the 2K best extensions of the K live beams; an EOS among the first K finishes a
    hypothesis, the K best non-EOS extensions live on. A sentence is done when its best finished
    score cannot be beaten by any live beam: log-probabilities only fall, so a live beam's best
    possible score is its log-probability divided by the penalty at the maximum length.
    """
    batch, k = src.shape[0], beam
    limit = max_lengths(src, max_extra)  # (B,)
    expand = torch.arange(batch, device=src.device).repeat_interleave(k)  # (B*K,)
    cache = model.start(model.encode(src).index_select(0, expand), src.index_select(0, expand))
    tokens = torch.full((batch * k, 1), BOS, dtype=torch.long, device=src.device)
    alive = torch.full((batch, k), float("-inf"), device=src.device)
    alive[:, 0] = 0.0  # all beams start identical: expand only the first
    finished: list[list[Hypothesis]] = [[] for _ in range(batch)]
    best_finished = torch.full((batch,), float("-inf"), device=src.device)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)
    offsets = torch.arange(batch, device=src.device)[:, None] * k
    for t in range(1, int(limit.max()) + 1):
        logits, cache = model.decode(tokens[:, -1:], cache)
        log_probs = ban_early_eos(logits[:, -1].float().log_softmax(-1), t, min_length).view(batch, k, -1)  # (B, K, V)
        vocab = log_probs.shape[-1]
        at_limit = t >= limit
        if at_limit.any():  # the last allowed step must end with EOS
            forced = torch.full_like(log_probs, float("-inf"))
            forced[..., EOS] = log_probs[..., EOS]
            log_probs = torch.where(at_limit[:, None, None], forced, log_probs)
        scores, ids = (alive[:, :, None] + log_probs).view(batch, -1).topk(2 * k)  # (B, 2K)
        origin, token = ids // vocab, ids % vocab
        is_eos = token == EOS
        penalty = length_penalty(t, alpha)
        for b, j in (is_eos[:, :k] & ~done[:, None] & scores[:, :k].isfinite()).nonzero().tolist():
            hyp = Hypothesis(tokens[b * k + origin[b, j], 1:].tolist(), float(scores[b, j]) / penalty)
            finished[b] = sorted(finished[b] + [hyp], key=lambda h: -h.score)[:k]
            best_finished[b] = finished[b][0].score
        alive, pick = scores.masked_fill(is_eos, float("-inf")).topk(k)  # K best live extensions
        rows = (offsets + origin.gather(1, pick)).view(-1)
        tokens = torch.cat([tokens.index_select(0, rows), token.gather(1, pick).view(-1, 1)], 1)
        cache = model.reorder(cache, rows)
        best_possible = alive.max(1).values / length_penalty(limit.float(), alpha)
        done |= at_limit | (best_finished >= best_possible)
        if done.all():
            break
    return [hyps[0] for hyps in finished]


class Uncached:
    """The same decoding interface without a cache: every step re-runs the decoder on the whole
    prefix. For tests (cached == uncached) and the benchmark (what the cache buys)."""

    def __init__(self, model):
        self.model = model
        self.encode = model.encode

    def start(self, memory: Tensor, src: Tensor):
        return (memory, src, src.new_zeros(src.shape[0], 0))

    def decode(self, tokens: Tensor, state):
        memory, src, prefix = state
        prefix = torch.cat([prefix, tokens], 1)
        logits, _ = self.model.decode(prefix, self.model.start(memory, src))
        return logits[:, -tokens.shape[1]:], (memory, src, prefix)

    @staticmethod
    def reorder(state, indices: Tensor):
        return tuple(t.index_select(0, indices) for t in state)
