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

    python -m experiments.plot_attention_distance --by-mode CHECKPOINT [CHECKPOINT ...] --output PNG
        [--target prepared/multi30k_en_de/test.de]

Every position mode (the checkpoints of any modes), encoder and decoder, per layer: at each distance j - i, the
mass observed over the mass a query would put there if it spread its attention evenly over every key it sees (1 =
no preference by distance; the short-sentence fall-off divides out). The weights are the ones forward uses: T5's
and ALiBi's bias, RoPE's rotation, the edge tables (MultiHeadAttention.self_attention_weights with the stack's
positions). The decoder is read under teacher forcing on the references, each query against its past; one line
per checkpoint, labelled by its mode.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from nmt.data.batching import pad_rows
from nmt.data.readers import read_lines
from nmt.decoding.decode import load_translator
from nmt.modeling.transformer import BOS, EOS, PAD, stack_positions

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


def mode_label(cfg) -> str:
    """The checkpoint's position mode as a row of the tables names it."""
    if cfg.position.edge_tables and cfg.edge_buckets:
        return f"{cfg.position.value}, {cfg.edge_buckets} buckets to {cfg.clip}"
    if cfg.position.edge_tables and not (cfg.rel_key or cfg.rel_value):
        return "none (no tables)"
    return f"{cfg.position.value}, k={cfg.clip}" if cfg.position.edge_tables else cfg.position.value


@torch.no_grad()
def preference_by_distance(checkpoint: Path, sources: list[str], targets: list[str], max_distance: int) -> dict:
    """Observed over evenly spread mass at each distance, per side and layer (heads pooled) and per head."""
    model, vocab = load_translator(checkpoint, torch.device("cpu"))
    pairs = [(s, t) for s, t in zip(vocab.encode(sources), vocab.encode(targets)) if s and t]
    distances = torch.arange(-max_distance, max_distance + 1)
    sides = {"encoder": model.encoder, "decoder": model.decoder}
    mass = {side: torch.zeros(len(layers), model.cfg.heads, len(distances), dtype=torch.float64)
            for side, layers in sides.items()}
    even = {side: torch.zeros_like(m) for side, m in mass.items()}
    captured = {}
    hooks = [layer.self_attn.register_forward_hook(
        lambda module, args, out, key=(side, i): captured.__setitem__(key, args[0]))
        for side, layers in sides.items() for i, layer in enumerate(layers)]
    for start in range(0, len(pairs), 64):
        chunk = pairs[start:start + 64]
        src = pad_rows([torch.tensor(s).numpy() for s, _ in chunk], suffix=EOS)
        tgt = pad_rows([torch.tensor(t).numpy() for _, t in chunk], prefix=BOS)
        model(src, tgt)  # teacher forcing: the decoder's self-attention over the reference prefix
        for side, tokens, causal in (("encoder", src, False), ("decoder", tgt, True)):
            pad = tokens.eq(PAD)
            n = tokens.shape[1]
            offset = torch.arange(n)[None, :] - torch.arange(n)[:, None]  # (N, N), j - i
            seen = (~pad)[:, :, None] & (~pad)[:, None, :]  # (B, N, N): both ends real tokens
            if causal:
                seen = seen & (offset <= 0)[None]
            spread = seen / seen.sum(-1, keepdim=True).clamp(min=1)  # a query's mass spread evenly over its keys
            scheme = model.encoder_self_positions if side == "encoder" else model.decoder_self_positions
            for index, layer in enumerate(sides[side]):
                x = captured[(side, index)]
                positions = stack_positions(scheme, x, n, 0, pad if side == "encoder" else None)
                probs = layer.self_attn.self_attention_weights(x, pad if side == "encoder" else None, causal,
                                                               positions) * seen[:, None]
                for slot, d in enumerate(distances.tolist()):
                    mass[side][index, :, slot] += probs[..., offset == d].sum(dim=(0, 2)).double()
                    even[side][index, :, slot] += spread[..., offset == d].sum(dim=0).sum().double()
    for hook in hooks:
        hook.remove()
    def observed_over_even(observed, spread):  # NaN at distances no query reaches (the decoder's future)
        return (observed / spread.clamp(min=1e-12)).masked_fill(spread == 0, float("nan"))

    ratio = {side: observed_over_even(mass[side].sum(1), even[side].sum(1)) for side in sides}  # heads pooled
    return {"checkpoint": str(checkpoint), "mode": mode_label(model.cfg), "distances": distances.tolist(),
            "sentences": len(pairs), "ratio": {side: r.tolist() for side, r in ratio.items()},
            "ratio_per_head": {side: observed_over_even(mass[side], even[side]).tolist() for side in sides}}


def plot_by_mode(results: list[dict], output: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sides = ["encoder", "decoder"]
    layers = max(len(r["ratio"][side]) for r in results for side in sides)
    fig, axes = plt.subplots(2, layers, figsize=(4.4 * layers, 3.4 * 2), squeeze=False, sharey=True)
    for row, side in enumerate(sides):
        for layer in range(layers):
            ax = axes[row][layer]
            for result in results:
                if layer < len(result["ratio"][side]):
                    ax.plot(result["distances"], result["ratio"][side][layer], marker=".", markersize=3,
                            linewidth=1, label=result["mode"])
            ax.axhline(1.0, color="0.5", linewidth=0.8)
            ax.set_yscale("log")
            ax.set_title(f"{side} layer {layer + 1}", fontsize=9)
            ax.set_xlabel("relative distance j − i")
            if side == "decoder":
                ax.set_xlim(right=0.5)
            if layer == 0:
                ax.set_ylabel("observed / even spread")
    axes[0][0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=110)


def by_mode_lines(results: list[dict]) -> list[str]:
    """Per mode, side and layer: observed / even at |j - i| = 1, 8 and 17-24 (heads pooled, both directions)."""
    lines = ["| mode | side | layer | d = 1 | d = 8 | d = 17-24 |", "|---|---|---|---|---|---|"]
    for result in results:
        d = result["distances"]
        for side in ("encoder", "decoder"):
            for layer, ratio in enumerate(result["ratio"][side]):
                def at(distances):
                    values = [ratio[d.index(x)] for x in distances if x in d and ratio[d.index(x)] == ratio[d.index(x)]]
                    return f"{sum(values) / len(values):.2f}" if values else "-"
                lines.append(f"| {result['mode']} | {side} | {layer + 1} | {at([1, -1])} | {at([8, -8])} | "
                             f"{at([x for x in range(17, 25)] + [-x for x in range(17, 25)])} |")
    return lines


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
    parser.add_argument("--by-mode", action="store_true", help="every mode's encoder and decoder, a line each")
    parser.add_argument("--target", type=Path, default=ROOT / "prepared" / "multi30k_en_de" / "test.de",
                        help="--by-mode: the references the decoder is teacher-forced on")
    args = parser.parse_args()
    sources = list(read_lines(args.source))[:args.sentences]
    if args.by_mode:
        targets = list(read_lines(args.target))[:args.sentences]
        results = [preference_by_distance(path, sources, targets, args.max_distance) for path in args.checkpoints]
        plot_by_mode(results, args.output)
        args.output.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        table = "\n".join(by_mode_lines(results))
        args.output.with_suffix(".md").write_text(table + "\n")
        print(table + f"\nwrote {args.output}")
        return 0
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
