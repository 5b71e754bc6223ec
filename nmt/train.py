"""python -m nmt.train model=<preset> data=<preset> [...]: the training loop.

Runs as one process, or under torchrun as DDP (NCCL on CUDA, gloo on CPU). Re-running the same
command resumes from output_dir/checkpoint_last.pt exactly where it stopped; SIGTERM, SIGUSR1 or a first Ctrl-C
stop it cleanly (exit code 75) with a complete checkpoint; Ctrl-C again stops it at once (exit code 130).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from nmt.batch import micro_batches
from nmt.checkpoints.checkpoint import BEST, LAST, CheckpointError
from nmt.checkpoints.folder_lock import RUN_BOOKKEEPING, hold_folder
from nmt.cli import hydra_job
from nmt.config import ConfigError, TrainJob
from nmt.compose import register_schemas
from nmt.data.pipeline import prepare
from nmt.errors import EXIT_STOPPED, Stopped, UserError
from nmt.lab.record import checkpoint_to_decode
from nmt.lab.run import hydra_made_by, is_sweep_cell, run_to_record
from nmt.outputs import remove_unused_folder
from nmt.runtime.distributed import rank0_first
from nmt.runtime.process import Env, setup_env, setup_logging
from nmt.training.dry_run import dry_run_report, seconds_per_update
from nmt.training.trainer import Trainer
from nmt.workers import die_with_launcher, launcher_gone, launcher_stopping


log = logging.getLogger("nmt.train")


class TrainingStopped(Stopped):
    """SIGTERM or SIGUSR1 ended the run after a complete checkpoint; the same command continues it. nmt.train
    exits 0 done, 2 on bad input, config or checkpoint (one line, no traceback), 75 stopped (nmt/errors.py)."""

    def __init__(self, message: str, signal_name: str | None = None):
        super().__init__(message)
        self.signal_name = signal_name  # what this rank received (None: another rank's signal stopped it)


def run(job: TrainJob) -> Path:
    """Prepare (rank 0), train (every rank), then average (rank 0, after the process group is gone).
    Raises TrainingStopped when a signal ended the run early."""
    job.check()
    env = setup_env(job.train.device, job.train.threads, job.train.deterministic)
    with env.refusal_ends_the_launch():
        if job.train.dry_run:
            return dry_run(env, job)
        return train_in(env, job)


def dry_run(env: Env, job: TrainJob) -> None:
    """train.dry_run=true (nmt/training/dry_run.py): every rank times a few updates, rank 0 prints the report."""
    trainer, seconds = timed_updates(env, job)
    if env.main:
        print(dry_run_report(trainer, env, seconds))


def timed_updates(env: Env, job: TrainJob) -> tuple[Trainer, float]:
    """The dry run's measure: the data prepared, a Trainer of its own, the seconds an update takes on this launch."""
    micro_batches(job.train, env.world_size)  # ConfigError: the recipe's batch is out of reach
    setup_logging(None, env.main)
    try:
        rank0_first(env, lambda: prepare(job.data))
        trainer = Trainer(job, env)
        return trainer, seconds_per_update(trainer)
    finally:
        if env.world_size > 1:
            dist.destroy_process_group()
        if env.main:  # the empty folder Hydra made for the run's default output_dir
            remove_unused_folder(Path(job.train.output_dir), bookkeeping=())


def estimated_seconds(job: TrainJob) -> float:
    """The dry run's estimate of a one-process run's training time (validation and saves not counted), before it
    trains: what `make demo` says first. The run itself starts afresh (its own Trainer, seeded from the job)."""
    job.check()
    env = setup_env(job.train.device, job.train.threads, job.train.deterministic)
    with env.refusal_ends_the_launch():
        return timed_updates(env, job)[1] * job.train.max_steps


def train_in(env: Env, job: TrainJob) -> Path:
    out = Path(job.train.output_dir)
    fresh = not out.is_dir() or not any(out.iterdir())  # new, or the empty folder Hydra made for the run
    try:
        micro_batches(job.train, env.world_size)  # the recipe's batch within reach of this launch, before any work
        held = hold_folder(env, out)  # before anything is written there, the log included
    except (ConfigError, CheckpointError):
        if env.world_size > 1:
            dist.destroy_process_group()
        setup_logging(None, env.main)  # to stderr: the folder's train.log is the other job's
        raise
    with held:
        setup_logging(out, env.main)
        try:
            rank0_first(env, lambda: prepare(job.data))  # a no-op when the prepared data is up to date
            trainer = Trainer(job, env)
            try:
                stop = trainer.train()
            except (torch.OutOfMemoryError, MemoryError) as full:
                raise OutOfMemory(out_of_memory_line(job, env, full)) from None
        except UserError:
            if fresh and env.main:  # refused before it trained (missing data): no folder of a run that never was
                remove_unused_folder(out, RUN_BOOKKEEPING)
            raise
        finally:
            if env.world_size > 1:
                dist.destroy_process_group()
        if stop == "signal":
            raise TrainingStopped(f"stopped at update {trainer.step}", trainer.stopped_by)
        if env.main:
            trainer.finish()
            if trainer.checkpoints.resumed_step == trainer.step:  # the same command run again after the run's end
                log.info("the run in %s is finished (update %d): nothing left to train", out, trainer.step)
            for line in next_steps(job, out, trainer.metrics.last_valid, trainer.data.directory):
                log.info("%s", line)
    return out


