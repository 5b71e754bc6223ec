"""Length extrapolation past anything in Multi30k: every position mode on two synthetic tasks, trained on sequences
of 40 symbols and evaluated on 40, 80, 160 and 320.

    python -m experiments.extrapolate [--task offset|repeat] [--modes relative:2 relative:8 relative:16 buckets:128
                                  t5 alibi rope absolute none] [--seeds 1 2] [--updates N] [--layers 3] [--jobs 2] [--output DIR]
    python -m experiments.extrapolate --report [--task offset|repeat] [--output DIR]   # the table and the plot

--task offset (the default; OUTPUT results/extrapolate) is experiments/reach.py's copy-at-distance task: its
offsets are bounded (at most 24) at every length, so it measures invariance to length at offsets seen in training.
--task repeat (OUTPUT results/extrapolate_repeat) is the test of dependencies longer than any in training, an
induction task: a sequence is N / 2 distinct random symbols (of 256), then the same symbols in a random order, each
written as its query token (a token id of its own: a query is told from a first-half symbol by content); the answer
at the query of s is the symbol that followed s in the first half (none for the first half's last symbol). Solving
it takes both halves of an induction mechanism: the offset-1 neighbour of each first-half symbol, and a match of
the query's content against the first half at whatever distance it lies (up to N - 1: 39 in training, 319 at 320).
No fixed offset and no fixed position holds the answer (experiments/shortcuts.py: the best fixed offset holds
about 1 / (N / 2 - 1) of the answers, chance among the first half's successors; each run records these shares). A
model without position (`none`) cannot tell which symbol follows which. Chance: 1 / (N / 2 - 1) for a model that
picks one of the first half's successors. Its default budget is 2,000 updates, chosen on the validation set at the
training length: relative:2 stays at chance at 1,500 (0.050), learns it at 2,000 (0.998, seed 1).

The offset task:
Why this task: the answer at position j is the symbol d places to its left (d = 1..24, carried by every token, as
in reach.py), at every length. A longer sequence asks nothing new, only more of the same at positions and lengths
never seen in training: accuracy at 80, 160 and 320 against accuracy at 40 is extrapolation and nothing else. A
model that located its answer by offset answers a long sequence as well as a short one; one that located it by
absolute position meets rows it never trained. The task also needs resolution at a distance: telling d = 20 from
d = 21 is what T5's logarithmic buckets give up (distances 16 to 128 share 8 buckets per direction at the default
32 buckets), and what Shaw's clipping gives up beyond k within one layer. Modes: `relative:K` (Shaw, clipping
distance K), `buckets:K` (Shaw's vectors read by 32 of T5's log-spaced buckets up to K: model.edge_buckets), `t5`, `alibi`, `rope`, `absolute` (sinusoids) and `none` (no position at all: the floor).

Each (mode, seed) run trains --layers encoder layers (d = 64, 4 heads) for --updates updates of 64 sequences of 40
(a budget in updates) and writes OUTPUT/<mode>_seed<s>.json: accuracy at each evaluation length (offset: over
d = 1..24, 128 fresh sequences per d and length, and by d; repeat: over the queries of 512 fresh sequences, and on a
validation set at the training length), and the shortcut shares of the evaluation batches at every length.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.grid import Cell, read_records, run_cells, write_record
from experiments.modes import ABSOLUTE, ALIBI, BUCKETS, NONE, RELATIVE, ROPE, T5
from experiments.reach import FIRST_TOKEN, LENGTH, MAX_DISTANCE, Tagger, batch, copy_loss, fit, offset_symbols
from experiments.shortcuts import shortcut_shares
from nmt.cli import ends_in_one_line
from nmt.machine import host

MODES = [f"{RELATIVE}:2", f"{RELATIVE}:8", f"{RELATIVE}:16", f"{BUCKETS}:128", T5, ALIBI, ROPE, ABSOLUTE, NONE]
EDGE_BUCKETS = 32  # buckets:K: Shaw's edge vectors read by 32 of T5's log-spaced buckets up to K
EVAL_LENGTHS = [LENGTH, 2 * LENGTH, 4 * LENGTH, 8 * LENGTH]
PER_DISTANCE = 128
REPEAT_SYMBOLS = 256  # distinct symbols: the first half of the longest sequence (160) never repeats one
REPEAT_EVAL = 512  # fresh sequences per evaluation length
UPDATES = {"offset": 1500, "repeat": 2000}
OUTPUTS = {"offset": Path("results/extrapolate"), "repeat": Path("results/extrapolate_repeat")}


def model_for(mode: str, layers: int, task: str = "offset") -> Tagger:
    position, _, clip = mode.partition(":")
    sizes = {"vocab": FIRST_TOKEN + 2 * REPEAT_SYMBOLS, "outputs": REPEAT_SYMBOLS} if task == "repeat" else {}
    if position == BUCKETS:
        return Tagger(layers, int(clip or 128), position=RELATIVE, edge_buckets=EDGE_BUCKETS, **sizes)
    return Tagger(layers, int(clip or 16), position=position, **sizes)


def repeat_batch(n: int, generator: torch.Generator, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens (n, length), targets (n, length)): the first half N/2 distinct random symbols (of REPEAT_SYMBOLS); the
    second half the same symbols in a random order, each written as its query token (id + REPEAT_SYMBOLS: told apart
    from the first half by content); the target at the query of s is the symbol that followed s in the first half
    (-100 in the first half, and at the query of the first half's last symbol, which has no successor there)."""
    half = length // 2
    first = torch.rand(n, REPEAT_SYMBOLS, generator=generator).argsort(-1)[:, :half]  # distinct symbols per row
    order = torch.rand(n, half, generator=generator).argsort(-1)  # the queries: first-half indices, shuffled
    successor = torch.cat([first[:, 1:], torch.full((n, 1), -100)], 1)  # of first[:, i]: first[:, i + 1]
    targets = torch.cat([torch.full((n, half), -100), successor.gather(1, order)], 1)
    tokens = torch.cat([first, REPEAT_SYMBOLS + first.gather(1, order)], 1)
    return FIRST_TOKEN + tokens, targets


