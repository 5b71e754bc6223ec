"""A run's one lifecycle: skipped when its record says it is done, else trained (nmt.train.run), its recipe's
checkpoint decoded on train.score_split and scored, and its record written (nmt/lab/record.py: OUTPUT/result.json,
the one "done" marker). A -m sweep's cell (`relnmt-train -m ... model.clip=0,4,16`, a whole study: `relnmt-train -m
+study=table1`), a single run asked to end in its score (`relnmt-train ... train.score=true`), `relnmt-experiment` and
the demo (scripts/demo.py) all end here; rank 0 scores, the other ranks wait for it. A run is done when its record
holds this job: the same value for every field that defines the run or its record (nmt.recorded_config.defines_record: the
model, the data, the recipe, the budget, the split scored). `relnmt-table SWEEP_FOLDER` tables the records
(nmt/lab/collect.py)."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from nmt.cluster import export_ranks, requeue_after
from nmt.compose import compose_job, composed
from nmt.config import SECTIONS, ConfigError, TrainJob
from nmt.errors import Stopped, UserError
from nmt.lab.record import RESULT, finish_run
from nmt.overrides import override_error
from nmt.recorded_config import defines_record, plain_job, with_schema_defaults

log = logging.getLogger("nmt.lab.run")

FAILED = "failed"  # in a cell's folder: one line, why its last job failed (the submitting command writes it)


def is_sweep_cell() -> bool:
    """Whether this job is one cell of a Hydra -m sweep (any launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


@dataclass(frozen=True)
class MadeBy:
    """What a record says made its run: the overrides as given, the presets they chose, the command line."""

    overrides: list[str]
    choices: dict
    command: str


def done_record(job: TrainJob) -> dict | None:
    """The run's record when it holds this job (every field that defines the run or its record alike, the budget
    included: a larger one continues the run), else None: no record, a cut one (scored again), or another job's (a
    definition changed under the same folder: the trainer refuses it in one line naming the fields)."""
    path = Path(job.train.output_dir) / RESULT
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record_fields(record.get("config", {})) == record_fields(plain_job(job)) else None


def record_fields(config: dict) -> dict:
    """A resolved job's fields that define its run or its record (nmt.recorded_config.defines_record), the schema's defaults
    filled in for an old record."""
    return {section: {name: value for name, value in with_schema_defaults(section, config.get(section, {})).items()
                      if defines_record(section, name)} for section in SECTIONS}


def run_to_record(job: TrainJob, train: Callable[[TrainJob], Path | None], made_by: MadeBy) -> dict | None:
    """The one lifecycle (this module's docstring): the run's record, or None where there is none to make (a dry run,
    a rank other than 0). On a submitit job's preemption signal it is requeued after its checkpoint. A crash that is
    not a user's error (CUDA out of memory, a time limit with no requeue left) is logged with its traceback, to the
    run's train.log on rank 0 and to stderr, and raised: a sweep's job fails (hydra_plugins/relnmt_launchers)."""
    export_ranks()  # a submitit job's tasks learn their ranks here, before anything below reads RANK
    job.check()
    main = int(os.environ.get("RANK", "0")) == 0
    if not job.train.dry_run and (record := done_record(job)) is not None:
        if main:
            print(f"{job.train.output_dir}: done ({record.get('updates')} updates, scored in {RESULT}: sacreBLEU "
                  f"{record.get('bleu', float('nan')):.2f} on {record.get('split')})", file=sys.stderr)
        return record
    folder = Path(job.train.output_dir)
    failed = folder / SCORE_FAILED
    if main:
        failed.unlink(missing_ok=True)  # an earlier attempt's: the other ranks read it only after this training
        (folder / FAILED).unlink(missing_ok=True)  # the run goes on
    try:
        try:
            out = train(job)
        except Stopped as stopped:
            requeue_after(getattr(stopped, "signal_name", None))
            raise
        if out is None:  # train.dry_run: nothing trained, nothing to score
            return None
        if not main:
            wait_for_score(out / RESULT, failed)
            return None
        try:
            return score_run(job, out, made_by)
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
        log.error("the cell crashed: %s: %s", type(crash).__name__, crash, exc_info=crash)
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


def score_run(job: TrainJob, out: Path, made_by: MadeBy) -> dict:
    """The trained run's record (nmt/lab/record.py finish_run): decoded, scored, out/result.json."""
    result = finish_run(job, out, plain_job(job), made_by.overrides, made_by.choices, made_by.command, log)
    print(f"{out}: sacreBLEU {result['bleu']:.2f} on {result['sentences']} {result['split']} sentences "
          f"({result['checkpoint']}, {result['updates']} updates)", file=sys.stderr)
    return result


def composed_run(overrides: list[str], train: Callable[[TrainJob], Path | None], command: str) -> dict | None:
    """run_to_record for a job composed outside Hydra's command line (nmt.experiment, the demo): configs/train.yaml
    and `overrides`, which set train.output_dir. A typo in them is refused as on the command line (ConfigError)."""
    if (error := override_error("train", list(overrides))) is not None:
        raise ConfigError(error)
    job, _ = compose_job(overrides)
    choices = dict(composed(overrides, with_hydra=True).hydra.runtime.choices)
    return run_to_record(job, train, MadeBy(list(overrides), choices, command))


def hydra_made_by(program: str) -> MadeBy:
    """MadeBy of the Hydra job running now (a sweep's cell, or a single run)."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    overrides = list(hydra.overrides.task)
    multirun = " -m" if is_sweep_cell() else ""
    return MadeBy(overrides, dict(hydra.runtime.choices), f"{program}{multirun} {' '.join(overrides)}".rstrip())
