"""Hydra's submitit launchers, as configs/hydra/launcher/{slurm,local_jobs}.yaml name them (their _target_), with one
change: a cell that fails ends the sweep with one line naming the cell's error and its log, not submitit's traceback
with the job's whole error stream. Everything else is the plugin's (pip install -e '.[cluster]'). Hydra finds
launchers only in the hydra_plugins namespace, hence this package's place; without the plugin it defines nothing."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

from hydra.errors import CompactHydraException

from nmt.errors import EXIT_USER_ERROR

try:
    from hydra_plugins.hydra_submitit_launcher import submitit_launcher
except ImportError:  # the cluster extra is not installed: Hydra's plugin discovery must still pass here
    submitit_launcher = None


class CellFailed(CompactHydraException):
    """A cell's job failed: Hydra prints a CompactHydraException's message alone, so one line reaches the user."""


def one_line(error: Exception) -> str:
    """What a failed job said last as an error (a job ends a user's mistake in one ERROR line), and its log."""
    text = str(error)
    said = [line for line in text.splitlines() if " ERROR " in line or line.startswith(("error:", "Error"))]
    logs = re.search(r"path (\S+?)/\d+_\d+_result\.pkl", text)
    where = f" (its log: {logs.group(1)}/*.err)" if logs else ""
    reason = said[-1].split(": ", 1)[-1] if said else text.strip().splitlines()[0]
    return f"a cell of the sweep failed: {reason}{where}"


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


class _OneLine:
    def launch(self, job_overrides, initial_job_idx):
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            with contextlib.redirect_stderr(_WithoutSbatchsWords(sys.stderr)):
                return super().launch(job_overrides, initial_job_idx)
        except (FailedJobError, UncompletedJobError) as error:
            if (said := refused_submission(error)) is not None:  # no job was made: a user's error, exit 2
                print(f"error: the sweep was not submitted, no cell runs: {said}", file=sys.stderr)
                raise SystemExit(EXIT_USER_ERROR) from None
            raise CellFailed(one_line(error)) from None


if submitit_launcher is not None:
    class SlurmLauncher(_OneLine, submitit_launcher.SlurmLauncher):
        def launch(self, job_overrides, initial_job_idx):
            if lacking := [command for command in ("sbatch", "srun") if shutil.which(command) is None]:
                print(f"error: hydra/launcher=slurm submits through SLURM's commands, and {' and '.join(lacking)} "
                      f"{'is' if len(lacking) == 1 else 'are'} not on PATH: run the sweep on a machine of the cluster (a login node)", file=sys.stderr)
                raise SystemExit(EXIT_USER_ERROR)
            return super().launch(job_overrides, initial_job_idx)

    class LocalLauncher(_OneLine, submitit_launcher.LocalLauncher):
        pass
