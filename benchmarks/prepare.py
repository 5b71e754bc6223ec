"""Prepare on 1 core against prepare on N: a generated WMT-like corpus prepared by `python -m nmt.prepare` with
data.workers=1 on one core and with data.workers=N on N cores (N: every core this process may use), the two
prepared folders compared file by file (they must be the same bytes), and the encode step alone timed the same way.

    python -m benchmarks.prepare [--pairs 1000000] [--vocab-size 32768] [--repeats 1]
                                 [--output results/bench_prepare.json]

The corpus is synthetic, made here from a seed: WMT14 En-De's shape (4,508,785 pairs of about 23 words, a 32,768-piece
vocabulary) at --pairs pairs (the default is smaller, to run in minutes; --pairs 4508785 is the full size). Times are
medians of --repeats interleaved runs (1 worker, N workers, 1, N, ...), each prepare a fresh process; the record says
the corpus size, the cores and each time. Much of SentencePiece's vocabulary training runs on one thread whatever
data.workers is, so the whole prepare gains less than its encode step."""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import write_report
from nmt.config import DataConfig
from nmt.data.pipeline import prepared_dir, write_split
from nmt.data.vocab import Vocab
from nmt.timing import interleaved_samples
from nmt.workers import available_cores

ROOT = Path(__file__).resolve().parent.parent
WMT14_EN_DE_PAIRS = 4_508_785
LEXICON = 40_000  # word types per language, drawn with Zipf's law as a natural text's are


