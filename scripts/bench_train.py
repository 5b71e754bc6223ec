"""Training throughput: tokens/s and peak memory per preset, relative vs absolute positions.

    python scripts/bench_train.py [--steps 30] [--device cpu|cuda] [--precision fp32|bf16] [--compile]
        [--presets tiny base big] [--max-tokens 4096] [--peak-tflops 989]

Each (preset, position) trains in its own process (so peak RSS / CUDA peak memory is its own) on
real Multi30k batches of --max-tokens with Adam; the two positions of a preset run alternately,
`--rounds` times, and the median step time is reported. FLOPs per step are counted once with
torch.utils.flop_counter (forward + backward of one real batch); achieved TFLOP/s is that over the
median step time, and MFU that over --peak-tflops (the accelerator's dense bf16 peak; H100/H200: 989).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(preset: str, position: str, steps: int, device: str, precision: str, max_tokens: int,
            compile_model: bool) -> dict:
    import torch
    import yaml

    from nmt.config import ModelConfig
    from nmt.data.batching import epoch_batches
    from nmt.data.shards import Shard
    from nmt.model import Transformer
    from torch.utils.flop_counter import FlopCounterMode

    from nmt.config import Precision
    from nmt.train import autocast, autocast_dtype, retain_freed_memory, smoothed_loss

    torch.manual_seed(0)
    fields = yaml.safe_load(open(ROOT / "configs/model" / f"{preset}.yaml"))
    shard = Shard(ROOT / "prepared/multi30k_en_de", "train", 8000)
    dev = torch.device(device)
    if dev.type == "cpu":
        retain_freed_memory()  # as the trainer does
    model = Transformer(ModelConfig(**{**fields, "position": position}), 8000).to(dev)
    net = torch.compile(model, dynamic=True) if compile_model else model
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    dtype = autocast_dtype(Precision(precision), dev)
    batches = [b.to(dev) for _, b in zip(range(steps + 3), (b for _, b in epoch_batches(shard, max_tokens, 1, 0)))]
    with FlopCounterMode(display=False) as counter, autocast(dev, dtype):
        smoothed_loss(model(batches[0].src, batches[0].tgt_in), batches[0].tgt_out, 0.1)[0].backward()
    model.zero_grad(set_to_none=True)
    times, tokens = [], 0
    for i, batch in enumerate(batches):
        if dev.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with autocast(dev, dtype):
            logits = net(batch.src, batch.tgt_in)
        loss, _ = smoothed_loss(logits, batch.tgt_out, 0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if i >= 3:  # warm-up (and, compiled, the compilation)
            times.append(time.perf_counter() - start)
            tokens += batch.target_tokens
    peak = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    step = statistics.median(times)
    return {"step_s": step, "target_tokens_per_s": tokens / sum(times), "peak_mib": peak,
            "tflops_per_step": counter.get_total_flops() / 1e12, "tflop_s": counter.get_total_flops() / 1e12 / step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--presets", nargs="+", default=["tiny", "base"])
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (25000: the paper's per update)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (dynamic shapes)")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak for MFU; 0 = no MFU")
    parser.add_argument("--output", default="results/bench_train.json")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(*args.worker, args.steps, args.device, args.precision, args.max_tokens,
                                 args.compile)))
        return
    report = {"args": vars(args), "rows": []}
    print(f"{args.device} {args.precision}{' compiled' if args.compile else ''}, {args.steps} steps x "
          f"{args.rounds} rounds, max_tokens {args.max_tokens}")
    print("preset  position   step s   target tok/s   peak MiB   TFLOP/s    MFU")
    for preset in args.presets:
        runs = {"relative": [], "absolute": []}
        for _ in range(args.rounds):
            for position in runs:
                out = subprocess.run([sys.executable, __file__, "--worker", preset, position, "--steps",
                                      str(args.steps), "--device", args.device, "--precision", args.precision,
                                      "--max-tokens", str(args.max_tokens), *(["--compile"] if args.compile else [])],
                                     cwd=ROOT, check=True, capture_output=True, text=True).stdout
                runs[position].append(json.loads(out.strip().splitlines()[-1]))
        summary = {}
        for position, results in runs.items():
            summary[position] = {key: statistics.median(r[key] for r in results) for key in results[0]}
            s = summary[position]
            if args.peak_tflops:
                s["mfu"] = s["tflop_s"] / args.peak_tflops
            print(f"{preset:6s}  {position:9s} {s['step_s']:7.3f} {s['target_tokens_per_s']:13.0f} "
                  f"{s['peak_mib']:10.0f} {s['tflop_s']:9.2f} {s.get('mfu', float('nan')):6.1%}")
        ratio = summary["relative"]["step_s"] / summary["absolute"]["step_s"]
        memory = summary["relative"]["peak_mib"] / summary["absolute"]["peak_mib"]
        print(f"{preset:6s}  relative/absolute: time {ratio:.3f}, peak memory {memory:.3f}")
        report["rows"].append({"preset": preset, **summary, "time_ratio": ratio, "memory_ratio": memory})
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
