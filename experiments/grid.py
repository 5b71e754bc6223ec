"""The one runner of every grid of runs here (the sweeps of the tables, the synthetic studies): cells -> a pool of
processes -> one JSON record per cell -> the study's table.

A cell is done when its record exists, and a record is written whole (a temporary file renamed into place), so a
grid stopped half-way resumes where it stopped and never takes a half-written record for a finished run. A cell that
fails is reported and costs only itself.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Cell:
    record: Path  # the run's record: its presence means the run is done
    args: tuple  # what the study's run function is called with


def one_thread(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def run_grid(run: Callable[..., str], cells: Iterable[Cell], jobs: int, threads: int = 1) -> list[Cell]:
    """run(*cell.args) for every cell without a record, `jobs` side by side with `threads` CPU threads each (one each:
    2 jobs on 2 cores use the machine without oversubscribing it), printing each run's line as it ends; the cells
    that were to run."""
    todo = [cell for cell in cells if not cell.record.is_file()]
    with ProcessPoolExecutor(max(1, jobs), initializer=one_thread, initargs=(threads,)) as pool:
        futures = {pool.submit(run, *cell.args): cell for cell in todo}
        for done in as_completed(futures):
            try:
                print(done.result(), flush=True)
            except Exception as err:  # one broken run must not stop the others
                print(f"{futures[done].record}: FAILED ({type(err).__name__}: {err})", flush=True)
    return todo


def write_record(path: Path, record: dict, indent: int = 1) -> None:
    """The record as indented JSON, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(record, indent=indent) + "\n")
    partial.replace(path)


def read_records(folder: Path, pattern: str) -> list[dict]:
    """The records under `folder` whose names match `pattern`, in name order."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob(pattern))]
