"""The fused kernel's open GPU questions, answered on a CUDA machine (scripts/gpu_check.sh runs this):

1. forward + backward at head size 64, 128 and 256 in bf16 and fp32, forced through the kernel (attention=triton),
   against the PyTorch path: does it launch, and how far apart are the two;
2. a launch with B * H > 65,535 (short pairs in a big token budget);
3. one bf16 training step of the base model: loss and gradients through auto (self-checked) vs the PyTorch path;
4. registers, spills and shared memory of every kernel compiled above, as the driver reports them;
5. the self-test verdicts auto reached for the base model's cases.

    python scripts/gpu_questions.py [--output results/gpu/questions.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from nmt.attention import relation_aware_attention
from nmt.config import ModelConfig
from nmt.kernels import relative_attention_triton as device_code
from nmt.kernels.dispatch import AttentionBackend, model_cases
from nmt.model import Transformer


def layer_against_torch_path(b, h, n, d, dtype, clip=16) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(b, h, n, d)] * 3 + [(h, 2 * clip + 1, d)] * 2
    base = [torch.randn(*s, generator=g, device="cuda", dtype=torch.float32) for s in shapes]
    pad = torch.zeros(b, n, dtype=torch.bool, device="cuda")
    pad[0, n // 2:] = True
    results = {}
    for mode in ("triton", "torch"):
        leaves = [t.to(dtype).requires_grad_(True) for t in base]
        try:
            out = relation_aware_attention(*leaves, clip, key_padding_mask=pad, backend=AttentionBackend(mode))
            out.float().pow(2).sum().backward()
            torch.cuda.synchronize()
            results[mode] = [out.detach().float()] + [t.grad.float() for t in leaves]
        except Exception as err:  # the question is whether it runs
            return {"error": f"{type(err).__name__}: {str(err).splitlines()[0]}"}
    names = ["out", "dq", "dk", "dv", "drk", "drv"]
    return {name: float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))
            for name, x, y in zip(names, results["triton"], results["torch"])}


def training_step_against_torch_path() -> dict:
    fields = dict(encoder_layers=6, decoder_layers=6, d_model=512, heads=8, ffn_dim=1024, clip=16, dropout=0.0)
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 8000, (64, 40), generator=g).cuda()
    tgt = torch.randint(4, 8000, (64, 41), generator=g).cuda()
    results, backends = {}, {}
    for mode in ("auto", "torch"):
        torch.manual_seed(0)
        backends[mode] = AttentionBackend(mode)
        model = Transformer(ModelConfig(**fields), 8000, backends[mode]).cuda()
        backends[mode].check(model_cases(model.cfg, torch.bfloat16, torch.device("cuda"), training=True),
                             torch.device("cuda"))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        results[mode] = (loss.item(), [p.grad.float() for p in model.parameters()])
    worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                for a, b in zip(results["auto"][1], results["torch"][1]))
    return {"loss_auto": results["auto"][0], "loss_torch": results["torch"][0], "worst_grad_rel_diff": worst,
            "verdicts": {str(case): ok for case, ok in backends["auto"].verdicts.items()}}


def compiled_kernels() -> list[dict]:
    rows = []
    for name in ("forward_kernel", "backward_kv_kernel", "backward_q_kernel"):
        kernel = getattr(device_code, name)
        for cache in kernel.device_caches.values():
            for compiled in cache[0].values():
                compiled._init_handles()
                rows.append({"kernel": name, "registers": compiled.n_regs, "spills": compiled.n_spills,
                             "shared": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="results/gpu/questions.json")
    args = parser.parse_args()
    report = {"device": torch.cuda.get_device_name(), "layer": {}}
    for d in (64, 128, 256):
        for dtype in (torch.bfloat16, torch.float32):
            key = f"D={d} {dtype}"
            report["layer"][key] = layer_against_torch_path(4, 8, 96, d, dtype)
            print(key, report["layer"][key], flush=True)
    report["grid_B*H=65600"] = layer_against_torch_path(8200, 8, 4, 64, torch.bfloat16)
    print("B*H = 65,600:", report["grid_B*H=65600"], flush=True)
    report["base_training_step_bf16"] = training_step_against_torch_path()
    print("base bf16 step:", report["base_training_step_bf16"], flush=True)
    report["compiled_kernels"] = compiled_kernels()
    for row in report["compiled_kernels"]:
        print(row)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
