"""Relative attention cost, side by side in one process (median of repeats, interleaved).

1. One self-attention layer (projections + attention), forward + backward, d_model 512, 8 heads,
   k=16 with a^K and a^V per head, ~1536 tokens per batch, n in {48, 96, 192}:
   ours relative | ours without tables (F.scaled_dot_product_attention) | OpenNMT-py 3.5.1 relative.
   On CUDA "ours" is the fused Triton kernel (attention=auto: self-checked); "ours_torch" is the same layer on
   the PyTorch path (attention=torch), so the kernel's gain is measured side by side.
   Memory: bytes of activations the layer keeps for backward (deduplicated by storage).
2. Whole models (tiny, base): one training step (forward, label-smoothed loss, backward),
   position=relative vs position=absolute, and relative with one edge table per layer (share_heads) and learned
   absolute positions beside them.

    pip install --no-deps opennmt-py==3.5.1   # optional reference; skipped when missing
    python -m benchmarks.attention [--repeats 20] [--threads 2] [--device cpu] [--dtype float32]
    TRITON_INTERPRET=1 python -m benchmarks.attention --memory-only --output results/attention_memory.json
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.report import write_report
from nmt.kernels.dispatch import AttentionBackend
from nmt.modeling.attention import MultiHeadAttention
from nmt.modeling.edges import EdgeIndex
from nmt.modeling.transformer import Transformer
from nmt.modes import Position
from nmt.timing import time_interleaved

D_MODEL, HEADS, CLIP, TOKENS = 512, 8, 16, 1536


def load_opennmt_attention():
    """OpenNMT-py's MultiHeadedAttention without its package __init__ (which needs many extra deps)."""
    spec = importlib.util.find_spec("onmt")
    if spec is None:
        return None
    modules = Path(spec.submodule_search_locations[0]) / "modules"
    package = types.ModuleType("onmt_ref")
    package.__path__ = [str(modules)]
    sys.modules["onmt_ref"] = package
    mod_spec = importlib.util.spec_from_file_location("onmt_ref.multi_headed_attn", modules / "multi_headed_attn.py")
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module
    mod_spec.loader.exec_module(module)
    return module.MultiHeadedAttention


def saved_bytes(step) -> int:
    """Bytes of distinct storages autograd keeps for backward during step()."""
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step(backward=False)
    return sum(seen.values())


def layer_steps(n: int, device, dtype, opennmt_cls, both_paths: bool = False):
    """Timed steps by name; on CUDA (or with both_paths) "ours_torch" too, and with both_paths "ours_triton"."""
    batch = TOKENS // n
    x = torch.randn(batch, n, D_MODEL, device=device, dtype=dtype)
    layers = {
        "ours_relative": MultiHeadAttention(D_MODEL, HEADS, edges=EdgeIndex(CLIP), backend=AttentionBackend("auto")),
        "sdpa": MultiHeadAttention(D_MODEL, HEADS),
    }
    if opennmt_cls is not None:
        layers["opennmt_relative"] = opennmt_cls(HEADS, D_MODEL, dropout=0.0, is_decoder=False,
                                                 max_relative_positions=CLIP, attn_type="self")
    steps = {}
    for name, layer in layers.items():
        layer.to(device=device, dtype=dtype).train()

        def step(layer=layer, name=name, backward=True):
            h = x.detach().requires_grad_(True)
            out = layer(h, h, h)[0] if name.startswith("opennmt") else layer(h, layer.project_kv(h))
            if backward:
                out.float().pow(2).mean().backward()

        steps[name] = step
    if device.type == "cuda" or both_paths:
        steps["ours_torch"] = with_backend(layers["ours_relative"], steps["ours_relative"], "torch")
    if both_paths:
        steps["ours_triton"] = with_backend(layers["ours_relative"], steps["ours_relative"], "triton")
    return steps


def with_backend(layer, step, mode: str):
    """The step with the layer's attention backend set to `mode` while it runs."""

    def run(backward=True):
        saved, layer.backend = layer.backend, AttentionBackend(mode)
        try:
            step(backward=backward)
        finally:
            layer.backend = saved

    return run


def model_steps(preset: str, device, dtype):
    from dataclasses import replace

    from nmt.compose import preset_job

    cfg = preset_job(f"model={preset}").model
    src = torch.randint(4, 8000, (32, 48), device=device)
    tgt = torch.randint(4, 8000, (32, 49), device=device)
    steps = {}
    variants = {Position.relative.value: replace(cfg, position=Position.relative),
                Position.absolute.value: replace(cfg, position=Position.absolute),
                "shared": replace(cfg, position=Position.relative, share_heads=True),  # one edge table per layer
                Position.learned.value: replace(cfg, position=Position.learned)}
    for name, variant in variants.items():
        torch.manual_seed(0)
        model = Transformer(variant, 8000, AttentionBackend("auto")).to(device=device, dtype=dtype)

        def step(model=model, backward=True):
            logits = model(src, tgt[:, :-1])
            loss = F.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten(), label_smoothing=0.1)
            if backward:
                loss.backward()

        steps[name] = step
    return steps


