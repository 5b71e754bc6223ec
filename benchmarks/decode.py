"""Decoding speed: greedy and beam 4 on the bundled test set, and what the incremental cache buys.

    python -m benchmarks.decode [--checkpoint outputs/demo/averaged.pt] [--threads 2] [--device cpu]
                                   [--precision auto|fp32|bf16|fp16] [--sentences N] [--repeats 5]

Decoding runs as nmt.translate does (precision=auto: bf16 autocast on a GPU that has it, fp32 on a CPU;
attention=auto: the fused kernel on CUDA where its self-test passes). Every timing waits for the device.

Without a checkpoint (before `make demo`) it uses a random-weight model of the `tiny` shape (--preset).
Cached vs uncached: 50 decoder steps for a batch of 32 sentences, one token per step, with the
cache versus re-running the decoder over the whole prefix (median of repeats, interleaved), in the same precision.
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import torch

from benchmarks.report import write_report
from nmt.config import SearchConfig
from nmt.data.batching import pad_rows
from nmt.decoding.decode import encode_lines, load_translator, translate_ids
from nmt.decoding.search import Uncached
from nmt.kernels.dispatch import AttentionBackend
from nmt.modeling.transformer import BOS, EOS, Transformer
from nmt.modes import Precision
from nmt.runtime.precision import autocast, autocast_dtype
from nmt.timing import time_interleaved

ROOT = Path(__file__).resolve().parent.parent


def step_loop(model, src, steps: int) -> None:
    cache = model.start(model.encode(src), src)
    token = torch.full((src.shape[0], 1), BOS, device=src.device)
    for _ in range(steps):
        logits, cache = model.decode(token, cache)
        token = logits[:, -1:].argmax(-1)


def load_model(checkpoint: str | None, device: torch.device, preset: str = "tiny"):
    """(model, vocabulary, what it is): the checkpoint's, or a random-weight preset over the prepared vocabulary."""
    if checkpoint and Path(checkpoint).is_file():
        model, vocab = load_translator(checkpoint, device, AttentionBackend("auto"))
        return model, vocab, f"trained checkpoint {checkpoint}"
    from nmt.data.pipeline import prepared_dir
    from nmt.data.vocab import Vocab
    from nmt.compose import preset_job

    job = preset_job(f"model={preset}", "data=multi30k_en_de")
    vocab = Vocab(prepared_dir(job.data) / "spm.model")
    model = Transformer(job.model, len(vocab), AttentionBackend("auto")).to(device).eval()
    return model, vocab, f"random-weight {preset} model (run make demo for a trained one)"


def measure(model, vocab, lines: list[str], device: torch.device, dtype, repeats: int) -> dict:
    """Sentences and target tokens per second, greedy and beam 4, and the cache's speed-up, under `dtype` autocast."""
    ids = encode_lines(vocab, lines, 500)
    report = {"sentences": len(lines), "precision": str(dtype or torch.float32)}
    outputs = {}

    def search(beam: int):
        with autocast(device, dtype):
            outputs[beam] = translate_ids(model, ids, SearchConfig(beam=beam), device)

    # once each, no warm-up: a whole test set is long enough to time alone, and its first batch is part of its cost
    seconds = time_interleaved({"greedy": lambda: search(1), "beam4": lambda: search(4)}, 1, device, warmup=0)
    for (name, s), beam in zip(seconds.items(), (1, 4)):
        tokens = sum(len(row) + 1 for row in outputs[beam])
        report[name] = {"seconds": round(s, 3), "sentences_per_s": round(len(lines) / s, 1),
                        "target_tokens_per_s": round(tokens / s)}
        print(f"{name:7s} {len(lines) / s:8.1f} sentences/s {tokens / s:9.0f} target tokens/s", flush=True)

    src = pad_rows([torch.tensor(row).numpy() for row in ids[:32]], suffix=EOS).to(device)
    with torch.no_grad(), autocast(device, dtype):
        times = time_interleaved({"cached": lambda: step_loop(model, src, 50),
                                  "uncached": lambda: step_loop(Uncached(model), src, 50)}, repeats, device, warmup=0)
    cached, uncached = times["cached"], times["uncached"]
    report["cache_50_steps"] = {"cached_s": round(cached, 4), "uncached_s": round(uncached, 4),
                                "speedup": round(uncached / cached, 2)}
    print(f"50 steps x {src.shape[0]} sentences: cached {cached:.3f} s, uncached {uncached:.3f} s, "
          f"speed-up {uncached / cached:.1f}x", flush=True)
    return report


def test_sentences(n: int | None = None) -> list[str]:
    with gzip.open(ROOT / "data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:n] if n else lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="outputs/demo/averaged.pt")
    parser.add_argument("--preset", default="tiny", help="the random-weight model's shape when there is no checkpoint")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sentences", type=int, default=0, help="the first N test sentences (0: all 1,000)")
    parser.add_argument("--precision", default="auto", choices=[p.value for p in Precision])
    parser.add_argument("--output", default="results/bench_decode.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = autocast_dtype(Precision(args.precision), device, training=False)
    model, vocab, source = load_model(args.checkpoint, device, args.preset)
    lines = test_sentences(args.sentences)
    print(f"{source}; {len(lines)} sentences; {args.device}, {args.threads} threads, {dtype or torch.float32}")
    report = {"model": source, "device": args.device, "threads": args.threads,
              **measure(model, vocab, lines, device, dtype, args.repeats)}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_report(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
