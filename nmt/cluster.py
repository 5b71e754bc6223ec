"""A job that Hydra's submitit launcher started (hydra/launcher=slurm, or local_jobs: configs/hydra/launcher/): its
tasks are the ranks, and its preemption signal ends the run with a checkpoint, then requeues the job.

Under the launcher, a cell of a -m sweep is one SLURM job of nodes x tasks_per_node tasks (configs/hydra/launcher/),
one process per GPU and no torchrun inside: torch's env:// variables come from the job's own environment. submitit
signals a job before its time limit and on preemption (USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise); the
trainer takes that signal like SIGTERM (every rank stops after the same update, with a complete checkpoint), and only
then does submitit's own handler requeue the job, which resumes from that checkpoint bit for bit."""

from __future__ import annotations

import os
import signal


def in_submitit_job() -> bool:
    return "SUBMITIT_EXECUTOR" in os.environ


def export_ranks() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from the submitit job's tasks, for
    setup_env's env:// group; nothing outside a submitit job, or where a launcher (torchrun) already set them. Every
    task sees every GPU of its node (cuda:LOCAL_RANK), as under torchrun."""
    if in_submitit_job() and "RANK" not in os.environ:
        from submitit.helpers import TorchDistributedEnvironment

        # overwrite: a MASTER_PORT or MASTER_ADDR that a user or a prolog exported must not stop the job (submitit
        # reads MASTER_PORT itself)
        TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)


def cpus_per_task() -> int | None:
    """The CPUs SLURM gave each task of this job (sbatch --cpus-per-task, the preset's cpus_per_task), None outside
    a SLURM job that set it: a task's threads, where os.cpu_count() would count the whole node's."""
    cpus = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(cpus) if cpus.isdigit() and int(cpus) > 0 else None


def preemption_signal() -> signal.Signals | None:
    """The signal submitit sends before the time limit or on preemption, None outside a submitit job."""
    if not in_submitit_job():
        return None
    from submitit import JobEnvironment

    return JobEnvironment._usr_sig()  # submitit's one reading of SUBMITIT_PREEMPT_SIGNAL


def requeue_after(signal_name: str | None) -> None:
    """After a run stopped by the launcher's preemption signal saved its checkpoint: hand the signal to submitit's
    handler (restored when the trainer's stop handling ended), which requeues the job from rank 0 and exits; the other
    ranks return and exit as a stopped run. Any other stop (SIGTERM: scancel, Ctrl-C) is not requeued."""
    sig = preemption_signal()
    if sig is None or signal_name != sig.name:
        return
    handler = signal.getsignal(sig)
    if callable(handler):
        handler(sig, None)
