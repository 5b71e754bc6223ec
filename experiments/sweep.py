"""Run the small-scale tables (the paper's Tables 1-3, the length study, the learning-rate check) on the bundled
Multi30k.

    python -m experiments.sweep table1|table2|table3|beyond|descendants|length|lr_check [--jobs N] [--seeds 1 2 3]
                                [--rows ROW ...] [--dry-run]

Every run of a table has the same recipe (configs/experiment/table1.yaml, or length.yaml: the `tiny` model, a budget in
updates, the average of the last checkpoints) and differs only in its row's overrides and seed. A run
writes results/<table>/<row>/seed<k>/{result.json, <split>.hyp.<tgt>, config.yaml, train.log, tensorboard/}
(split: test; valid for lr_check, whose choices are made on validation).
A run whose result.json exists is skipped, and a stopped one (SIGTERM, Ctrl-C: exit 75 after its checkpoint)
continues from its checkpoint, so a sweep run again resumes where it stopped; a run with exactly the same resolved
config in another table is copied from there, not trained twice.
Seeds are the outer loop: an unfinished sweep still has every row at its first seeds.
`--jobs N` runs N side by side (one CPU thread each on a CPU; on a GPU they share it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from experiments.grid import Cell, run_child, run_grid, write_record
from experiments.modes import ABSOLUTE, ALIBI, BOTH, BUCKETS, DESCENDANTS, LEARNED, NONE, RELATIVE, ROPE, T5
from nmt.checkpoints.folder_lock import take_lock
from nmt.cli import ends_in_one_line
from nmt.data.pipeline import prepare
from nmt.errors import EXIT_STOPPED, Stopped, UserError
from nmt.experiment import compose_job, find_same_run, run_identity
from nmt.runtime.precision import experiment_cpu_precision

ROOT = Path(__file__).resolve().parent.parent

EDGE_BUCKETS = ["model.edge_buckets=32", "model.clip=128"]  # T5's distances (32 buckets up to 128), Shaw's vectors
DESCENDANT_OVERRIDES = {RELATIVE: [], NONE: ["model.rel_key=false", "model.rel_value=false"]}
# the order the check runs them: Shaw's and the paper's baseline first, the control without positions last
LR_CHECK_MODES = [RELATIVE, ABSOLUTE, T5, ALIBI, ROPE, BOTH, LEARNED, NONE]


def lr_rows(position: str) -> dict[str, list[str]]:
    """A mode's rows of the learning-rate check: the shared rate, half and twice it; T5 also its bias tables at 10x."""
    mode = DESCENDANT_OVERRIDES.get(position, [f"model.position={position}"])
    rows = {f"en-de.{position}.lr{scale:g}": [*mode, f"optim.lr_scale={scale:g}"] for scale in (1.0, 0.5, 2.0)}
    if position == T5:
        rows["en-de.t5.bias_lr10"] = [*mode, "optim.bias_lr_scale=10"]
    return rows


