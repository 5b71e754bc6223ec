"""What each position mode costs, side by side in one process (medians of interleaved repeats).

1. One self-attention layer with its projections, forward + backward, d_model 512, 8 heads, 1,536 tokens per
   batch (one sequence from n = 1,024), no padding, at n = 32 .. 1,024: plain SDPA (the self-attention of
   position=none|absolute|learned, whose positions are at the input) against relative (k = 16, a^K and a^V per
   head: also position=both's layer), t5, alibi and rope. A descendant's timed step includes building its
   positions, which a stack does once for all its layers: this is a one-layer stack, the dearest case.
   The same layers forward only (inference mode), the cost at translation time.
2. One `tiny` training step per mode, all eight (batch 32 x 48 tokens, label-smoothed loss, backward).

    python -m benchmarks.positions [--repeats 20] [--model-repeats 10] [--threads 2] [--device cpu]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.attention import D_MODEL, HEADS, TOKENS
from benchmarks.report import write_report
from nmt.config import ModelConfig
from nmt.kernels.dispatch import AttentionBackend
from nmt.modeling.attention import MultiHeadAttention
from nmt.modeling.edges import EdgeIndex
from nmt.modeling.transformer import Transformer, self_attention_positions, stack_positions
from nmt.modes import Position
from nmt.timing import time_interleaved

SIZES = (32, 64, 128, 256, 512, 1024)
# one layer with each self-attention scheme, and plain SDPA: the cost of the scheme alone
LAYER_MODES = ("sdpa", *(p.value for p in (Position.relative, Position.t5, Position.alibi, Position.rope)))


def layer_steps(n: int, device, dtype, backward: bool = True) -> dict:
    """mode -> one forward (+ backward) of an encoder self-attention layer at length n."""
    x = torch.randn(max(1, TOKENS // n), n, D_MODEL, device=device, dtype=dtype)
    cfg = ModelConfig(d_model=D_MODEL, heads=HEADS, dropout=0.0)
    steps = {}
    for mode in LAYER_MODES:
        torch.manual_seed(0)
        relative = mode == Position.relative.value
        layer = MultiHeadAttention(D_MODEL, HEADS, edges=EdgeIndex(cfg.clip) if relative else None,
                                   backend=AttentionBackend("auto") if relative else None)
        position = Position(mode) if mode != "sdpa" else Position.none
        scheme = self_attention_positions(replace(cfg, position=position), causal=False)
        for module in (layer, scheme):
            if module is not None:
                module.to(device=device, dtype=dtype).train()

        def step(layer=layer, scheme=scheme):
            if not backward:
                with torch.inference_mode():
                    positions = stack_positions(scheme, x, n, 0)
                    layer(x, layer.project_kv(x, positions.rotation), positions=positions)
                return
            h = x.detach().requires_grad_(True)
            positions = stack_positions(scheme, h, n, 0)
            out = layer(h, layer.project_kv(h, positions.rotation), positions=positions)
            out.float().pow(2).mean().backward()

        steps[mode] = step
    return steps


def model_steps(device, dtype) -> dict:
    """position -> one tiny training step (forward, label-smoothed loss, backward)."""
    from nmt.compose import preset_job

    cfg = preset_job("model=tiny").model
    src = torch.randint(4, 8000, (32, 48), device=device)
    tgt = torch.randint(4, 8000, (32, 49), device=device)
    steps = {}
    for position in Position:
        torch.manual_seed(0)
        model = Transformer(replace(cfg, position=position), 8000, AttentionBackend("auto")).to(device=device,
                                                                                                  dtype=dtype)

        def step(model=model):
            logits = model(src, tgt[:, :-1])
            F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), label_smoothing=0.1).backward()

        steps[position.value] = step
    return steps


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--model-repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--output", default="results/bench_positions.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    report = {"args": vars(args), "torch": torch.__version__, "layer": [], "layer_forward": [], "model": {}}

    print(f"layer fwd+bwd / sdpa, d_model {D_MODEL}, {HEADS} heads, {TOKENS} tokens/batch, {args.device} "
          f"{args.dtype}, {args.threads} threads, median of {args.repeats}")
    print("     n  sdpa ms  " + "  ".join(f"{m:>8s}" for m in LAYER_MODES[1:]))
    for key, backward in (("layer", True), ("layer_forward", False)):
        if not backward:
            print("\nthe same, forward only (inference mode)")
        for n in args.sizes:
            t = time_interleaved(layer_steps(n, device, dtype, backward), args.repeats, device)
            row = {"n": n, "ms": {k: v * 1e3 for k, v in t.items()},
                   "over_sdpa": {k: v / t["sdpa"] for k, v in t.items() if k != "sdpa"}}
            report[key].append(row)
            print(f"{n:6d} {t['sdpa'] * 1e3:8.2f}  " + "  ".join(f"{row['over_sdpa'][m]:8.3f}"
                                                                for m in LAYER_MODES[1:]), flush=True)

    print(f"\ntiny training step (batch 32 x 48 tokens), median of {args.model_repeats}, / absolute")
    t = time_interleaved(model_steps(device, dtype), args.model_repeats, device)
    for position, seconds in t.items():
        report["model"][position] = {"ms": seconds * 1e3, "over_absolute": seconds / t[Position.absolute.value]}
        print(f"{position:9s} {seconds * 1e3:8.1f} ms  {seconds / t['absolute']:6.3f}")

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_report(args.output, report)
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
