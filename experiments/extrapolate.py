"""Length extrapolation past anything in Multi30k: every position mode on experiments/reach.py's copy-at-distance task,
trained on sequences of 40 symbols and evaluated on 40, 80, 160 and 320.

    python -m experiments.extrapolate [--modes relative:2 relative:8 relative:16 t5 alibi rope absolute none]
                                  [--seeds 1 2] [--updates 1500] [--layers 3] [--jobs 2] [--output results/extrapolate]
    python -m experiments.extrapolate --report [--output results/extrapolate]   # the table and the plot from the runs

Why this task: the answer at position j is the symbol d places to its left (d = 1..24, carried by every token, as
in reach.py), at every length. A longer sequence asks nothing new, only more of the same at positions and lengths
never seen in training: accuracy at 80, 160 and 320 against accuracy at 40 is extrapolation and nothing else. A
model that located its answer by offset answers a long sequence as well as a short one; one that located it by
absolute position meets rows it never trained. The task also needs resolution at a distance: telling d = 20 from
d = 21 is what T5's logarithmic buckets give up (distances 16 to 128 share 8 buckets per direction at the default
32 buckets), and what Shaw's clipping gives up beyond k within one layer. Modes: `relative:K` (Shaw, clipping
distance K), `t5`, `alibi`, `rope`, `absolute` (sinusoids) and `none` (no position at all: the floor).

Each (mode, seed) run trains --layers encoder layers (d = 64, 4 heads) for --updates updates of 64 sequences of 40
(a budget in updates) and writes OUTPUT/<mode>_seed<s>.json: accuracy at each evaluation length over d = 1..24 (128
fresh sequences per d and length), and by d.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from experiments.grid import Cell, read_records, run_grid, write_record
from experiments.reach import LENGTH, MAX_DISTANCE, Tagger, batch, copy_loss, fit
from nmt.cli import ends_in_one_line

MODES = ["relative:2", "relative:8", "relative:16", "t5", "alibi", "rope", "absolute", "none"]
EVAL_LENGTHS = [LENGTH, 2 * LENGTH, 4 * LENGTH, 8 * LENGTH]
PER_DISTANCE = 128


def model_for(mode: str, layers: int) -> Tagger:
    position, _, clip = mode.partition(":")
    return Tagger(layers, int(clip or 16), position=position)


def accuracy(model: Tagger, length: int, seed: int) -> list[float]:
    """Accuracy by distance d = 1..24 on fresh sequences of `length` symbols."""
    generator = torch.Generator().manual_seed(20_000 + seed)
    found = []
    with torch.no_grad():
        for d in range(1, MAX_DISTANCE + 1):
            tokens, targets = batch(PER_DISTANCE, generator, d, length)
            keep = targets >= 0
            found.append(float((model(tokens).argmax(-1) == targets)[keep].float().mean()))
    return found


def run_one(mode: str, seed: int, layers: int, updates: int, output: Path) -> str:
    torch.manual_seed(seed)
    model = model_for(mode, layers)
    start = time.monotonic()
    final_loss = fit(model, updates, copy_loss(torch.Generator().manual_seed(seed)))
    model.eval()
    by_length = {str(n): accuracy(model, n, seed) for n in EVAL_LENGTHS}
    result = {"mode": mode, "seed": seed, "layers": layers, "updates": updates, "train_length": LENGTH,
              "final_loss": final_loss, "accuracy": {n: statistics.mean(a) for n, a in by_length.items()},
              "accuracy_by_distance": by_length, "minutes": round((time.monotonic() - start) / 60, 2),
              "command": f"python -m experiments.extrapolate --modes {mode} --seeds {seed} --layers {layers} "
                         f"--updates {updates}"}
    write_record(record_path(output, mode, seed), result)
    return (f"{mode} seed {seed}: " + ", ".join(f"{n}: {a:.3f}" for n, a in result["accuracy"].items())
            + f" ({result['minutes']:.1f} min)")


def record_path(output: Path, mode: str, seed: int) -> Path:
    return output / f"{mode.replace(':', '')}_seed{seed}.json"


def report(output: Path) -> str:
    """Mean accuracy by evaluation length per mode (seeds' values), and the far distances' accuracy."""
    runs: dict[str, list[dict]] = {}
    for run in read_records(output, "*_seed*.json"):
        runs.setdefault(run["mode"], []).append(run)
    modes = [m for m in MODES if m in runs] + sorted(set(runs) - set(MODES))
    lengths = [str(n) for n in EVAL_LENGTHS]
    lines = ["| mode | seeds | " + " | ".join(f"length {n}" for n in lengths)
             + " | d 1-8 / 17-24 at 40 | d 1-8 / 17-24 at 320 |", "|---|---|" + "---|" * (len(lengths) + 2)]
    for mode in modes:
        rs = runs[mode]
        cells = [f"{statistics.mean(r['accuracy'][n] for r in rs):.3f}" for n in lengths]

        def near_far(n: str) -> str:
            near = statistics.mean(a for r in rs for a in r["accuracy_by_distance"][n][:8])
            far = statistics.mean(a for r in rs for a in r["accuracy_by_distance"][n][16:])
            return f"{near:.2f} / {far:.2f}"

        lines.append(f"| {mode} | {len(rs)} | " + " | ".join(cells) + f" | {near_far(lengths[0])} | "
                     f"{near_far(lengths[-1])} |")
    text = "\n".join(lines)
    (output / "table.md").write_text(text + "\n")
    plot(runs, modes, lengths, output / "extrapolate.png")
    return text


def plot(runs: dict, modes: list[str], lengths: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for mode in modes:
        ax.plot([int(n) for n in lengths], [statistics.mean(r["accuracy"][n] for r in runs[mode]) for n in lengths],
                marker="o", label=mode)
    ax.axvline(LENGTH, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(n) for n in lengths], lengths)
    ax.set_xlabel("evaluation length (trained at 40)")
    ax.set_ylabel("accuracy, d = 1..24")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=MODES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--output", type=Path, default=Path("results/extrapolate"))
    parser.add_argument("--report", action="store_true", help="only the table and plot from finished runs")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    if not args.report:
        run_grid(run_one, [Cell(record_path(args.output, m, s), (m, s, args.layers, args.updates, args.output))
                           for s in args.seeds for m in args.modes], args.jobs)
    print(report(args.output))


if __name__ == "__main__":
    with ends_in_one_line("extrapolate"):  # a stopped grid: one line, exit 75
        main()