# row name -> (pair, overrides). Table 3's "neither" is a relative model with both tables off: no position at all.
TABLES = {
    "table1": {"seeds": [1, 2, 3], "rows": {
        "en-de.absolute": ("en-de", ["model.position=absolute"]),
        "en-de.relative": ("en-de", []),
        "en-fr.absolute": ("en-fr", ["model.position=absolute"]),
        "en-fr.relative": ("en-fr", []),
    }},
    "table2": {"seeds": [1, 2], "rows": {f"k{k}": ("en-de", [f"model.clip={k}"]) for k in (0, 1, 2, 4, 16, 64)}},
    "table3": {"seeds": [1, 2, 3], "rows": {
        "key+value": ("en-de", []),
        "key": ("en-de", ["model.rel_value=false"]),
        "value": ("en-de", ["model.rel_key=false"]),
        "neither": ("en-de", ["model.rel_key=false", "model.rel_value=false"]),
    }},
    # Beyond the paper: learned absolute positions, sinusoids and relative together, one edge table for every head.
    # The absolute and relative rows are Table 1's runs (same identity: copied, not trained again).
    "beyond": {"seeds": [1, 2, 3], "rows": {
        "en-de.absolute": ("en-de", ["model.position=absolute"]),
        "en-de.relative": ("en-de", []),
        "en-de.learned": ("en-de", ["model.position=learned"]),
        "en-de.shared": ("en-de", ["model.share_heads=true"]),
        "en-de.both": ("en-de", ["model.position=both"]),
        "en-fr.absolute": ("en-fr", ["model.position=absolute"]),
        "en-fr.relative": ("en-fr", []),
        "en-fr.learned": ("en-fr", ["model.position=learned"]),
        "en-fr.both": ("en-fr", ["model.position=both"]),
    }},
    # Shaw against its descendants (T5's bucketed bias, ALiBi, RoPE) on Table 1's recipe, beside the position rows
    # run before: absolute and relative are Table 1's runs, learned and both Beyond's, En-De's none Table 3's
    # "neither" (copied, not trained again).
    # *.t5_lr10: T5 with 10x the learning rate for its bias tables (its best rate in lr_check, on validation), the
    # test of whether their few updates, not the scheme, put T5 below sinusoids.
    "descendants": {"seeds": [1, 2, 3], "rows": {
        **{f"{pair}.{position}": (pair, DESCENDANT_OVERRIDES.get(position, [f"model.position={position}"]))
           for pair in ("en-de", "en-fr")
           for position in DESCENDANTS},
        **{f"{pair}.{T5}_lr10": (pair, [f"model.position={T5}", "optim.bias_lr_scale=10"]) for pair in ("en-de", "en-fr")},
        # Shaw's edge vectors read by T5's log-spaced buckets (32 up to 128) instead of the clip at 16
        **{f"{pair}.{BUCKETS}": (pair, EDGE_BUCKETS) for pair in ("en-de", "en-fr")},
    }},
    # The learning rate of each position mode, chosen on validation (newstest-style: the valid split, never test):
    # Table 1's recipe at the shared rate, half and twice it, one seed; T5 also at 10x the rate for its bias tables.
    # Scored on valid, so no run here is a copy of a table's run (find_same_run matches the split too).
    "lr_check": {"seeds": [1], "split": "valid", "rows": {
        **{row: ("en-de", overrides) for position in LR_CHECK_MODES for row, overrides in lr_rows(position).items()},
        **{f"en-de.{BUCKETS}.lr{scale:g}": ("en-de", [*EDGE_BUCKETS, f"optim.lr_scale={scale:g}"])
           for scale in (1.0, 0.5, 2.0)},
    }},
    "length": {"seeds": [1, 2], "rows": {
        ABSOLUTE: ("en-de", [f"model.position={ABSOLUTE}"]),
        RELATIVE: ("en-de", []),
        LEARNED: ("en-de", [f"model.position={LEARNED}"]),  # beyond the paper: a table trained only up to ~12 words
        T5: ("en-de", [f"model.position={T5}"]),  # Shaw's descendants: do they extrapolate past the training lengths?
        ALIBI: ("en-de", [f"model.position={ALIBI}"]),
        ROPE: ("en-de", [f"model.position={ROPE}"]),
        BUCKETS: ("en-de", EDGE_BUCKETS),
    }},
}
KEPT = ("result.json", "config.yaml", "train.log")


def run_overrides(table: str, pair: str, row_overrides: list[str], seed: int, device: str) -> list[str]:
    precision = [f"train.precision={experiment_cpu_precision().value}"] if device == "cpu" else []
    recipe = "length" if table == "length" else "table1"  # Tables 1-3 share one recipe
    return ["model=tiny", f"data=multi30k_{pair.replace('-', '_')}", f"+experiment={recipe}", *row_overrides,
            f"train.seed={seed}", *precision]


def keep_results(run_dir: Path, target: Path, split: str) -> None:
    """The small files of a finished run, under results/ (checkpoints stay in outputs/); result.json last, as it
    marks the run done."""
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(run_dir.iterdir(), key=lambda path: path.name == "result.json"):
        if path.name == "result.json":
            shutil.copytree(run_dir / "tensorboard", target / "tensorboard", dirs_exist_ok=True)
        if path.name in KEPT or path.name.startswith(f"{split}.hyp."):
            shutil.copy2(path, target / path.name)


