"""Validation curves of a table's rows from their TensorBoard logs: one PNG per table.

    python -m experiments.plot_curves table1 [table2 ...] [--results results]

Reads the TensorBoard logs of the table's cells (results/cells, as results/tables.yaml declares the table's rows:
nmt/lab/page.py page_table) and draws validation
loss and greedy validation BLEU (on the first 200 validation sentences) against updates, the mean over
seeds with a band from the lowest to the highest seed. Writes results/<table>/curves.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CURVES = (("valid/loss", "validation loss (label-smoothed)"), ("valid/bleu_greedy", "validation BLEU (greedy, 200 sent.)"))


def read_scalars(run: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = set(events.Tags()["scalars"])
    return {tag: (np.array([e.step for e in events.Scalars(tag)]), np.array([e.value for e in events.Scalars(tag)]))
            for tag, _ in CURVES if tag in tags}


def plot_table(results: Path, table: str) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from nmt.lab.page import page_table

    rows = {}
    for row, seeds in sorted(page_table(results, table, rescore=False).items()):
        runs = [read_scalars(seeds[s]["folder"]) for s in sorted(seeds) if (seeds[s]["folder"] / "tensorboard").is_dir()]
        if runs:
            rows[row] = runs
    if not rows:
        return None
    fig, axes = plt.subplots(1, len(CURVES), figsize=(6 * len(CURVES), 4))
    for ax, (tag, label) in zip(axes, CURVES):
        for name, runs in rows.items():
            curves = [run[tag] for run in runs if tag in run]
            if not curves:
                continue
            steps = curves[0][0]
            values = np.stack([values for s, values in curves if len(s) == len(steps)])
            line, = ax.plot(steps, values.mean(0), marker=".", label=f"{name} (n={len(values)})")
            ax.fill_between(steps, values.min(0), values.max(0), color=line.get_color(), alpha=0.15)
        ax.set_xlabel("updates")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylim(top=min(6.0, axes[0].get_ylim()[1]))
    axes[-1].legend(fontsize=8)
    fig.suptitle(table)
    fig.tight_layout()
    output = results / table / "curves.png"
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=100)
    return output


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="+")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    args = parser.parse_args()
    for table in args.tables:
        output = plot_table(args.results, table)
        print(f"wrote {output}" if output else f"{table}: no cells with TensorBoard logs in {args.results / 'cells'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