def repeat_symbols(tokens: torch.Tensor) -> torch.Tensor:
    """The symbol each token of repeat_batch names (a query names the symbol it asks about): what a head could copy."""
    return (tokens - FIRST_TOKEN) % REPEAT_SYMBOLS


def repeat_loss(generator: torch.Generator):
    def loss(model):
        tokens, targets = repeat_batch(64, generator, LENGTH)
        return F.cross_entropy(model(tokens).flatten(0, 1), targets.flatten(), ignore_index=-100)
    return loss


def repeat_accuracy(model: Tagger, length: int, seed: int) -> float:
    """Accuracy over the queries of REPEAT_EVAL fresh sequences of `length` drawn from generator seed `seed` (run_one:
    20_000 + the run's seed for the test at each length, 30_000 + it for the validation set at the training length,
    on which the budget was chosen)."""
    tokens, targets = repeat_batch(REPEAT_EVAL, torch.Generator().manual_seed(seed), length)
    keep = targets >= 0
    with torch.no_grad():
        predicted = torch.cat([model(t).argmax(-1) for t in tokens.split(64)])
    return float((predicted == targets)[keep].float().mean())


def shortcuts(task: str, length: int, seed: int, beyond: int | None = None) -> dict:
    """The shortcut shares (experiments/shortcuts.py) of the task's evaluation batch at `length` (with `beyond`,
    the commonest symbol that many places or more to the left too)."""
    generator = torch.Generator().manual_seed(20_000 + seed)
    if task == "repeat":
        tokens, targets = repeat_batch(REPEAT_EVAL, generator, length)
        return shortcut_shares(repeat_symbols(tokens), targets, beyond=beyond)
    tokens, targets = batch(PER_DISTANCE * MAX_DISTANCE, generator, None, length)
    return shortcut_shares(offset_symbols(tokens), targets, beyond=beyond)


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


