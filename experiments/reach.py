"""Does depth carry position beyond the clipping distance? A synthetic test of the paper's explanation of Table 2.

    python -m experiments.reach [--layers 1 2 3 4 6] [--clips 1 2 4 8] [--seeds 1 2] [--updates 1500] [--jobs 2]
                            [--output results/reach]
    python -m experiments.reach --report [--output results/reach]     # the heatmap, the table and the law, from the runs

The task: copy at distance d. A sequence is N random symbols x_1..x_N, each token carrying the sequence's distance
d as well (token = (x_j, d)); the answer at position j > d is x_{j-d} (positions j <= d have no answer). d is drawn
from 1..24 per sequence, so one model answers every distance and its accuracy can be read as a function of d.
Why this form: an encoder-only tagging task isolates what self-attention can locate (no decoder, no search); every
query knows d from its own token, so a single layer can aim its attention at offset -d without first looking the
distance up (a separate distance token would need a layer, or a head per offset, just to read it); and with random
symbols nothing but position tells the right symbol from the others. The model is this project's encoder (nmt.modeling.transformer.Transformer.encode) with relative positions only
(model.position=relative, no sinusoids), a linear layer on each position's output, L layers and clipping
distance k. With k, a layer tells apart the offsets -(k-1)..(k-1) and sees every key further left (or right) in one
bucket; whatever reaches beyond that must come through depth.

Each (L, k, seed) run trains for --updates updates of 64 sequences (a budget in updates, the same on every machine)
and writes OUTPUT/L<L>_k<k>_seed<s>.json: accuracy by d on 512 fresh sequences per d, d_eff (the largest d such
that every distance up to it has accuracy >= 95%), and the run's settings and time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.grid import Cell, read_records, run_cells, write_record
from nmt.cli import ends_in_one_line
from nmt.machine import host
from nmt.modes import Position

SYMBOLS, MAX_DISTANCE, LENGTH = 16, 24, 40  # random symbols, distances 1..24, symbols per sequence
FIRST_TOKEN = 4  # ids 0-3 are PAD, UNK, BOS, EOS (nmt.data.vocab)
VOCAB = FIRST_TOKEN + MAX_DISTANCE * SYMBOLS  # one token per (distance, symbol)
THRESHOLD = 0.95


def batch(n: int, generator: torch.Generator, distance: int | None = None,
          length: int = LENGTH) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (n, length), targets (n, length): the symbol d places to the left, -100 where there is none)."""
    d = (torch.randint(1, MAX_DISTANCE + 1, (n,), generator=generator) if distance is None
         else torch.full((n,), distance))
    symbols = torch.randint(0, SYMBOLS, (n, length), generator=generator)
    positions = torch.arange(length)[None, :]
    source = positions - d[:, None]
    targets = symbols.gather(1, source.clamp(min=0)).masked_fill(source < 0, -100)
    tokens = FIRST_TOKEN + (d[:, None] - 1) * SYMBOLS + symbols
    return tokens, targets


def offset_symbols(tokens: torch.Tensor) -> torch.Tensor:
    """The symbol each token of `batch` carries (its distance aside): what a head could copy."""
    return (tokens - FIRST_TOKEN) % SYMBOLS


class Tagger(torch.nn.Module):
    """This project's encoder (relative positions only, unless `model` says otherwise) and a linear layer from each
    position's output to `outputs` values."""

    def __init__(self, layers: int, clip: int, vocab: int = VOCAB, outputs: int = SYMBOLS, **model):
        super().__init__()
        from nmt.config import ModelConfig
        from nmt.modeling.transformer import Transformer

        cfg = ModelConfig(**{"encoder_layers": layers, "decoder_layers": 1, "d_model": 64, "heads": 4, "ffn_dim": 256,
                             "dropout": 0.0, "clip": clip, "position": Position.relative.value, **model})
        self.transformer = Transformer(cfg, vocab)
        self.out = torch.nn.Linear(64, outputs)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(self.transformer.encode(tokens))  # (B, LENGTH, SYMBOLS)


def accuracy_by_distance(model: Tagger, seed: int, per_distance: int = 512) -> list[float]:
    generator = torch.Generator().manual_seed(10_000 + seed)
    accuracies = []
    with torch.no_grad():
        for d in range(1, MAX_DISTANCE + 1):
            tokens, targets = batch(per_distance, generator, d)
            keep = targets >= 0
            accuracies.append(float((model(tokens).argmax(-1) == targets)[keep].float().mean()))
    return accuracies


def reach(accuracies: list[float]) -> int:
    """The largest d such that every distance up to d is answered with accuracy >= THRESHOLD (0: not even d=1)."""
    d = 0
    while d < len(accuracies) and accuracies[d] >= THRESHOLD:
        d += 1
    return d