def one_run(table: str, row: str, pair: str, row_overrides: list[str], seed: int, args) -> str:
    """One run of the table (or a copy of the same run from another table); with args.dry_run what it would do,
    writing nothing."""
    target = args.results / table / row / f"seed{seed}"
    name = f"{table}/{row}/seed{seed}"
    overrides = run_overrides(table, pair, row_overrides, seed, args.device)
    key = run_identity(overrides)
    split = TABLES[table].get("split", "test")
    same = find_same_run(key, args.results, target, split)
    if args.dry_run:
        return f"{name}: " + (f"the same run as {same}, would copy" if same else f"would run {' '.join(overrides)}")
    if same is not None:
        result = json.loads((same / "result.json").read_text())
        result.update(table=table, row=row, same_run_as=str(same.relative_to(args.results.parent)))
        shutil.copytree(same, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("result.json"))
        write_record(target / "result.json", result, indent=2)  # last: the record says the copy is whole
        return f"{name}: the same run as {same}, copied"
    run_dir = args.outputs / table / row / f"seed{seed}"
    threads = [f"train.threads={args.threads}"] if args.device == "cpu" else []
    command = [sys.executable, "-m", "nmt.experiment", "--output", str(run_dir), "--split", split, *overrides, *threads,
               f"train.device={args.device}"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    start = time.monotonic()
    with open(run_dir.parent / f"seed{seed}.log", "a") as log:  # a continued run's log follows the stopped one's
        code = run_child(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    if code == EXIT_STOPPED:
        raise Stopped(f"stopped with a checkpoint in {run_dir}: the same sweep continues it")
    if code != 0:
        raise UserError(f"{name}: exit {code}, see {run_dir.parent / f'seed{seed}.log'}")
    result = json.loads((run_dir / "result.json").read_text())
    shown = [os.path.relpath(a, ROOT) if a == str(run_dir) else a for a in command[3:]]
    result.update(table=table, row=row, identity=key, command=" ".join(["python -m nmt.experiment", *shown]))
    write_record(run_dir / "result.json", result, indent=2)
    keep_results(run_dir, target, split)
    return f"{name}: BLEU {result['bleu']:.2f} in {(time.monotonic() - start) / 60:.1f} min"


CORES_LOCK = Path(tempfile.gettempdir()) / "relnmt-sweep-cores.lock"  # machine-wide: one sweep owns the cores
_cores = None  # the open lock file, held until the process ends (take_lock: never by its workers, never after a kill)


def claim_the_cores() -> str | None:
    """Take the machine's cores for this sweep; None when taken, else who holds them."""
    global _cores
    if _cores is None:
        _cores, holder = take_lock(CORES_LOCK)
        return holder or None
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("table", choices=sorted(TABLES))
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side")
    parser.add_argument("--seeds", type=int, nargs="+", help="default: the table's own seed list")
    parser.add_argument("--rows", nargs="+", help="default: every row of the table")
    parser.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when available")
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--outputs", type=Path, default=ROOT / "outputs" / "sweep")
    parser.add_argument("--threads", type=int, default=0, help="CPU threads per run; 0 = cores / jobs, and no "
                        "other sweep may run on this machine meanwhile")
    parser.add_argument("--dry-run", action="store_true", help="say what would run, run nothing")
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    # One thread per job on a CPU (2 jobs on 2 cores), all of them for a single job: the machine's cores, so a
    # second such sweep is refused (two ran 4x slower); --threads shares them knowingly.
    if not args.threads and args.device == "cpu" and not args.dry_run:
        holder = claim_the_cores()
        if holder is not None:
            raise UserError(f"another sweep uses this machine's cores ({holder}): wait for it, or give --threads N "
                            "to both to share them (threads x jobs of all sweeps at most the cores)")
    args.threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    table = TABLES[args.table]
    unknown = set(args.rows or []) - set(table["rows"])
    if unknown:
        parser.error(f"{args.table} has no row {', '.join(sorted(unknown))}; its rows: {', '.join(table['rows'])}")
    runs = [(row, pair, overrides, seed) for seed in (args.seeds or table["seeds"])
            for row, (pair, overrides) in table["rows"].items() if not args.rows or row in args.rows]
    if not args.dry_run:  # once, here: parallel jobs preparing the same folder would race
        for pair in sorted({pair for _, pair, _, _ in runs}):
            job, _ = compose_job([*run_overrides(args.table, pair, [], 1, args.device), "train.output_dir=-"])
            prepare(job.data)
    cells = [Cell(args.results / args.table / row / f"seed{seed}" / "result.json", (args.table, row, *r, seed, args))
             for row, *r, seed in runs]
    if args.dry_run:
        for cell in cells:
            table, row, *_, seed, _ = cell.args
            print(f"{table}/{row}/seed{seed}: done already" if cell.record.is_file() else one_run(*cell.args))
        return 0
    done = len(cells) - len(run_grid(one_run, cells, args.jobs))
    print(f"{done} of {len(cells)} runs were done already")
    return 0


if __name__ == "__main__":
    with ends_in_one_line("sweep"):
        sys.exit(main())
