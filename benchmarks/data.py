"""Data pipeline cost: prepare time, encode throughput, a WMT14-sized projection with peak memory,
the batcher's padding efficiency, and collation time per batch.

    python -m benchmarks.data [--pairs 1015000] [--output results/bench_data.json]
    python -m benchmarks.data --collation-only     # just the collation figures (median ms per batch)
"""

from __future__ import annotations

import argparse
import gzip
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_report
from nmt.config import DataConfig
from nmt.data.batching import collate, make_batches
from nmt.data.pipeline import load_manifest, prepare, prepared_dir
from nmt.data.shards import EncodedSplit
from nmt.data.vocab import Vocab

ROOT = Path(__file__).resolve().parent.parent
WMT14_EN_DE_PAIRS = 4_508_785


def timed_prepare_subprocess(overrides: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MiB) of `python -m nmt.prepare` in a fresh process."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "nmt.prepare", *overrides], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def padding_efficiency(shard: EncodedSplit, max_tokens: int) -> float:
    src, tgt = shard.src_lengths + 1, shard.tgt_lengths + 1
    batches = make_batches(src, tgt, max_tokens, seed=1, epoch=0)
    real = sum(int(src[b].sum() + tgt[b].sum()) for b in batches)
    padded = sum(2 * len(b) * int(max(src[b].max(), tgt[b].max())) for b in batches)
    return real / padded


def collation_ms(shard: EncodedSplit, max_tokens: int, batches: int = 200) -> float:
    """Median milliseconds to gather one batch into padded tensors (what the training loop waits for)."""
    order = make_batches(shard.src_lengths + 1, shard.tgt_lengths + 1, max_tokens, seed=1, epoch=0)[:batches]
    times = []
    for indices in order:
        start = time.perf_counter()
        collate(shard, indices)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def report_collation(shard: EncodedSplit, report: dict) -> None:
    for budget in (4096, 25000):
        ms = collation_ms(shard, budget)
        report[f"collation_ms_max_tokens_{budget}"] = round(ms, 3)
        print(f"collation at max_tokens {budget}: {ms:.2f} ms per batch (median)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_015_000, help="size of the large corpus (Multi30k repeated)")
    parser.add_argument("--output", default="results/bench_data.json")
    parser.add_argument("--collation-only", action="store_true", help="only time collation (needs no prepare)")
    args = parser.parse_args()
    report = {}
    if args.collation_only:
        prepared = prepared_dir(DataConfig(name="multi30k"))
        prepare(DataConfig(name="multi30k"))
        report_collation(EncodedSplit(prepared, "train", load_manifest(prepared)["vocab_size"]), report)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small = tmp / "multi30k"
        seconds, _ = timed_prepare_subprocess(["data=multi30k_en_de", f"data.prepared_dir={small}"])
        report["multi30k_prepare_seconds"] = round(seconds, 2)
        print(f"prepare bundled Multi30k En-De: {seconds:.1f} s")

        vocab = Vocab(small / "spm.model")
        with gzip.open(ROOT / "data/multi30k/train.en.gz", "rt", encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f]
        start = time.perf_counter()
        vocab.encode(lines)
        rate = len(lines) / (time.perf_counter() - start)
        report["encode_sentences_per_second"] = round(rate)
        print(f"encode throughput: {rate:,.0f} sentences/s")

        for budget in (4096, 2048):
            eff = padding_efficiency(EncodedSplit(small, "train", len(vocab)), budget)
            report[f"padding_efficiency_max_tokens_{budget}"] = round(eff, 4)
            print(f"padding efficiency at max_tokens {budget}: {eff:.3f} (real / padded tokens, both sides)")
        report_collation(EncodedSplit(small, "train", len(vocab)), report)

        big = tmp / "big"
        big.mkdir()
        for lang in ("en", "de"):
            with gzip.open(ROOT / f"data/multi30k/train.{lang}.gz", "rt", encoding="utf-8") as f:
                text = f.read()
            repeats = -(-args.pairs // text.count("\n"))
            with open(big / f"train.{lang}", "w", encoding="utf-8") as f:
                for _ in range(repeats):
                    f.write(text)
            with gzip.open(ROOT / f"data/multi30k/val.{lang}.gz", "rt", encoding="utf-8") as f:
                (big / f"valid.{lang}").write_text(f.read(), encoding="utf-8")
            (big / f"test.{lang}").write_text((big / f"valid.{lang}").read_text(encoding="utf-8"), encoding="utf-8")
        pairs = repeats * text.count("\n")
        seconds, peak = timed_prepare_subprocess([
            "data=local", f"data.train={big}/train", f"data.valid={big}/valid", f"data.test={big}/test",
            "data.vocab_size=8000", "data.vocab_sample=2000000", f"data.prepared_dir={tmp}/big_prepared"])
        projected = seconds * WMT14_EN_DE_PAIRS / pairs
        report.update({"large_pairs": pairs, "large_prepare_seconds": round(seconds, 1),
                       "large_peak_rss_mib": round(peak), "wmt14_en_de_projected_minutes": round(projected / 60, 1)})
        print(f"prepare {pairs:,} pairs: {seconds:.0f} s, peak RSS {peak:.0f} MiB; "
              f"projected for WMT14 En-De ({WMT14_EN_DE_PAIRS:,} pairs): {projected / 60:.1f} min")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_report(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
