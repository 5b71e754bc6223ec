"""Validation during training: the label-smoothed loss and perplexity on the validation set (every rank, summed
over ranks), and greedy BLEU on its first sentences (one rank; a progress signal, not a result)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import torch
import torch.distributed as dist
from sacrebleu.metrics import BLEU

from nmt.config import DataConfig, SearchConfig
from nmt.data.batching import epoch_batches
from nmt.data.pipeline import Prepared
from nmt.data.readers import read_lines
from nmt.data.shards import EncodedSplit
from nmt.data.vocab import Vocab
from nmt.decoding.decode import translate_lines
from nmt.runtime.precision import autocast
from nmt.runtime.process import Env
from nmt.training.loss import batch_loss


@torch.no_grad()
def validation_loss(model, data: EncodedSplit, max_tokens: int, env: Env, amp_dtype, label_smoothing: float,
                    loss_chunk_tokens: int) -> dict:
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss, nll, tokens
    for _, batch in epoch_batches(data, max_tokens, 0, 0, env.rank, env.world_size):
        batch = batch.to(env.device)
        loss, nll = batch_loss(model, model.output_weight, batch, label_smoothing, loss_chunk_tokens, env.device,
                               amp_dtype)
        sums += torch.stack([loss.double(), nll.double(), loss.new_tensor(batch.target_tokens, dtype=torch.float64)])
    if env.world_size > 1:
        dist.all_reduce(sums)
    loss_sum, nll_sum, tokens = sums.tolist()
    return {"loss": loss_sum / tokens, "nll": nll_sum / tokens, "ppl": math.exp(min(nll_sum / tokens, 50))}


def first_valid_pairs(data_dir: Path, data: DataConfig, sentences: int) -> tuple[list[str], list[str]]:
    """The first validation sources and references, read once: a prepare that replaces the folder during the run
    does not change what its validation scores."""
    sources = list(itertools.islice(read_lines(data_dir / f"valid.{data.src}"), sentences))
    return sources, list(itertools.islice(read_lines(data_dir / f"valid.{data.tgt}"), sentences))


def greedy_bleu(model, vocab: Vocab, sources: list[str], refs: list[str], device: torch.device, amp_dtype) -> float:
    """sacreBLEU of greedy translations (each input bounded by SearchConfig.max_input_tokens)."""
    with autocast(device, amp_dtype):
        hyps = translate_lines(model, vocab, sources, SearchConfig(beam=1), device)
    return BLEU().corpus_score(hyps, [refs]).score


class Validator:
    """Validation as the trainer runs it: the loss on every rank, greedy BLEU on the first `bleu_sentences`
    validation sentences on rank 0 (0 = none)."""

    def __init__(self, data: Prepared, data_cfg: DataConfig, max_tokens: int, bleu_sentences: int,
                 label_smoothing: float, env: Env, amp_dtype, loss_chunk_tokens: int):
        self.data, self.data_cfg = data, data_cfg
        self.loss_chunk_tokens = loss_chunk_tokens
        self.max_tokens, self.bleu_sentences, self.label_smoothing = max_tokens, bleu_sentences, label_smoothing
        self.env, self.amp_dtype = env, amp_dtype
        self.sentences = first_valid_pairs(data.directory, data_cfg, bleu_sentences) if env.main else ([], [])

    def loss(self, model) -> dict:
        return validation_loss(model, self.data.valid, self.max_tokens, self.env, self.amp_dtype, self.label_smoothing,
                               self.loss_chunk_tokens)

    def bleu(self, model) -> dict:
        """{"bleu_greedy": ...} on rank 0 when asked for, else {}."""
        if not self.env.main or self.bleu_sentences == 0:
            return {}
        vocab = Vocab(model_proto=self.data.spm_model)
        return {"bleu_greedy": greedy_bleu(model, vocab, *self.sentences, self.env.device, self.amp_dtype)}

    def __call__(self, model) -> dict:
        """Loss (every rank) and BLEU (rank 0, while the others wait at their next collective: a few seconds of
        decoding, bounded per line)."""
        return {**self.loss(model), **self.bleu(model)}
