"""Hydra's submitit launchers, as configs/hydra/launcher/{slurm,local_jobs}.yaml name them (their _target_), with one
change: a cell that fails ends the sweep with one line naming the cell's error and its log, not submitit's traceback
with the job's whole error stream. Everything else is the plugin's (pip install -e '.[cluster]'). Hydra finds
launchers only in the hydra_plugins namespace, hence this package's place; without the plugin it defines nothing."""

from __future__ import annotations

import re

from hydra.errors import CompactHydraException

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


class _OneLine:
    def launch(self, job_overrides, initial_job_idx):
        from submitit.core.utils import FailedJobError, UncompletedJobError

        try:
            return super().launch(job_overrides, initial_job_idx)
        except (FailedJobError, UncompletedJobError) as error:
            raise CellFailed(one_line(error)) from None


if submitit_launcher is not None:
    class SlurmLauncher(_OneLine, submitit_launcher.SlurmLauncher):
        pass

    class LocalLauncher(_OneLine, submitit_launcher.LocalLauncher):
        pass