class OutOfMemory(UserError):
    """A micro-batch that did not fit: said in one line with the remedies that keep the recipe's batch."""


def out_of_memory_line(job: TrainJob, env: Env, full: BaseException) -> str:
    """What to do when a micro-batch does not fit in the device's (or the host's) memory: the two settings that keep
    the recipe's batch, since the trainer accumulates micro-batches up to it (nmt/batch.py)."""
    where = "the GPU's" if isinstance(full, torch.OutOfMemoryError) else "the host's"
    return (f"out of memory ({where}) on {env.device} with train.max_tokens={job.train.max_tokens}: set "
            "train.checkpoint_activations=true (each layer recomputed in the backward: the same gradients, far less "
            f"memory) or a smaller train.max_tokens (e.g. {max(1, job.train.max_tokens // 2)}: the trainer accumulates "
            "more micro-batches to the same batch per update); the run resumes from its last checkpoint")


def next_steps(job: TrainJob, out: Path, last_valid: tuple[int, dict] | None, prepared: Path) -> list[str]:
    """What the user reads at the end of a run: its last validation, the model to use (the recipe's checkpoint, the
    one a record scores: nmt/lab/record.py), and the commands that translate and score the prepared test set with it
    (or a sentence, without one)."""
    lines = []
    if last_valid is not None:
        step, valid = last_valid
        said = [f"{name} {valid[key]:.{digits}f}" for key, name, digits in
                (("nll", "nll", 3), ("ppl", "ppl", 2), ("bleu_greedy", "greedy BLEU", 2)) if key in valid]
        lines.append(f"last validation (update {step}): {', '.join(said)}")
    average_last, src, tgt = job.train.average_last, job.data.src, job.data.tgt
    model = checkpoint_to_decode(out, job.train)
    which = (f"the best on validation, train.best_metric={job.train.best_metric.value}" if model.name == BEST else
             f"the average of the last {average_last} checkpoints" if average_last > 0 else
             "the newest checkpoint" if model.name != LAST else
             "the last update's weights; the numbered checkpoints are deleted")
    lines.append(f"the model to use: {model} ({which})")
    if (out / BEST).is_file() and model.name != BEST:
        lines.append(f"the best on validation (train.best_metric): {out / BEST}")
    if (prepared / f"test.{src}").is_file():
        hyp = out / f"test.hyp.{tgt}"
        lines.append(f"next: relnmt-translate checkpoint={model} input={prepared / f'test.{src}'} output={hyp} && "
                     f"relnmt-score hyp={hyp} ref={prepared / f'test.{tgt}'}")
    else:
        lines.append(f"next: echo 'a sentence' | relnmt-translate checkpoint={model}")
    return lines


register_schemas()


@hydra_job("train", TrainJob, interrupted="stopped at once: the updates since the last checkpoint are lost; run the "
                                           "same command again to continue from it")
def main(cfg) -> None:
    job = OmegaConf.to_object(cfg)
    if is_sweep_cell():
        from hydra.core.hydra_config import HydraConfig

        if any(o.startswith("train.output_dir=") for o in HydraConfig.get().overrides.task):
            raise ConfigError("train.output_dir in a -m sweep would put every cell in one folder: leave it out (each "
                              "cell trains in hydra.sweep.dir/<its overrides>)")
        die_with_launcher()  # a cell in a launcher's worker process ends with the launcher
        if launcher_stopping():  # a signal stopped the study: the cells not yet started wait for its next run
            raise TrainingStopped("the study is stopping: this cell starts when the same command runs again")
    try:
        if is_sweep_cell() or job.train.score:
            run_to_record(job, run, hydra_made_by("relnmt-train"))
        else:
            run(job)
    finally:
        if launcher_gone():  # its launcher was killed: the cell stopped with its checkpoint, no one waits for more
            logging.shutdown()
            os._exit(EXIT_STOPPED)

if __name__ == "__main__":
    main()