def fit(model: torch.nn.Module, updates: int, next_loss) -> float:
    """Adam over `updates` updates of next_loss(model) (warmup over the first 10%, then the linear decay to 0, as
    every synthetic study here trains); the last loss."""
    from nmt.training.optim import linear_decay_lr

    optimizer = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    for step in range(1, updates + 1):
        for group in optimizer.param_groups:
            group["lr"] = linear_decay_lr(step, 64, max(1, updates // 10), updates, scale=0.25)
        loss = next_loss(model)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


def copy_loss(generator: torch.Generator, length: int = LENGTH):
    """The copy task's training loss on a fresh batch of 64 sequences."""
    def loss(model):
        tokens, targets = batch(64, generator, length=length)
        return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten(), ignore_index=-100)
    return loss


def train_one(layers: int, clip: int, seed: int, updates: int, output: Path) -> str:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = Tagger(layers, clip)
    start = time.monotonic()
    final_loss = fit(model, updates, copy_loss(generator))
    accuracies = accuracy_by_distance(model.eval(), seed)
    result = {"layers": layers, "clip": clip, "seed": seed, "updates": updates, "final_loss": final_loss,
              "accuracy_by_distance": accuracies, "d_eff": reach(accuracies),
              "d_max_95": max([d for d, a in enumerate(accuracies, 1) if a >= THRESHOLD], default=0),
              "minutes": round((time.monotonic() - start) / 60, 2), "host": host(),
              "command": f"python -m experiments.reach --layers {layers} --clips {clip} --seeds {seed} --updates {updates}"}
    write_record(record_path(output, layers, clip, seed), result)
    return (f"L={layers} k={clip} seed {seed}: d_eff {result['d_eff']}, loss {result['final_loss']:.3f}, "
            f"{result['minutes']:.1f} min")


def record_path(output: Path, layers: int, clip: int, seed: int) -> Path:
    return output / f"L{layers}_k{clip}_seed{seed}.json"


def report(output: Path) -> str:
    """The heatmap (mean accuracy over seeds by L, k and d), the d_eff table and the fit of the three laws."""
    runs = read_records(output, "L*_k*_seed*.json")
    groups: dict = {}
    for run in runs:
        groups.setdefault((run["layers"], run["clip"]), []).append(run)
    layers, clips = sorted({k[0] for k in groups}), sorted({k[1] for k in groups})
    lines = ["| L \\ k | " + " | ".join(f"k={k}" for k in clips) + " |", "|---" * (len(clips) + 1) + "|"]
    for n_layers in layers:
        cells = []
        for k in clips:
            found = groups.get((n_layers, k), [])
            values = sorted(r["d_eff"] for r in found)
            worst = min((min(r["accuracy_by_distance"]) for r in found), default=None)
            cells.append(f"{'/'.join(str(v) for v in values)} ({worst:.2f})" if values else "")
        lines.append(f"| L={n_layers} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    laws = {"k*L": lambda n, k: k * n, "(k-1)*L": lambda n, k: (k - 1) * n, "k+L": lambda n, k: k + n,
            "k": lambda n, k: k}
    fits = {}
    for name, law in laws.items():  # mean absolute error of the law against each run's d_eff (capped at 24)
        errors = [abs(min(law(n, k), MAX_DISTANCE) - r["d_eff"]) for (n, k), rs in groups.items() for r in rs]
        fits[name] = statistics.mean(errors) if errors else float("nan")
    summary = {"runs": len(runs), "d_eff": {f"L{n}_k{k}": [r["d_eff"] for r in rs] for (n, k), rs in groups.items()},
               "law_mean_abs_error": fits}
    (output / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    heatmap(groups, layers, clips, output / "reach.png")
    text = (table + "\n\nd_eff of each seed (the lowest accuracy over d = 1..24 in any seed). "
            "Mean |law - d_eff| over the runs (laws capped at 24): "
            + ", ".join(f"{name} {err:.2f}" for name, err in sorted(fits.items(), key=lambda kv: kv[1])))
    (output / "table.md").write_text(text + "\n")
    return text


def heatmap(groups: dict, layers: list[int], clips: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(clips), figsize=(3.2 * len(clips), 3.0), sharey=True, squeeze=False)
    for ax, k in zip(axes[0], clips):
        rows = [[statistics.mean(r["accuracy_by_distance"][d] for r in groups[(n, k)]) if (n, k) in groups
                 else float("nan") for d in range(MAX_DISTANCE)] for n in layers]
        image = ax.imshow(rows, aspect="auto", vmin=0, vmax=1, cmap="viridis",
                          extent=(0.5, MAX_DISTANCE + 0.5, len(layers) - 0.5, -0.5))
        ax.set_title(f"k = {k}")
        ax.set_xlabel("distance d")
        ax.set_yticks(range(len(layers)), [f"L={n}" for n in layers])
        ax.axvline(k - 0.5, color="white", lw=0.8, ls="--")  # offsets >= k share one edge vector
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy (mean over seeds)")
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 3, 4, 6])
    parser.add_argument("--clips", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--output", type=Path, default=Path("results/reach"))
    parser.add_argument("--report", action="store_true", help="only the heatmap and tables from finished runs")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    if not args.report:
        cells = [Cell(record_path(args.output, n, k, s), (n, k, s, args.updates, args.output))
                 for s in args.seeds for k in args.clips for n in args.layers]
        cells.sort(key=lambda cell: -cell.args[0])  # the deepest (slowest) first, so the workers end together
        run_cells(train_one, cells, args.jobs)
    print(report(args.output))


if __name__ == "__main__":
    with ends_in_one_line("reach"):  # a stopped study: one line, exit 75
        main()
