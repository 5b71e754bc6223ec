"""Hydra's submitit launchers, as configs/hydra/launcher/{slurm,local_jobs}.yaml name them (their _target_), made
safe for a sweep of cells (nmt/lab/run.py):

- before submitting, each cell's config is composed as its job will compose it: a scored cell is not submitted
  (it would wait in the queue for its whole allocation, only to end at once), nor, with hydra.launcher.cells=failed,
  a cell whose last job did not fail; a cell that nodes x tasks_per_node cannot train (the recipe's batch, nmt/training/
  batch.py) is refused in one line before anything is submitted;
- each cell is its own job, named <sweep>/<cell>;
- a job whose cell crashed fails (Hydra's run_job would hand the exception back as a result: "Job completed
  successfully");
- the submitting command names each failed cell in one line as soon as its job ends (its folder, why, its logs), waits
  for the other cells, and ends naming every failed cell; each failed cell's folder keeps the line (nmt.lab.run.FAILED).

Everything else is the plugin's (pip install -e '.[cluster]'). Hydra finds launchers only in the hydra_plugins
namespace, hence this package's place; without the plugin it defines nothing."""

import contextlib
import io
import logging
import os
import re
import signal
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nmt.cli import EXIT_INTERRUPTED
from nmt.errors import EXIT_USER_ERROR

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher
    from hydra_plugins.hydra_submitit_launcher.config import LocalQueueConf, SlurmQueueConf
except ImportError:  # the cluster extra is not installed: Hydra's plugin discovery must still pass here
    submitit_launcher = None

log = logging.getLogger(__name__)

CELLS = ("unscored", "failed")  # hydra.launcher.cells: every cell without its score, or only those whose job failed
POLL_S = 2.0  # how often the submitting command looks at its jobs


EXIT_CELL_FAILED = 1  # a cell's job failed (Hydra's own exit for a failed job)


def one_line(text: str) -> str:
    """What a failed job said last as an error: its traceback's last line, or the last error line of its stderr
    (a job ends a user's mistake in one ERROR line; srun says which task a signal or the OOM killer ended)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = [line for line in lines if " ERROR " in line or line.startswith(("error:", "srun: error:", "slurmstepd:"))]
    if said:
        return said[-1].split(": ", 1)[-1] if " ERROR " in said[-1] else said[-1]
    raised = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
    return raised[-1] if raised else ""


def why_it_failed(job) -> str:
    """Why a job that ended without success failed, in one line: a task that ended with neither a result nor an
    error line first (a signal or the OOM killer ended it: the others then fail for want of it), then the first task's
    exception (its result) or the last error line of its stderr (a user's error, srun's word on a signal)."""
    from submitit.core.utils import UncompletedJobError

    silent, said = [], []
    for task in list(job._sub_jobs) or [job]:
        try:
            outcome, value = task._get_outcome_and_result()
        except UncompletedJobError:
            outcome, value = None, None
        if outcome == "error":
            said.append(f"task {task.task_id}: {one_line(value) or 'an exception (its .err has the traceback)'}")
        elif outcome is None and (line := one_line(task.stderr() or "")):
            said.append(f"task {task.task_id}: {line}")
        elif outcome is None:
            silent.append(f"task {task.task_id} ended without a result or an error line (job state {task.state}): "
                          "killed by a signal (the OOM killer's SIGKILL, a lost node)")
    return "; ".join([*silent[:1], *said[:1]]) or "the job failed without a word (its .err says no more)"


def refused_submission(error: Exception) -> str | None:
    """sbatch's own words when it refused the submission (an invalid account or partition), else None: submitit
    raises the same FailedJobError for a refused submission as for a failed job, with sbatch's stderr as its text."""
    command = getattr(error.__cause__, "cmd", None)
    if not isinstance(error.__cause__, subprocess.CalledProcessError) or not command \
            or Path(str(command[0])).name != "sbatch":
        return None
    return " ".join(str(error).split()) or f"exit {error.__cause__.returncode}"


