"""A cell of a -m sweep (`relnmt-train -m ... model.clip=0,4,16`, or a whole study: `relnmt-train -m +study=table1`):
a run in a folder named by the fields that define it (configs/train.yaml, nmt/run_names.py), which ends in its
record. After training, rank 0 decodes train.score_split of the prepared data with the recipe's checkpoint and
writes CELL/result.json (nmt/record.py finish_run, as nmt.experiment and the demo do); the other ranks wait for it.
A cell whose result.json holds its budget is done: the same sweep run again skips it. `relnmt-table SWEEP_FOLDER`
collects the cells into a table (nmt/collect.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Callable


from nmt.cluster import export_ranks, requeue_after
from nmt.config import ConfigError, TrainJob
from nmt.errors import Stopped, UserError
from nmt.record import RESULT, finish_run
from nmt.recorded_config import plain_job
from nmt.run_names import defines_run

FAILED = "failed"  # in a cell's folder: one line, why its last job failed (the submitting command writes it)


def is_sweep_cell() -> bool:
    """Whether this job is one cell of a Hydra -m sweep (any launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def cell_finished(job: TrainJob) -> bool:
    """A cell whose result is this run's, at this budget (train.max_steps), split and lines, is done. A longer budget
    continues it; a result of another run in the folder (a definition changed under the same name) leaves it to the
    trainer, which refuses it in one line naming the fields."""
    path = Path(job.train.output_dir) / RESULT
    if not path.is_file():
        return False
    result, train = json.loads(path.read_text()), job.train
    if (result.get("updates"), result.get("split"), result.get("score_lines", 0)) != \
            (train.max_steps, train.score_split, train.score_lines) or \
            defining_config(result.get("config", {})) != defining_config(plain_job(job)):
        return False
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{path.parent}: done ({train.max_steps} updates, scored in {path.name})", file=sys.stderr)
    return True


def defining_config(config: dict) -> dict:
    """A resolved job's fields that define its run (nmt.run_names.defines_run)."""
    return {section: {name: value for name, value in config.get(section, {}).items() if defines_run(section, name)}
            for section in ("model", "optim", "train", "data")}


def run_cell(job: TrainJob, train: Callable[[TrainJob], Path]) -> None:
    """The cell's job: skipped when done; trained (`train`: nmt.train.run); on a submitit job's preemption signal,
    requeued after its checkpoint; then scored by rank 0, the other ranks waiting for its score (under torchrun they
    go on to the next cell together). A crash that is not a user's error (CUDA out of memory, a time limit with no
    requeue left) is logged with its traceback, to the cell's train.log on rank 0 and to the job's stderr, and raised:
    the job fails (hydra_plugins/relnmt_launchers)."""
    from hydra.core.hydra_config import HydraConfig

    if any(o.startswith("train.output_dir=") for o in HydraConfig.get().overrides.task):
        raise ConfigError("train.output_dir in a -m sweep would put every cell in one folder: leave it out (each cell "
                          "trains in hydra.sweep.dir/<its overrides>)")
    export_ranks()  # a submitit job's tasks learn their ranks here, before anything below reads RANK
    if cell_finished(job):
        return
    folder = Path(job.train.output_dir)
    main, failed = int(os.environ.get("RANK", "0")) == 0, folder / SCORE_FAILED
    if main:
        failed.unlink(missing_ok=True)  # an earlier attempt's: the other ranks read it only after this training
        (folder / FAILED).unlink(missing_ok=True)  # the cell runs again
    try:
        try:
            out = train(job)
        except Stopped as stopped:
            requeue_after(getattr(stopped, "signal_name", None))
            raise
        if not main:
            return wait_for_score(out / RESULT, failed)
        try:
            score_cell(job, out)
        except BaseException:
            failed.touch()  # the other ranks stop waiting
            raise
    except (UserError, Stopped):
        raise  # said in one line, or stopped with its checkpoint
    except Exception as crash:
        log_crash(folder if main else None, crash)
        raise


def log_crash(folder: Path | None, crash: Exception) -> None:
    """The crash and its traceback on stderr (the job's .err) and, given the cell's folder, in its train.log."""
    root = logging.getLogger()
    added = None
    if folder is not None and folder.is_dir() and not any(
            Path(getattr(handler, "baseFilename", "")) == (folder / "train.log").absolute() for handler in root.handlers):
        added = logging.FileHandler(folder / "train.log")  # it crashed before the run's logging began
        root.addHandler(added)
    if not any(getattr(handler, "stream", None) is sys.stderr for handler in root.handlers):
        root.addHandler(logging.StreamHandler(sys.stderr))
    try:
        logging.getLogger("nmt.cell").error("the cell crashed: %s: %s", type(crash).__name__, crash, exc_info=crash)
    finally:
        if added is not None:
            root.removeHandler(added)
            added.close()


SCORE_FAILED = ".score_failed"  # rank 0 could not score the cell (its log says why)
SCORE_WAIT_S = 6 * 3600  # rank 0 averages, decodes and scores: minutes on a GPU


def wait_for_score(path: Path, failed: Path, poll_s: float = 2.0) -> None:
    """Block until rank 0 has written the cell's score; a UserError when it says it could not, or after
    SCORE_WAIT_S (a rank 0 that died without a word)."""
    deadline = time.monotonic() + SCORE_WAIT_S
    while not path.is_file():
        if failed.exists() or time.monotonic() > deadline:
            raise UserError(f"rank 0 did not score the cell in {path.parent}: its log says why")
        time.sleep(poll_s)


def score_cell(job: TrainJob, out: Path) -> dict:
    """The finished cell's record (nmt/record.py finish_run): decoded, scored, out/result.json."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    result = finish_run(job, out, plain_job(job), overrides, dict(hydra.runtime.choices),
                        f"relnmt-train -m {' '.join(overrides)}")
    print(f"{out}: sacreBLEU {result['bleu']:.2f} on {result['sentences']} {result['split']} sentences "
          f"({result['checkpoint']}, {result['updates']} updates)", file=sys.stderr)
    return result
