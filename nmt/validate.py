"""Validation during training: the label-smoothed loss and perplexity on the validation set (every rank, summed
over ranks), and greedy BLEU on its first sentences (one rank; a progress signal, not a result)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.distributed as dist
from sacrebleu.metrics import BLEU

from nmt.config import DataConfig, SearchConfig
from nmt.data.batching import epoch_batches
from nmt.data.readers import read_lines
from nmt.data.shards import EncodedSplit
from nmt.data.vocab import Vocab
from nmt.decode import translate_lines
from nmt.loss import smoothed_loss
from nmt.runtime import Env, autocast


@torch.no_grad()
def validation_loss(model, data: EncodedSplit, max_tokens: int, env: Env, amp_dtype, label_smoothing: float) -> dict:
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=env.device)  # loss, nll, tokens
    for _, batch in epoch_batches(data, max_tokens, 0, 0, env.rank, env.world_size):
        batch = batch.to(env.device)
        with autocast(env.device, amp_dtype):
            logits = model(batch.src, batch.tgt_in)
        loss, nll = smoothed_loss(logits, batch.tgt_out, label_smoothing)
        sums += torch.stack([loss.double(), nll.double(), loss.new_tensor(batch.target_tokens, dtype=torch.float64)])
    if env.world_size > 1:
        dist.all_reduce(sums)
    loss_sum, nll_sum, tokens = sums.tolist()
    return {"loss": loss_sum / tokens, "nll": nll_sum / tokens, "ppl": math.exp(min(nll_sum / tokens, 50))}


def greedy_bleu(model, vocab: Vocab, data_dir: Path, data: DataConfig, sentences: int, device: torch.device,
                amp_dtype) -> float:
    """sacreBLEU of greedy translations of the first validation sentences (each input bounded by
    SearchConfig.max_input_tokens)."""
    sources = list(read_lines(data_dir / f"valid.{data.src}"))[:sentences]
    refs = list(read_lines(data_dir / f"valid.{data.tgt}"))[:sentences]
    with autocast(device, amp_dtype):
        hyps = translate_lines(model, vocab, sources, SearchConfig(beam=1), device)
    return BLEU().corpus_score(hyps, [refs]).score
