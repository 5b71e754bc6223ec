"""A synthetic study's grid: its cells run N at a time by joblib (loky worker processes, one CPU thread each), one
JSON record per cell, read back for the study's table.

A cell is done when its record exists, and a record is written whole (a temporary file renamed into place), so a
study stopped half-way resumes at the first cell without a record and never takes a half-written record for a
finished run. A cell that fails costs only itself: the others run, then the study ends in one line naming every
failed cell (exit 2). Ctrl-C or SIGTERM ends the study at once (the running cells are lost, the finished records
kept): one line, exit 75, and the same command continues; so does a killed worker, in one line with exit 2.
"""

from __future__ import annotations

import json
import re
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from joblib import Parallel, delayed
from joblib.externals.loky.process_executor import TerminatedWorkerError

from nmt.errors import Stopped, UserError
from nmt.outputs import write_json
from nmt.workers import die_with_parent


@dataclass(frozen=True)
class Cell:
    record: Path  # the run's record, written by run(*args): its presence means the run is done
    args: tuple  # what the study's run function is called with


def run_cells(run: Callable[..., str], cells: Iterable[Cell], jobs: int) -> list[Cell]:
    """run(*cell.args) for every cell without a record, `jobs` at a time with one CPU thread each (2 jobs on 2 cores
    use the machine without oversubscribing it), printing each run's line as it ends; the cells that were to run."""
    todo = [cell for cell in cells if not cell.record.is_file()]
    failed = []
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM ends the study as Ctrl-C does:
    try:  # joblib then ends its workers (the default action would leave them running, orphaned)
        for cell, line, ok in Parallel(n_jobs=max(1, jobs), batch_size=1, return_as="generator_unordered")(
                delayed(_one_thread)(run, cell, jobs > 1) for cell in todo):
            failed += [] if ok else [cell]
            print(line, flush=True)
    except KeyboardInterrupt:
        print(f"stopped: {_recorded(todo)}", file=sys.stderr, flush=True)
        raise Stopped from None
    except TerminatedWorkerError as err:  # a worker killed (the OOM killer): joblib ends the running cells with it
        codes = re.search(r"exit codes of the workers are (\{.*?\})", str(err))
        raise UserError(f"a worker of the study was killed (exit code {codes[1] if codes else 'unknown'}), and with "
                        f"it the running cells: {_recorded(todo)}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    if failed:  # the study's exit says so too: a script or a scheduler that reads only the exit code must not see 0
        raise UserError(f"{len(failed)} of {len(todo)} runs failed (each one's line above says why): "
                        + ", ".join(str(cell.record) for cell in failed))
    return todo


def _recorded(todo: list[Cell]) -> str:
    return (f"{sum(cell.record.is_file() for cell in todo)} of {len(todo)} runs recorded; run the same command again "
            "to continue (recorded runs are kept)")


def _one_thread(run: Callable[..., str], cell: Cell, in_worker: bool) -> tuple[Cell, str, bool]:
    """run(*cell.args) on one CPU thread; (the cell, its line, whether it ran): FAILED and why if not. A worker ends
    with the study, however the study ends (a SIGKILL too: no cell trains on for nobody); with one job joblib runs
    the cells in the study's own process, which must not end with its parent (a shell left with nohup)."""
    import torch

    if in_worker:
        die_with_parent()
    torch.set_num_threads(1)
    try:
        return cell, run(*cell.args), True
    except Exception as err:  # one broken run must not stop the others
        return cell, f"{cell.record}: FAILED ({type(err).__name__}: {err})", False


def write_record(path: Path, record: dict, indent: int = 1) -> None:
    """The record as indented JSON, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record, indent)


def read_records(folder: Path, pattern: str) -> list[dict]:
    """The records under `folder` whose names match `pattern`, in name order."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob(pattern))]
