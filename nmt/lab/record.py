"""The one record of a finished run, CELL/result.json: the recipe's checkpoint (checkpoint_to_decode: the best on
validation under early stopping, averaged.pt where it averages, else the newest) decoded on a split of the prepared data (beam 4, alpha 0.6), the hypotheses beside it, the scores
(nmt/score.py), and what made the run (its overrides, composed choices and resolved config). Written whole or not
at all by `finish_run`, which every path ends in: a sweep's cell (nmt/lab/run.py), one experiment (nmt/experiment.py)
and the demo; nmt/lab/collect.py reads it back."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from nmt.checkpoints.checkpoint import BEST, LAST, load_checkpoint, numbered_checkpoints
from nmt.config import DataConfig, SearchConfig, TrainConfig, TrainJob
from nmt.data.pipeline import prepared_dir
from nmt.data.readers import read_lines
from nmt.decoding.decode import load_translator, translate_lines
from nmt.machine import host, machine
from nmt.modes import BestMetric
from nmt.outputs import write_json
from nmt.runtime.process import resolve_device
from nmt.score import score, tokenized_bleu_of, tokenized_label

RESULT = "result.json"
CHOICES = ("model", "data", "experiment")  # the presets that name a cell (nmt/run_names.py cell_name_of)


def checkpoint_to_decode(output: Path, train: TrainConfig, log=None) -> Path:
    """What a run decodes, and the model its summary says to use: with early stopping (train.patience > 0) or
    validation BLEU as the best metric, the best on validation (checkpoint_best.pt, as fairseq's users expect); else
    the average its recipe asks for (train.average_last=N: averaged.pt); else the run's newest checkpoint, said in a
    log line (its numbered checkpoints deleted: checkpoint_last.pt, the same weights)."""
    if (train.patience > 0 or BestMetric(train.best_metric) == BestMetric.bleu) and (output / BEST).is_file():
        return output / BEST
    if train.average_last > 0:
        return output / "averaged.pt"
    newest = (numbered_checkpoints(output) or [output / LAST])[-1]
    if log is not None:
        log.info("train.average_last=0: decoding the newest checkpoint, %s (no average)", newest.name)
    return newest


def decode_and_score(checkpoint: Path, data: DataConfig, split: str, search: SearchConfig, output: Path,
                     lines: int | None = None, device_name: str = "auto", log=None) -> dict:
    """Decode the prepared `split` (its first `lines` sentences if given) with `checkpoint` into
    output/<split>.hyp.<tgt> and score it against its reference: the score record's common part."""
    data_dir = prepared_dir(data)
    device = resolve_device(device_name)
    model, vocab = load_translator(checkpoint, device)
    sources = list(read_lines(data_dir / f"{split}.{data.src}"))[:lines]
    refs = list(read_lines(data_dir / f"{split}.{data.tgt}"))[:lines]
    if log is not None:
        log.info("decoding %d %s sentences with beam %d, alpha %g", len(sources), split, search.beam, search.alpha)
    started = time.monotonic()
    hyps = translate_lines(model, vocab, sources, search, device, progress=True)
    decode_seconds = time.monotonic() - started
    hyp_path = output / f"{split}.hyp.{data.tgt}"
    hyp_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return {**score(hyps, refs, data.tgt), "pair": f"{data.src}-{data.tgt}", "split": split,
            "sentences": len(sources), "beam": search.beam, "alpha": search.alpha,
            "ref": str(data_dir / f"{split}.{data.tgt}"), "hyp": hyp_path.name,
            "decode_seconds": round(decode_seconds, 1), "device": machine(device), "host": host(),
            "threads": torch.get_num_threads()}


def finish_run(job: TrainJob, out: Path, resolved: dict, overrides: list[str], choices: dict, command: str,
               log=None) -> dict:
    """Decode and score the trained run in `out` on train.score_split (its first train.score_lines sentences, all
    for 0); write out/result.json, whole or not at all; return it."""
    started = time.monotonic()
    checkpoint = checkpoint_to_decode(out, job.train, log)
    state = load_checkpoint(checkpoint, mmap=True)
    result = decode_and_score(checkpoint, job.data, job.train.score_split, SearchConfig(), out,
                              job.train.score_lines or None, job.train.device, log)
    # the run's own training time, every session of it (a resumed run's too), not this call's
    train_seconds = load_checkpoint(out / LAST, mmap=True).get("train_seconds", 0.0)
    result.update({"command": command, "overrides": list(overrides), "cell": out.name, "seed": job.train.seed,
                   "score_lines": job.train.score_lines, "updates": state["step"], "checkpoint": checkpoint.name,
                   "averaged_from": state.get("averaged_from"), "train_minutes": round(train_seconds / 60, 2),
                   "score_minutes": round((time.monotonic() - started) / 60, 2),
                   "model": {name: resolved["model"][name] for name in ("position", "clip", "rel_key", "rel_value",
                                                                        "share_heads", "edge_buckets")},
                   "choices": {name: choices.get(name) for name in CHOICES}, "config": resolved})
    write_json(out / RESULT, result)
    return result


def summary(result: dict) -> str:
    """What a scored run prints: its scores, then its minutes of training over every session of the run (a resumed
    run's earlier ones too) and of scoring."""
    return (f"\nsacreBLEU  {result['bleu_line']}\nsignature  {result['signature']}\n"
            f"chrF {result['chrf']:.2f}   {tokenized_label(result['pair'].split('-')[1])} "
            f"{tokenized_bleu_of(result):.2f}\n"
            f"{result['updates']} updates; {result['train_minutes']:.1f} min of training (every session of the run), "
            f"{result['score_minutes']:.1f} min of decoding and scoring, on {result['device']}")
