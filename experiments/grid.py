"""The one runner of every grid of runs here (the sweeps of the tables, the synthetic studies): cells -> a pool of
processes -> one JSON record per cell -> the study's table.

A cell is done when its record exists, and a record is written whole (a temporary file renamed into place), so a
grid stopped half-way resumes where it stopped and never takes a half-written record for a finished run. A cell that
fails is reported and costs only itself. SIGTERM or Ctrl-C stops the grid: no new cell starts, each running job that
is a child process (run_child) is asked to stop after its next checkpoint, and run_grid raises Stopped once they
have (exit 75 through nmt.cli.ends_in_one_line): the same command continues.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import EXIT_STOPPED, Stopped, UserError
from nmt.outputs import write_json
from nmt.workers import die_with_parent

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_child: subprocess.Popen | None = None  # a pool worker's running job (run_child), asked to stop on a signal
_grid: int | None = None  # a pool worker's parent: the grid's process


@dataclass(frozen=True)
class Cell:
    record: Path  # the run's record: its presence means the run is done
    args: tuple  # what the study's run function is called with


def orphaned() -> bool:
    """Whether this pool worker's grid has ended (the worker was handed to another parent)."""
    return _grid is not None and os.getppid() != _grid


def worker_setup(threads: int) -> None:
    """A pool worker: `threads` CPU threads, and a signal passed on to its child job as SIGTERM (stop after the next
    checkpoint) instead of ending the worker. A Python handler, not SIG_IGN: the child starts with the defaults.
    The grid's end is such a signal too (die_with_parent): the job stops with its checkpoint, then the worker ends."""
    global _grid
    import torch

    _grid = os.getppid()
    die_with_parent()
    if orphaned():  # the grid ended before the line above could ask to be told
        os._exit(EXIT_STOPPED)
    torch.set_num_threads(threads)
    for sig in STOP_SIGNALS:
        signal.signal(sig, stop_child)


def stop_child(*_) -> None:
    if _child is not None and _child.poll() is None:
        _child.terminate()  # run_child returns once the job has saved and ended
    elif orphaned():  # an idle worker of a grid that is gone: nothing to wait for
        os._exit(EXIT_STOPPED)


def run_child(command: list[str], **popen) -> int:
    """subprocess.run for a grid's job: its exit code, the job stopped by SIGTERM when the grid is stopped or ends.
    The job also gets SIGTERM if its worker dies (die_with_parent), and a worker whose grid is gone ends with it."""
    global _child
    with subprocess.Popen(command, preexec_fn=die_with_parent, **popen) as _child:
        code = _child.wait()
    _child = None
    if orphaned():  # nobody is left to take the result: the re-run grid continues the job from its checkpoint
        os._exit(EXIT_STOPPED)
    return code


def run_grid(run: Callable[..., str], cells: Iterable[Cell], jobs: int, threads: int = 1) -> list[Cell]:
    """run(*cell.args) for every cell without a record, `jobs` side by side with `threads` CPU threads each (one each:
    2 jobs on 2 cores use the machine without oversubscribing it), printing each run's line as it ends; the cells
    that were to run. Stopped (after every running cell has ended) when a signal stopped the grid or a cell; else
    UserError (exit 2) naming the cells that failed, after every other cell has run."""
    todo = [cell for cell in cells if not cell.record.is_file()]
    stopped: list[str] = []
    failed: list[Cell] = []

    def stop(signum, _frame):
        if not stopped:
            print(f"{signal.Signals(signum).name}: no new run starts; the running ones stop after their next "
                  "checkpoint", flush=True)
        stopped.append(signal.Signals(signum).name)
        for worker in multiprocessing.active_children():
            os.kill(worker.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    waiting = list(todo)
    try:
        with ProcessPoolExecutor(max(1, jobs), initializer=worker_setup, initargs=(threads,)) as pool:
            running: dict = {}
            while waiting or running:
                while waiting and len(running) < max(1, jobs) and not stopped:  # one at a time: a stop starts none
                    cell = waiting.pop(0)
                    running[pool.submit(run, *cell.args)] = cell
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for done in finished:
                    cell = running.pop(done)
                    try:
                        print(done.result(), flush=True)
                    except Stopped as err:
                        stopped.append(str(err))
                        print(f"{cell.record.parent}: {err}", flush=True)
                    except Exception as err:  # one broken run must not stop the others
                        failed.append(cell)
                        print(f"{cell.record}: FAILED ({type(err).__name__}: {err})", flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stopped:
        raise Stopped("stopped: run the same command again to continue (finished runs are kept, stopped ones resume)")
    if failed:  # the grid's exit says so too: a script or a scheduler that reads only the exit code must not see 0
        raise UserError(f"{len(failed)} of {len(todo)} runs failed (each one's line above says why): "
                        + ", ".join(str(cell.record.parent) for cell in failed))
    return todo


def write_record(path: Path, record: dict, indent: int = 1) -> None:
    """The record as indented JSON, whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record, indent)


def read_records(folder: Path, pattern: str) -> list[dict]:
    """The records under `folder` whose names match `pattern`, in name order."""
    return [json.loads(path.read_text()) for path in sorted(folder.glob(pattern))]