class _WithoutSbatchsWords(io.TextIOBase):
    """stderr, less the lines that submitit copies from a refused sbatch: the one line below says them once."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        return len(text) if text.startswith("sbatch: ") else self.stream.write(text)

    def flush(self):
        self.stream.flush()


def user_error(message: str) -> SystemExit:
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(EXIT_USER_ERROR)


class _Cells:
    """The plugin's launcher (SlurmLauncher or LocalLauncher, after this in the bases), for cells of nmt.train."""

    def __init__(self, cells: str = "unscored", **params):
        if cells not in CELLS:
            raise user_error(f"hydra.launcher.cells={cells} is not a choice ({' | '.join(CELLS)})")
        self.cells = cells
        super().__init__(**params)

    def __call__(self, *args, **kwargs):
        """The job: the plugin's, but a cell that raised fails it (Hydra's run_job returns the exception)."""
        from hydra.core.utils import JobStatus

        done = super().__call__(*args, **kwargs)
        if done.status == JobStatus.FAILED:
            raise done._return_value
        return done

    def cell(self, overrides: list[str]):
        """(the cell's folder, its TrainJob) as its job will compose them (the plugin's load_sweep_config, then
        Hydra's run_job's output folder)."""
        from hydra.core.hydra_config import HydraConfig
        from omegaconf import OmegaConf, open_dict, read_write

        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        before = HydraConfig.instance().cfg
        HydraConfig.instance().set_config(config)
        try:
            folder = Path(str(config.hydra.sweep.dir), str(config.hydra.sweep.subdir)).absolute()
            with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
                config.hydra.runtime.output_dir = str(folder)
            HydraConfig.instance().set_config(config)
            with read_write(config), open_dict(config):
                del config["hydra"]
            return folder, OmegaConf.to_object(config)
        finally:
            HydraConfig.instance().cfg = before

    def to_submit(self, job_overrides) -> list[tuple[int, list[str], Path]]:
        """(index, overrides, folder) of the cells to submit: not scored (nor, with cells=failed, without a failed
        job); every cell's batch within reach of nodes x tasks_per_node tasks, else one line and exit 2."""
        from nmt.lab.run import FAILED, done_record
        from nmt.config import ConfigError
        from nmt.batch import micro_batches

        tasks = int(self.params.get("nodes", 1)) * int(self.params.get("tasks_per_node", 1))
        chosen, done = [], []
        for index, overrides in enumerate(job_overrides):
            folder, job = self.cell(overrides)
            if not hasattr(job, "train"):  # not a cell of nmt.train: the plugin's way, every job submitted
                chosen.append((index, list(overrides), folder))
                continue
            try:
                micro_batches(job.train, tasks)
            except ConfigError as refused:
                raise user_error(f"the sweep was not submitted, no cell runs: cell {folder.name} on "
                                 f"hydra.launcher.nodes x tasks_per_node = {tasks} task(s): {refused}") from None
            if done_record(job) is not None:
                done.append(folder)
            elif self.cells == "unscored" or (folder / FAILED).is_file():
                chosen.append((index, list(overrides), folder))
        if done or len(chosen) < len(job_overrides):
            print(f"{len(done)} of {len(job_overrides)} cells are scored; submitting {len(chosen)}"
                  f"{' (hydra.launcher.cells=failed)' if self.cells == 'failed' else ''}", file=sys.stderr)
        return chosen

    def launch(self, job_overrides, initial_job_idx):
        from hydra.core.singleton import Singleton

        cells = self.to_submit(job_overrides)
        if not cells:
            return []
        executor = self.executor()
        sweep = Path(str(self.config.hydra.sweep.dir))
        jobs = []
        with contextlib.redirect_stderr(_WithoutSbatchsWords(sys.stderr)):
            for index, overrides, folder in cells:
                executor.update_parameters(name=f"{sweep.name}/{folder.name}")
                log.info(f"\t#{initial_job_idx + index} : {folder}")
                try:
                    job = executor.submit(self, overrides, "hydra.sweep.dir", initial_job_idx + index,
                                          f"job_id_for_{initial_job_idx + index}", Singleton.get_state())
                except Exception as error:  # noqa: BLE001 -- submitit's FailedJobError, with sbatch's words
                    if (said := refused_submission(error)) is None:
                        raise
                    running = f"; the {len(jobs)} cell(s) submitted before it run on" if jobs else ", no cell runs"
                    raise user_error(f"the sweep was not submitted{running}: {said}") from None
                jobs.append((job, folder))
        return wait_for_cells(jobs)

    def executor(self):
        """The plugin's executor, with its parameters (as its launch builds it)."""
        import submitit
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
        from omegaconf import OmegaConf

        init_keys = {"max_num_timeout", "submitit_folder"}
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
                                         **{f"{self._EXECUTOR}_max_num_timeout": self.params[key]
                                            for key in ("max_num_timeout",) if key in self.params})
        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{key if key in shared else f"{self._EXECUTOR}_{key}": value
                                      for key, value in self.params.items() if key not in init_keys})
        sweep = Path(str(self.config.hydra.sweep.dir))
        sweep.mkdir(parents=True, exist_ok=True)
        return executor


