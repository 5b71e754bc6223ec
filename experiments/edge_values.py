"""Where does a^V matter? The paper found the value edges (Eq. 3) useless for translation (Table 3) and guessed they
matter "for tasks where information about the edge types selected by a given attention head is useful to downstream
layers". Two synthetic tasks, relative positions only (clip 16), a^K only, a^V only, both and neither:

    python -m experiments.edge_values [--tasks sum marker] [--seeds 1 2] [--updates 1500] [--layers 1 2] [--jobs 2]
                                  [--output results/edge_values]
    python -m experiments.edge_values --report [--output results/edge_values]

- `sum`, the issue's example: y_i = sum over offsets o in -3..3 of w(o) x_{i+o}, a fixed kernel w over the
  sequence's values (x = symbol / 15 - 1/2, zero outside the sequence), a regression; reported as R^2 on fresh
  sequences. Here position decides *how much* of each neighbour to take: what attention logits do (a^K).
- `marker`: 15 random symbols and one marker at a random place; at every position the answer is the marker's
  offset j* - i (31 classes), reported as accuracy. Here a head's target is found by content (the marker), and what
  the answer needs is *where* it was: the edge type the head selected, the paper's guess for a^V.
Sequences of 16, L layers (d = 64, 4 heads), --updates updates of 64 sequences (a budget in updates). One layer
isolates what each edge set does within a head; two show what depth recovers (a layer's a^V also tells a token
where it sits, from the offsets it sees up to the sequence's ends, which the next layer's logits can use). Each
(task, edges, L, seed) run writes OUTPUT/<task>_<edges>_L<L>_seed<s>.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from experiments.grid import Cell, read_records, run_cells, write_record
from experiments.reach import FIRST_TOKEN, Tagger, fit
from nmt.cli import ends_in_one_line
from nmt.machine import host

LENGTH, SYMBOLS = 16, 16
KERNEL = {-3: 0.5, -2: -1.0, -1: 2.0, 0: 1.0, 1: -0.5, 2: 0.25, 3: 1.5}  # w(o): uneven, so no offset is like another
EDGES = {"both": (True, True), "key": (True, False), "value": (False, True), "neither": (False, False)}
TASKS = ("sum", "marker")


def sum_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    symbols = torch.randint(0, SYMBOLS, (n, LENGTH), generator=generator)
    x = F.pad(symbols / (SYMBOLS - 1) - 0.5, (3, 3))  # zero outside the sequence
    y = sum(w * x[:, 3 + o : 3 + o + LENGTH] for o, w in KERNEL.items())
    return FIRST_TOKEN + symbols, y


def marker_batch(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    symbols = torch.randint(0, SYMBOLS - 1, (n, LENGTH), generator=generator)
    where = torch.randint(0, LENGTH, (n,), generator=generator)
    symbols[torch.arange(n), where] = SYMBOLS - 1  # the marker
    offsets = where[:, None] - torch.arange(LENGTH)[None, :]  # j* - i in -(LENGTH-1)..LENGTH-1
    return FIRST_TOKEN + symbols, offsets + LENGTH - 1


def task_loss(task: str, generator: torch.Generator):
    def loss(model):
        if task == "sum":
            tokens, y = sum_batch(64, generator)
            return F.mse_loss(model(tokens).squeeze(-1), y)
        tokens, target = marker_batch(64, generator)
        return F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
    return loss


def score(model: Tagger, task: str, seed: int) -> float:
    """R^2 (sum) or accuracy (marker) on 2,048 fresh sequences."""
    generator = torch.Generator().manual_seed(30_000 + seed)
    with torch.no_grad():
        if task == "sum":
            tokens, y = sum_batch(2048, generator)
            return float(1 - F.mse_loss(model(tokens).squeeze(-1), y) / y.var())
        tokens, target = marker_batch(2048, generator)
        return float((model(tokens).argmax(-1) == target).float().mean())


# What each of the marker task's shortcut rules reads of a place: nothing, the place i, or the token there
MARKER_RULES = {"constant": torch.zeros_like, "position": lambda tokens: torch.arange(LENGTH).expand_as(tokens),
                "content": lambda tokens: tokens}


def marker_shortcuts(seed: int) -> dict:
    """The marker task's shortcut check on score()'s evaluation batch of `seed`: the accuracy of answering each
    place with the commonest answer among the places that share what a rule reads (MARKER_RULES): "constant"
    (nothing), "position" (the place i; the marker is anywhere, so positions alone give about 1/16), "content" (the
    token: the marker itself answers 0, any other symbol says nothing of where the marker is); "best", the highest.
    A model beats these only by reading offsets."""
    tokens, target = marker_batch(2048, torch.Generator().manual_seed(30_000 + seed))

    def commonest_by(key: torch.Tensor) -> float:
        return sum(int(torch.bincount(target[key == k]).max()) for k in key.unique()) / target.numel()
    found = {rule: commonest_by(read(tokens)) for rule, read in MARKER_RULES.items()}
    return {**found, "best": max(found.values())}


def run_one(task: str, edges: str, seed: int, layers: int, updates: int, output: Path) -> str:
    torch.manual_seed(seed)
    rel_key, rel_value = EDGES[edges]
    model = Tagger(layers, 16, vocab=FIRST_TOKEN + SYMBOLS, outputs=1 if task == "sum" else 2 * LENGTH - 1,
                   rel_key=rel_key, rel_value=rel_value)
    start = time.monotonic()
    final_loss = fit(model, updates, task_loss(task, torch.Generator().manual_seed(seed)))
    result = {"task": task, "edges": edges, "seed": seed, "layers": layers, "updates": updates,
              "metric": "R^2" if task == "sum" else "accuracy", "score": score(model.eval(), task, seed),
              "final_loss": final_loss, "minutes": round((time.monotonic() - start) / 60, 2), "host": host(),
              "command": f"python -m experiments.edge_values --tasks {task} --edges {edges} --seeds {seed} "
                         f"--layers {layers} --updates {updates}"}
    write_record(record_path(output, task, edges, layers, seed), result)
    return f"{task} {edges} L={layers} seed {seed}: {result['metric']} {result['score']:.3f} ({result['minutes']:.1f} min)"


def record_path(output: Path, task: str, edges: str, layers: int, seed: int) -> Path:
    return output / f"{task}_{edges}_L{layers}_seed{seed}.json"


def report(output: Path) -> str:
    runs: dict[tuple[str, str, int], list[dict]] = {}
    for run in read_records(output, "*_seed*.json"):
        runs.setdefault((run["task"], run["edges"], run["layers"]), []).append(run)
    columns = sorted({(task, layers) for task, _, layers in runs}, key=lambda c: (TASKS.index(c[0]), c[1]))
    lines = ["| edges | " + " | ".join(f"{t}, L={n} ({'R^2' if t == 'sum' else 'accuracy'})" for t, n in columns)
             + " |", "|---|" + "---|" * len(columns)]
    for edges in EDGES:
        cells = []
        for task, layers in columns:
            scores = [r["score"] for r in runs.get((task, edges, layers), [])]
            cells.append(f"{statistics.mean(scores):.3f} ({' / '.join(f'{s:.3f}' for s in scores)})" if scores else "")
        lines.append(f"| {edges} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n\nMean over seeds (each seed's value in brackets)."
    (output / "table.md").write_text(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--edges", nargs="+", default=list(EDGES), choices=list(EDGES))
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--updates", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=2, help="runs side by side, one thread each")
    parser.add_argument("--output", type=Path, default=Path("results/edge_values"))
    parser.add_argument("--report", action="store_true", help="only the table from finished runs")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    if not args.report:
        run_cells(run_one, [Cell(record_path(args.output, t, e, n, s), (t, e, s, n, args.updates, args.output))
                           for s in args.seeds for n in args.layers for t in args.tasks for e in args.edges], args.jobs)
    print(report(args.output))


if __name__ == "__main__":
    with ends_in_one_line("edge_values"):  # a stopped study: one line, exit 75
        main()