def synthetic_corpus(prefix: Path, pairs: int, seed: int, src: str = "en", tgt: str = "de") -> None:
    """PREFIX.src and PREFIX.tgt: `pairs` lines of words from a Zipfian lexicon of letter strings, lognormal lengths
    (median 20 words, as WMT14's), the target 0.9 to 1.2 times as long (some pairs fall to the ratio filter)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöüéèß"))
    lexicons = [["".join(rng.choice(letters, size)) for size in rng.integers(2, 11, LEXICON)] for _ in (src, tgt)]
    zipf = 1 / np.arange(1, LEXICON + 1)
    zipf /= zipf.sum()
    with open(f"{prefix}.{src}", "w", encoding="utf-8") as f_src, \
            open(f"{prefix}.{tgt}", "w", encoding="utf-8") as f_tgt:
        for start in range(0, pairs, 10_000):
            n = min(10_000, pairs - start)
            src_len = np.clip(rng.lognormal(3.0, 0.5, n).astype(int), 1, 120)
            tgt_len = np.maximum(1, (src_len * rng.uniform(0.9, 1.2, n)).astype(int))
            for f, lexicon, lengths in ((f_src, lexicons[0], src_len), (f_tgt, lexicons[1], tgt_len)):
                words = rng.choice(LEXICON, int(lengths.sum()), p=zipf)
                ends = np.cumsum(lengths)
                f.writelines(" ".join(lexicon[w] for w in words[end - length:end]) + " .\n"
                             for end, length in zip(ends, lengths))


def timed_prepare(overrides: list[str], cores: set[int], log: Path) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (its workers' too) and peak RSS (MiB, its largest process) of a fresh
    `python -m nmt.prepare` on `cores`. On a shared machine the CPU seconds are the steadier figure: their growth from
    1 worker to N is what the pool costs."""
    start = time.perf_counter()
    with open(log, "w") as output:
        job = subprocess.Popen([sys.executable, "-m", "nmt.prepare", *overrides, "force=true"], cwd=ROOT,
                               stdout=output, stderr=subprocess.STDOUT,
                               preexec_fn=lambda: os.sched_setaffinity(0, cores))
        _, status, usage = os.wait4(job.pid, 0)
    seconds = time.perf_counter() - start
    job.returncode = os.waitstatus_to_exitcode(status)
    if job.returncode:
        raise SystemExit(f"nmt.prepare {' '.join(overrides)} failed ({job.returncode}): {log.read_text()[-2000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def on_cores(cores: set[int], run):
    """run() with this process (and the workers it forks) on `cores`."""
    def pinned():
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cores)
        try:
            return run()
        finally:
            os.sched_setaffinity(0, before)
    return pinned


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_000_000,
                        help=f"training pairs (WMT14 En-De: {WMT14_EN_DE_PAIRS:,})")
    parser.add_argument("--vocab-size", type=int, default=32_768)
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs of each; the record has medians")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--output", default="results/bench_prepare.json")
    args = parser.parse_args()
    all_cores = os.sched_getaffinity(0)
    workers = available_cores()
    one_core = {min(all_cores)}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        for split, pairs in (("train", args.pairs), ("valid", 3000), ("test", 3003)):
            synthetic_corpus(tmp / split, pairs, seed=args.seed + len(split))
        print(f"generated {args.pairs:,} training pairs in {time.perf_counter() - start:.0f} s", flush=True)

        def config(count: int) -> DataConfig:
            return DataConfig(name="local", train=str(tmp / "train"), valid=str(tmp / "valid"), test=str(tmp / "test"),
                              vocab_size=args.vocab_size, workers=count, prepared_dir=str(tmp / f"workers{count}"))

        def overrides(cfg: DataConfig) -> list[str]:
            return ["data=local", *(f"data.{k}={getattr(cfg, k)}" for k in
                                    ("train", "valid", "test", "vocab_size", "workers", "prepared_dir"))]

        peaks: dict[int, list[float]] = {1: [], workers: []}
        cpu: dict[int, list[float]] = {1: [], workers: []}

        def prepare_on(count: int, cores: set[int]):
            def run():
                seconds, cpu_seconds, peak = timed_prepare(overrides(config(count)), cores,
                                                           tmp / f"prepare{count}.log")
                peaks[count].append(peak)
                cpu[count].append(cpu_seconds)
                print(f"prepare, {count} worker(s) on {len(cores)} core(s): {seconds:.1f} s", flush=True)
            return run

        whole = interleaved_samples({"1": prepare_on(1, one_core), "N": prepare_on(workers, all_cores)},
                                    args.repeats, "cpu", warmup=0)
        one, many = digests(prepared_dir(config(1))), digests(prepared_dir(config(workers)))
        identical = one == many
        print(f"prepared folders byte-identical: {identical} ({len(one)} files)", flush=True)

        vocab = Vocab(prepared_dir(config(1)) / "spm.model")
        (tmp / "encode").mkdir()
        stats = {}

        def encode_on(count: int, cores: set[int]):
            def run():
                stats[count] = write_split(config(count), "train", vocab, tmp / "encode", count)
            return on_cores(cores, run)

        encode = interleaved_samples({"1": encode_on(1, one_core), "N": encode_on(workers, all_cores)},
                                     args.repeats, "cpu", warmup=0)
    samples = {**whole, **{f"encode_{name}": times for name, times in encode.items()}}
    median = {name: statistics.median(times) for name, times in samples.items()}
    report = {
        "corpus": {"pairs": args.pairs, "wmt14_en_de_pairs": WMT14_EN_DE_PAIRS, "seed": args.seed,
                   "kind": "synthetic (benchmarks.prepare.synthetic_corpus)", "vocab_size": args.vocab_size},
        "cores": len(all_cores), "workers": workers, "repeats": args.repeats,
        "prepare_seconds": {"1_worker_1_core": round(median["1"], 1), f"{workers}_workers": round(median["N"], 1)},
        "prepare_speedup": round(median["1"] / median["N"], 2),
        "prepare_cpu_seconds": {"1_worker_1_core": round(statistics.median(cpu[1]), 1),
                                f"{workers}_workers": round(statistics.median(cpu[workers]), 1)},
        "prepare_peak_rss_mib": {"1_worker_1_core": round(max(peaks[1])),
                                 f"{workers}_workers": round(max(peaks[workers]))},
        "encode_train_seconds": {"1_worker_1_core": round(median["encode_1"], 1),
                                 f"{workers}_workers": round(median["encode_N"], 1)},
        "encode_train_speedup": round(median["encode_1"] / median["encode_N"], 2),
        "encode_train_pairs_per_second": {"1_worker_1_core": round(args.pairs / median["encode_1"]),
                                          f"{workers}_workers": round(args.pairs / median["encode_N"])},
        "shards_identical": identical and stats[1] == stats[workers],
        "samples_seconds": {name: [round(t, 2) for t in times] for name, times in samples.items()},
    }
    print(f"prepare: {median['1']:.1f} s on 1 core, {median['N']:.1f} s on {workers} ({report['prepare_speedup']}x); "
          f"encode step: {median['encode_1']:.1f} s, {median['encode_N']:.1f} s ({report['encode_train_speedup']}x); "
          f"identical: {report['shards_identical']}")
    write_report(args.output, report)
    print(f"wrote {args.output}")
    if not report["shards_identical"]:
        raise SystemExit(f"the prepared folders differ: {[name for name in one if one[name] != many.get(name)]}")


if __name__ == "__main__":
    main()