def wait_for_cells(jobs: list) -> list:
    """Every job's result, waiting for all of them: each failed cell said in one line as its job ends (and kept in
    its folder, nmt.lab.run.FAILED); then one line naming every failed cell, exit 1. Ctrl-C names the cells still running."""
    from nmt.lab.run import FAILED

    pending, results, failed = list(jobs), [], []
    try:
        while pending:
            for job, folder in [entry for entry in pending if entry[0].done()]:
                pending.remove((job, folder))
                try:
                    results.append(job.results()[0])
                except Exception:  # noqa: BLE001 -- submitit's FailedJobError or UncompletedJobError
                    why = why_it_failed(job)
                    folder.mkdir(parents=True, exist_ok=True)
                    (folder / FAILED).write_text(why + "\n")
                    failed.append(folder)
                    print(f"a cell of the sweep failed: {folder}: {why} (its logs: {folder}/train.log, "
                          f"{job.paths.stderr}){f'; waiting for {len(pending)} other cell(s)' if pending else ''}",
                          file=sys.stderr, flush=True)
            if pending:
                time.sleep(POLL_S)
    except KeyboardInterrupt:
        print(f"\nstopped waiting (Ctrl-C); the jobs of {len(pending)} cell(s) run on: "
              f"{', '.join(str(folder) for _, folder in pending)}", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    if failed:
        print(f"{len(failed)} of {len(jobs)} cells failed: {', '.join(map(str, failed))}; the same command again "
              "re-runs every unscored cell, with hydra.launcher.cells=failed only these", file=sys.stderr)
        raise SystemExit(EXIT_CELL_FAILED)
    return results


if submitit_launcher is not None:
    from hydra.core.config_store import ConfigStore

    @dataclass
    class RelnmtSlurmConf(SlurmQueueConf):
        cells: str = "unscored"  # which cells to submit: unscored (every cell without its score) | failed

    @dataclass
    class RelnmtLocalConf(LocalQueueConf):
        cells: str = "unscored"  # which cells to submit: unscored (every cell without its score) | failed

    ConfigStore.instance().store(group="hydra/launcher", name="relnmt_slurm", node=RelnmtSlurmConf,
                                 provider="relnmt")
    ConfigStore.instance().store(group="hydra/launcher", name="relnmt_local", node=RelnmtLocalConf,
                                 provider="relnmt")

    class SlurmLauncher(_Cells, submitit_launcher.SlurmLauncher):
        def launch(self, job_overrides, initial_job_idx):
            if lacking := [command for command in ("sbatch", "srun") if shutil.which(command) is None]:
                raise user_error(f"hydra/launcher=slurm submits through SLURM's commands, and "
                                 f"{' and '.join(lacking)} {'is' if len(lacking) == 1 else 'are'} not on PATH: run "
                                 "the sweep on a machine of the cluster (a login node)")
            return super().launch(job_overrides, initial_job_idx)

    class LocalLauncher(_Cells, submitit_launcher.LocalLauncher):
        pass


try:
    from hydra_plugins.hydra_joblib_launcher import joblib_launcher
except ImportError:  # without the plugin, Hydra's discovery must still pass here
    joblib_launcher = None

if joblib_launcher is not None:
    class JoblibLauncher(joblib_launcher.JoblibLauncher):
        """Hydra's joblib launcher (a study's cells, a cell per core: configs/hydra/launcher/cores.yaml), with one
        change: a cell that failed costs only itself; the others run to their end, then one line names every
        failed cell and its folder. Its workers end with it, however it ends: a killed study leaves no cell
        training (each stops after its update with a checkpoint), and the same command continues them."""

        def launch(self, job_overrides, initial_job_idx):
            from hydra.core.utils import JobStatus

            from nmt.errors import EXIT_STOPPED
            from nmt.workers import LAUNCHER_PID, LAUNCHER_STOPPING, stop_workers

            os.environ[LAUNCHER_PID] = str(os.getpid())  # its workers end with it (nmt.workers.die_with_launcher)
            stopping = Path(str(self.config.hydra.sweep.dir)).absolute() / f".stopping-{os.getpid()}"
            os.environ[LAUNCHER_STOPPING] = str(stopping)
            received = []

            def stop(signum, _frame):  # SIGTERM (a scheduler, timeout, a closed terminal's SIGHUP) or a first Ctrl-C
                if received and signum == signal.SIGINT:
                    raise KeyboardInterrupt  # Ctrl-C again: at once, keeping what was saved
                if not received:
                    received.append(signum)
                    stopping.parent.mkdir(parents=True, exist_ok=True)
                    stopping.touch()  # the cells not yet started do not start
                    stop_workers()  # the running ones stop after their update, with a checkpoint
                    os.write(2, b"\nstopping the study: every running cell saves a checkpoint after its update "
                                b"(Ctrl-C again to stop at once)\n")

            signals = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
            previous = {sig: signal.signal(sig, stop) for sig in signals}
            try:
                results = super().launch(job_overrides, initial_job_idx)
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                stopping.unlink(missing_ok=True)
            if received:
                print(f"stopped by {signal.Signals(received[0]).name}: every cell stopped after its update with a "
                      "checkpoint; run the same command again to continue them (the scored cells are skipped)",
                      file=sys.stderr)
                raise SystemExit(EXIT_INTERRUPTED if received[0] == signal.SIGINT else EXIT_STOPPED)
            failed = [f"{result.hydra_cfg.hydra.runtime.output_dir}: {result._return_value}"
                      for result in results if result.status == JobStatus.FAILED]
            if failed:  # as wait_for_cells ends a sweep of the submitit launchers
                print(f"{len(failed)} of {len(results)} cells failed: {'; '.join(failed)}; the same command again "
                      "runs them (the scored cells are skipped)", file=sys.stderr)
                raise SystemExit(EXIT_CELL_FAILED)
            return results
