"""Where a trained relative model's encoder looks: mean attention mass by relative distance j - i.

    python -m experiments.plot_attention_distance CHECKPOINT [CHECKPOINT ...] --output results/attention_distance.png
        [--source prepared/multi30k_en_de/test.en] [--sentences 1000] [--max-distance 24]

For each encoder layer and head: the attention probability a query puts on the key at distance j - i,
averaged over the non-padding queries of the source sentences (eval mode, no dropout). The clipping
window [-k, k] is shaded: mass outside it is attention to keys whose edge vectors are all the same, so
any preference there comes from content, or from position carried up from the layers below.

Raw mass falls with |j - i| outside the window even without any preference, because short sentences
have few distant keys. The last column therefore divides, for |j - i| > k, the observed mass by what a
query would put there if it spread its outside-window mass evenly over its outside-window keys: 1 means
no preference by distance, a ratio falling with distance means the layer still tells near from far
beyond k (position carried up through depth). Also writes the numbers as JSON next to the PNG.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from nmt.data.batching import pad_rows
from nmt.data.readers import read_lines
from nmt.decode import load_translator
from nmt.model import EOS, PAD

ROOT = Path(__file__).resolve().parent.parent


@torch.no_grad()
def mass_by_distance(checkpoint: Path, sources: list[str], max_distance: int) -> dict:
    model, vocab = load_translator(checkpoint, torch.device("cpu"))
    if not model.cfg.position.edge_tables:
        raise SystemExit(f"{checkpoint}: position={model.cfg.position.value}, not a relative model")
    ids = [row for row in vocab.encode(sources) if row]
    distances = torch.arange(-max_distance, max_distance + 1)
    layers, heads = len(model.encoder), model.cfg.heads
    mass = torch.zeros(layers, heads, len(distances), dtype=torch.float64)
    uniform = torch.zeros(layers, heads, len(distances), dtype=torch.float64)  # even spread outside the window
    queries = 0
    captured = {}
    hooks = [layer.self_attn.register_forward_hook(
        lambda module, args, out, index=i: captured.__setitem__(index, args[0])) for i, layer in enumerate(model.encoder)]
    for start in range(0, len(ids), 64):
        src = pad_rows([torch.tensor(row).numpy() for row in ids[start:start + 64]], suffix=EOS)
        pad = src.eq(PAD)
        model.encode(src)
        n = src.shape[1]
        offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # (N, N), j - i
        valid = (~pad)[:, :, None] & (~pad)[:, None, :]  # (B, N, N): both ends real tokens
        outside = valid & (offset.abs() > model.cfg.clip)[None]  # (B, N, N)
        queries += int((~pad).sum())
        for layer_index, layer in enumerate(model.encoder):
            probs = layer.self_attn.self_attention_weights(captured[layer_index], pad)  # (B, H, N, N)
            probs = probs * valid[:, None]
            outside_mass = (probs * outside[:, None]).sum(-1, keepdim=True)  # (B, H, N, 1)
            per_key = outside_mass / outside.sum(-1, keepdim=True).clamp(min=1)[:, None]
            spread = per_key * outside[:, None]  # (B, H, N, N): the same mass, evenly over outside keys
            for slot, d in enumerate(distances.tolist()):
                mass[layer_index, :, slot] += probs[..., offset == d].sum(dim=(0, 2)).double()
                uniform[layer_index, :, slot] += spread[..., offset == d].sum(dim=(0, 2)).double()
    for hook in hooks:
        hook.remove()
    ratio = mass.sum(1) / uniform.sum(1).clamp(min=1e-12)  # (layers, distances), heads pooled
    ratio[:, distances.abs() <= model.cfg.clip] = float("nan")
    mass /= queries
    return {"checkpoint": str(checkpoint), "clip": model.cfg.clip, "distances": distances.tolist(),
            "mass": mass.tolist(), "queries": queries, "outside_ratio": ratio.tolist(),
            "outside_window": mass[..., distances.abs() > model.cfg.clip].sum(-1).tolist()}


def plot(results: list[dict], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = len(results[0]["mass"])
    fig, axes = plt.subplots(len(results), layers + 1, figsize=(4.2 * (layers + 1), 3.2 * len(results)),
                             squeeze=False)
    for row, result in enumerate(results):
        k = result["clip"]
        for layer in range(layers):
            ax = axes[row][layer]
            ax.axvspan(-k - 0.5, k + 0.5, color="0.92", zorder=0)
            for head, values in enumerate(result["mass"][layer]):
                ax.plot(result["distances"], values, marker=".", linewidth=1, label=f"head {head}")
            outside = sum(result["outside_window"][layer]) / len(result["outside_window"][layer])
            ax.set_title(f"k={k}, encoder layer {layer + 1}: {outside:.1%} outside |j-i|≤k", fontsize=9)
            ax.set_xlabel("relative distance j − i")
            ax.set_ylim(0, 0.9)
            if layer == 0:
                ax.set_ylabel("mean attention mass")
        ax = axes[row][layers]
        for layer, values in enumerate(result["outside_ratio"]):
            ax.plot(result["distances"], values, marker=".", linewidth=1, label=f"layer {layer + 1}")
        ax.axhline(1.0, color="0.5", linewidth=0.8)
        ax.set_xlim(-(k + 13), k + 13)
        ax.set_title(f"k={k}: outside |j-i|≤k, observed / even spread", fontsize=9)
        ax.set_xlabel("relative distance j − i")
        ax.legend(fontsize=7)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path)
    parser.add_argument("--source", type=Path, default=ROOT / "prepared" / "multi30k_en_de" / "test.en")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--max-distance", type=int, default=24)
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "attention_distance.png")
    args = parser.parse_args()
    sources = list(read_lines(args.source))[:args.sentences]
    results = [mass_by_distance(path, sources, args.max_distance) for path in args.checkpoints]
    plot(results, args.output)
    args.output.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    for result in results:
        k, d = result["clip"], result["distances"]
        for layer, outside in enumerate(result["outside_window"]):
            ratios = result["outside_ratio"][layer]
            near = [ratios[d.index(x)] for x in (k + 1, -k - 1) if x in d]
            far = [ratios[d.index(x)] for x in (k + 6, -k - 6) if x in d]
            print(f"k={k} layer {layer + 1}: mass outside the window per head "
                  + " ".join(f"{v:.3f}" for v in outside)
                  + f"; observed/even at |j-i|={k + 1}: " + " ".join(f"{v:.2f}" for v in near)
                  + f", at |j-i|={k + 6}: " + " ".join(f"{v:.2f}" for v in far))
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
