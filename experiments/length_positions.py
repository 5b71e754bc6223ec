"""The length study's positions: which test sentences reach past the positions seen in training.

    python -m experiments.length_positions [--results results] [--output results/length/positions.md]
    python -m experiments.length_positions --rows results/cells/<the learned row's cell>/averaged.pt   # -> learned_rows.md

The length study trains on sources of at most 12 words, so a learned position table (model.position=learned) has
rows that no training sentence reached: they keep their random initialization. This counts, per source-length
bucket of test_2016_flickr, the sources longer than the longest training source (in subword tokens) and, for each
row of the length table (results/tables.yaml), the hypotheses longer than the longest training target; and it scores each row on the
sentences whose source or hypothesis reaches past training (sacreBLEU, mean over seeds). Reads the prepared
folder of the study (prepared here if missing, a few seconds) for the vocabulary and the training lengths.

With --rows, instead: the norms of a learned-positions checkpoint's table rows by position, beside the number of
training sentences that reach each position (rows never reached keep their initial norm, about 1).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from nmt.checkpoints.checkpoint import CheckpointError
from nmt.data.pipeline import open_prepared, prepare
from nmt.data.vocab import Vocab
from nmt.compose import compose_job
from nmt.lab.collect import reference_lines
from nmt.lab.page import LENGTH_BUCKETS, bucket_label, page_table
from nmt.lab.stats import mean_sd

ROOT = Path(__file__).resolve().parent.parent


def study_data():
    job, _ = compose_job(["model=tiny", "data=multi30k_en_de", "+experiment=length", "train.output_dir=-"])
    prepare(job.data)
    return job, open_prepared(job.data)


def row_norms(checkpoint: Path) -> str:
    """Mean L2 norm of the position rows in spans of positions, and the training sentences reaching the span."""
    import torch

    from nmt.checkpoints.checkpoint import load_checkpoint

    weights = load_checkpoint(checkpoint)["model"]
    if "encoder_positions.weight" not in weights:
        raise SystemExit(f"{checkpoint}: no learned position table (trained with model.position=learned?)")
    _, prepared = study_data()
    # Positions as the model sees them: the source with its EOS, the decoder input with its BOS.
    lengths = {"encoder": prepared.train.src_lengths + 1, "decoder": prepared.train.tgt_lengths + 1}
    token_norm = (weights["embed.weight"].float().norm(dim=1) * weights["embed.weight"].shape[1] ** 0.5).mean()
    lines = [f"{checkpoint}: position rows against the token embeddings (as scaled in the model: mean norm "
             f"{token_norm:.1f}); a row starts at norm about 1 (N(0, 1/d)).", "",
             "| positions | encoder row norm | training sources reaching the first | decoder row norm | training targets "
             "reaching the first |",
             "|---|---|---|---|---|"]
    table_size = weights["encoder_positions.weight"].shape[0]
    spans = ((0, 9), (10, 14), (15, 19), (20, 24), (25, 29), (30, 34), (35, 39), (40, table_size - 1))
    for lo, hi in ((lo, min(hi, table_size - 1)) for lo, hi in spans if lo < table_size):
        cells = []
        for side in ("encoder", "decoder"):
            norms = weights[f"{side}_positions.weight"][lo : hi + 1].float().norm(dim=1)
            cells += [f"{torch.mean(norms):.2f}", f"{int((lengths[side] > lo).sum()):,}"]
        lines.append(f"| {lo}–{hi} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(results: Path) -> str:
    from sacrebleu.metrics import BLEU

    job, prepared = study_data()
    vocab = Vocab(model_proto=prepared.spm_model)
    longest_src, longest_tgt = int(prepared.train.src_lengths.max()), int(prepared.train.tgt_lengths.max())
    sources, refs = reference_lines("en"), reference_lines("de")
    src_tokens = [len(ids) for ids in vocab.encode(sources)]
    buckets = [[i for i, s in enumerate(sources) if lo <= len(s.split()) <= hi] for lo, hi in LENGTH_BUCKETS]
    rows = page_table(results, "length")
    # Positions counted as the model sees them: the source with its EOS, the decoder input with its BOS.
    lines = [f"Longest training pair ({len(prepared.train):,} pairs, sources of at most {job.data.max_src_words} "
             f"words): {longest_src} source and {longest_tgt} target tokens, so encoder positions 0–{longest_src} "
             f"and decoder positions 0–{longest_tgt} were trained; a learned table's later rows never were.", "",
             "| source words | " + " | ".join(bucket_label(*b) for b in LENGTH_BUCKETS) + " |",
             "|---|" + "---|" * len(buckets),
             "| sentences | " + " | ".join(str(len(b)) for b in buckets) + " |",
             "| sources past training | " + " | ".join(str(sum(src_tokens[i] > longest_src for i in b))
                                                    for b in buckets) + " |"]
    long_hyp_rows, score_rows = [], []
    for name, seeds in rows.items():
        long_hyp_counts, past_scores, rest_scores, sizes = [], [], [], []
        for seed in sorted(seeds):
            hyps = seeds[seed]["hyps"]
            hyp_tokens = [len(ids) for ids in vocab.encode(hyps)]
            long_hyp_counts.append([sum(hyp_tokens[i] > longest_tgt for i in b) for b in buckets])
            past = [i for i in range(len(sources)) if src_tokens[i] > longest_src or hyp_tokens[i] > longest_tgt]
            rest = sorted(set(range(len(sources))) - set(past))
            sizes.append(len(past))
            past_scores.append(BLEU().corpus_score([hyps[i] for i in past], [[refs[i] for i in past]]).score)
            rest_scores.append(BLEU().corpus_score([hyps[i] for i in rest], [[refs[i] for i in rest]]).score)
        long_hyp_rows.append(f"| {name}: hypotheses past training (mean over {len(seeds)} seeds) | "
                             + " | ".join(f"{statistics.mean(c):g}" for c in zip(*long_hyp_counts)) + " |")
        score_rows.append(f"| {name} | {len(seeds)} | {statistics.mean(sizes):g} | {mean_sd(past_scores)} | "
                          f"{mean_sd(rest_scores)} |")
    lines += long_hyp_rows + ["", "sacreBLEU on the sentences whose source or hypothesis (of that row and seed) "
                                  "reaches past the trained positions, and on the rest:", "",
                              "| row | seeds | sentences past training | BLEU past training | BLEU on the rest |",
                              "|---|---|---|---|---|"] + score_rows
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--rows", type=Path, metavar="CHECKPOINT", help="a learned-positions checkpoint's row norms")
    parser.add_argument("--output", type=Path, help="default: results/length/positions.md, or learned_rows.md")
    args = parser.parse_args()
    try:
        text = row_norms(args.rows) if args.rows else report(args.results)
    except CheckpointError as err:  # missing, truncated or not a checkpoint: one line, no traceback
        raise SystemExit(f"error: {err}") from None
    args.output = args.output or ROOT / "results" / "length" / ("learned_rows.md" if args.rows else "positions.md")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