def run_one(mode: str, seed: int, layers: int, updates: int, output: Path, task: str = "offset") -> str:
    torch.manual_seed(seed)
    model = model_for(mode, layers, task)
    start = time.monotonic()
    generator = torch.Generator().manual_seed(seed)
    final_loss = fit(model, updates, repeat_loss(generator) if task == "repeat" else copy_loss(generator))
    model.eval()
    if task == "repeat":
        by_length = {}
        mean_accuracy = {str(n): repeat_accuracy(model, n, 20_000 + seed) for n in EVAL_LENGTHS}
        validation = {"validation_accuracy": repeat_accuracy(model, LENGTH, 30_000 + seed)}
    else:
        by_length = {str(n): accuracy(model, n, seed) for n in EVAL_LENGTHS}
        mean_accuracy = {n: statistics.mean(a) for n, a in by_length.items()}
        validation = {}
    result = {"task": task, "mode": mode, "seed": seed, "layers": layers, "updates": updates, "train_length": LENGTH,
              "final_loss": final_loss, **validation, "accuracy": mean_accuracy,
              "shortcut_shares": {str(n): shortcuts(task, n, seed) for n in EVAL_LENGTHS},
              **({"accuracy_by_distance": by_length} if by_length else {}),
              "minutes": round((time.monotonic() - start) / 60, 2), "host": host(),
              "command": f"python -m experiments.extrapolate --task {task} --modes {mode} --seeds {seed} "
                         f"--layers {layers} --updates {updates}"}
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
    order = ["relative:1", *MODES]
    modes = [m for m in order if m in runs] + sorted(set(runs) - set(order))
    lengths = [str(n) for n in EVAL_LENGTHS]
    by_distance = all("accuracy_by_distance" in r for rs in runs.values() for r in rs)  # the offset task
    lines = ["| mode | seeds | " + " | ".join(f"length {n}" for n in lengths)
             + (" | d 1-8 / 17-24 at 40 | d 1-8 / 17-24 at 320 |" if by_distance
                else " | validation at 40, each seed | each seed at 40 | each seed at 320 |"),
             "|---|---|" + "---|" * (len(lengths) + (2 if by_distance else 3))]
    for mode in modes:
        rs = runs[mode]
        cells = [f"{statistics.mean(r['accuracy'][n] for r in rs):.3f}" for n in lengths]
        if not by_distance:
            ordered = sorted(rs, key=lambda r: r["seed"])
            seeds = [" / ".join(f"{r['validation_accuracy']:.3f}" for r in ordered)] + [
                " / ".join(f"{r['accuracy'][n]:.3f}" for r in ordered) for n in (lengths[0], lengths[-1])]
            lines.append(f"| {mode} | {len(rs)} | " + " | ".join(cells + seeds) + " |")
            continue

        def near_far(n: str) -> str:
            near = statistics.mean(a for r in rs for a in r["accuracy_by_distance"][n][:8])
            far = statistics.mean(a for r in rs for a in r["accuracy_by_distance"][n][16:])
            return f"{near:.2f} / {far:.2f}"

        lines.append(f"| {mode} | {len(rs)} | " + " | ".join(cells) + f" | {near_far(lengths[0])} | "
                     f"{near_far(lengths[-1])} |")
    task = "offset" if by_distance else "repeat"
    shares = {n: shortcuts(task, int(n), seed=1) for n in lengths}
    text = "\n".join(lines) + (
        "\n\nShortcut check (experiments/shortcuts.py, seed 1's evaluation batches): the best share of the answers "
        "held by one fixed offset (any within the sequence) / by one fixed position, at " + ", ".join(
            f"{n}: {v['offset']:.3f} (offset {v['best_offset']:+d}) / {v['position']:.3f}" for n, v in shares.items())
        + (f"; a random symbol matches 1/16 = {1 / 16:.3f}, and each d holds about 1/24 of the answers" if by_distance
           else "; chance 1 / (N/2 - 1): " + ", ".join(f"{1 / (int(n) // 2 - 1):.3f}" for n in lengths)) + ".")
    (output / "table.md").write_text(text + "\n")
    plot(runs, modes, lengths, output / "extrapolate.png",
         "accuracy, d = 1..24" if by_distance else "accuracy, second halves")
    return text


def plot(runs: dict, modes: list[str], lengths: list[str], path: Path, ylabel: str = "accuracy, d = 1..24") -> None:
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
    ax.set_ylabel(ylabel)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", nargs="+", default=MODES)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--updates", type=int, help="default: 1500 (offset), 2000 (repeat: at 1500 relative:2 "
                        "stays at chance on the validation set at 40)")
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--task", choices=sorted(OUTPUTS), default="offset")
    parser.add_argument("--output", type=Path, help="default: results/extrapolate (offset), results/extrapolate_repeat")
    parser.add_argument("--report", action="store_true", help="only the table and plot from finished runs")
    args = parser.parse_args()
    args.output = args.output or OUTPUTS[args.task]
    args.updates = args.updates or UPDATES[args.task]
    args.output.mkdir(parents=True, exist_ok=True)
    others = {r.get("task", "offset") for r in read_records(args.output, "*_seed*.json")} - {args.task}
    if others:  # a record is found by its mode and seed only: another task's would pass for this one's
        raise SystemExit(f"{args.output} holds runs of --task {', '.join(sorted(others))}; give this task its own "
                         f"--output")
    if not args.report:
        run_cells(run_one, [Cell(record_path(args.output, m, s),
                                (m, s, args.layers, args.updates, args.output, args.task))
                           for s in args.seeds for m in args.modes], args.jobs)
    print(report(args.output))


if __name__ == "__main__":
    with ends_in_one_line("extrapolate"):  # a stopped study: one line, exit 75
        main()