def memory_only(device, dtype, output: str) -> None:
    """Bytes kept for backward by one layer: the Triton kernel (O(N)), the PyTorch path (keeps the (N, N)
    probabilities), SDPA. Counted, not timed, so it may run beside other work and in the interpreter."""
    rows = []
    print(f"kept for backward, MB: one layer, d_model {D_MODEL}, {HEADS} heads, k={CLIP}, {TOKENS} tokens/batch")
    print("   n  kernel  torch path    sdpa  kernel/sdpa  torch path/sdpa")
    for n in (48, 96, 192):
        steps = layer_steps(n, device, dtype, None, both_paths=True)
        mem = {name: saved_bytes(steps[key]) / 2**20 for name, key in (("kernel", "ours_triton"),
                                                                         ("torch_path", "ours_torch"))}
        mem["sdpa"] = saved_bytes(steps["sdpa"]) / 2**20
        rows.append({"n": n, "saved_mb": mem})
        print(f"{n:4d} {mem['kernel']:7.1f} {mem['torch_path']:11.1f} {mem['sdpa']:7.1f} "
              f"{mem['kernel'] / mem['sdpa']:12.3f} {mem['torch_path'] / mem['sdpa']:16.3f}", flush=True)
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    write_report(output, {"device": str(device), "dtype": str(dtype), "rows": rows})
    print(f"wrote {output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--model-repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--output", default="results/bench_attention.json")
    parser.add_argument("--memory-only", action="store_true",
                        help="count what each layer keeps for backward, time nothing (the Triton kernel too, on a CPU "
                             "through its interpreter: run with TRITON_INTERPRET=1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.memory_only:
        return memory_only(device, dtype, args.output)
    opennmt_cls = load_opennmt_attention()
    report = {"args": vars(args), "torch": torch.__version__, "layer": [], "model": []}

    print(f"layer fwd+bwd, d_model {D_MODEL}, {HEADS} heads, k={CLIP}, {TOKENS} tokens/batch, "
          f"{args.device} {args.dtype}, {args.threads} threads, median of {args.repeats}")
    print("   n  ours_rel ms   sdpa ms  onmt_rel ms  ours/sdpa  onmt/sdpa  ours/onmt  mem ours/sdpa")
    for n in (48, 96, 192):
        steps = layer_steps(n, device, dtype, opennmt_cls)
        t = time_interleaved(steps, args.repeats, device)
        mem = {name: saved_bytes(step) for name, step in steps.items()}
        onmt = t.get("opennmt_relative", float("nan"))
        row = {"n": n, "ms": {k: v * 1e3 for k, v in t.items()}, "saved_mb": {k: v / 2**20 for k, v in mem.items()},
               "ours_over_sdpa": t["ours_relative"] / t["sdpa"], "onmt_over_sdpa": onmt / t["sdpa"],
               "mem_ours_over_sdpa": mem["ours_relative"] / mem["sdpa"]}
        report["layer"].append(row)
        print(f"{n:4d} {t['ours_relative'] * 1e3:12.2f} {t['sdpa'] * 1e3:9.2f} {onmt * 1e3:12.2f} "
              f"{row['ours_over_sdpa']:10.3f} {row['onmt_over_sdpa']:10.3f} {t['ours_relative'] / onmt:10.3f} "
              f"{row['mem_ours_over_sdpa']:14.3f}")
        if "ours_torch" in t:
            row["torch_path_over_sdpa"] = t["ours_torch"] / t["sdpa"]
            print(f"     (PyTorch path instead of the Triton kernel: {t['ours_torch'] * 1e3:.2f} ms, "
                  f"{row['torch_path_over_sdpa']:.3f} x sdpa, memory {mem['ours_torch'] / mem['sdpa']:.3f} x sdpa)")

    print(f"\nwhole model training step (batch 32 x 48 tokens), median of {args.model_repeats}")
    print("preset  relative ms  absolute ms  shared ms  learned ms  rel/abs  shared/rel  learned/abs")
    for preset in ("tiny", "base"):
        t = time_interleaved(model_steps(preset, device, dtype), args.model_repeats, device)
        relative, absolute = t[Position.relative.value], t[Position.absolute.value]
        ratio = relative / absolute
        report["model"].append({"preset": preset, "ms": {k: v * 1e3 for k, v in t.items()}, "rel_over_abs": ratio,
                                "shared_over_rel": t["shared"] / relative,
                                "learned_over_abs": t[Position.learned.value] / absolute})
        print(f"{preset:6s} {t['relative'] * 1e3:12.1f} {t['absolute'] * 1e3:12.1f} {t['shared'] * 1e3:10.1f} "
              f"{t['learned'] * 1e3:11.1f} {ratio:8.3f} {t['shared'] / t['relative']:11.3f} "
              f"{t['learned'] / t['absolute']:12.3f}")

    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_report(args.output, report)
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
