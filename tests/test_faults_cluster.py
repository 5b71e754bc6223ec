"""A cluster's own faults (docs/robustness.md): a sweep re-run into the jobs its killed run is still stopping, per-node
locks on a shared file system, a folder name past the file system's limit, a submission that
sbatch refuses. Each ends in one line (exit 2) or continues, with nothing lost."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from nmt.checkpoints import folder_lock
from nmt.checkpoints.checkpoint import CheckpointError
from nmt.run_names import data_label, model_overrides_suffix
from nmt.runtime.signals import stop_signals
from tests.conftest import ROOT, one_error_line, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}

STOPPING_HOLDER = """import sys, time
from pathlib import Path
from nmt.checkpoints.folder_lock import announce_stopping, lock_folder
held = lock_folder(Path(sys.argv[1]))
announce_stopping()  # as the trainer does at its first stop signal
open(sys.argv[2], "w").close()
time.sleep(float(sys.argv[3]))  # its last update and checkpoint
"""


def test_a_job_that_is_stopping_is_waited_for_and_a_running_one_refused_at_once(tmp_path):
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", STOPPING_HOLDER, str(tmp_path / "run"), str(ready), "3"],
                              cwd=ROOT, env=ENV)
    wait_for(ready.exists, 60)
    assert (tmp_path / "run" / ".lock").read_text().startswith("stopping")
    started = time.monotonic()
    with folder_lock.lock_folder(tmp_path / "run"):  # the killed sweep's job saves and ends; this one continues
        assert holder.poll() is not None and time.monotonic() - started < 60
    holder.wait()
    with pytest.raises(CheckpointError, match="still stopping after 0 s"):  # bounded
        ready.unlink()
        late = subprocess.Popen([sys.executable, "-c", STOPPING_HOLDER, str(tmp_path / "run"), str(ready), "30"],
                                cwd=ROOT, env=ENV)
        wait_for(ready.exists, 60)
        try:
            folder_lock.lock_folder(tmp_path / "run", wait_s=0)
        finally:
            late.kill()
            late.wait()


def test_the_first_stop_signal_tells_the_folder_lock(tmp_path):
    told = []
    with stop_signals(announce=False, on_stop=lambda: told.append(1)) as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(lambda: signals["received"] is not None, 10)
    assert told == [1] and signals["received"] == "SIGTERM"


def test_a_lock_that_holds_per_node_only_cannot_let_a_second_node_in(tmp_path, monkeypatch):
    """Lustre's localflock: a live job on another node holds the folder, yet this node's lock is free."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    folder = tmp_path / "run"
    folder.mkdir()
    other = "pid 77 on node-elsewhere, SLURM job 12, since 2026-01-01 00:00:00: python -m nmt.train\n"
    (folder / ".lock").write_text(other)
    with pytest.raises(CheckpointError, match="job on another node .*localflock"):
        folder_lock.lock_folder(folder)
    assert (folder / ".lock").read_text() == other  # its line kept
    monkeypatch.setenv("SLURM_JOB_ID", "12")  # the same job, requeued onto this node: its own folder
    with folder_lock.lock_folder(folder):
        assert f"on {socket.gethostname()}, SLURM job 12," in (folder / ".lock").read_text()
    assert (folder / ".lock").read_text() == ""  # released: no line left for another node to trip over
    monkeypatch.delenv("SLURM_JOB_ID")
    (folder / ".lock").write_text(other)
    stale = time.time() - folder_lock.ANOTHER_NODE_LIVE_S - 1  # no heartbeat for that long: the holder is gone
    os.utime(folder / ".lock", (stale, stale))
    with folder_lock.lock_folder(folder):
        pass


def test_a_long_list_of_overrides_still_names_a_folder():
    overrides = [f"model.{field}={value}" for field, value in [
        ("d_model", 512), ("heads", 8), ("ffn_dim", 2048), ("encoder_layers", 6), ("decoder_layers", 6),
        ("dropout", 0.1), ("t5_buckets", 32), ("t5_max_distance", 128), ("clip", 16), ("rel_key", "true"),
        ("rel_value", "true"), ("share_heads", "false"), ("position", "relative"), ("edge_buckets", 0),
        ("max_positions", 1024), ("norm", "pre")]]
    name = "tiny_" + data_label("local", "en", "fr", "/data/" + "corpus_of_a_very_long_name" * 8) \
        + model_overrides_suffix(overrides)
    assert len(name.encode()) <= 255
    assert model_overrides_suffix(overrides) != model_overrides_suffix([*overrides[:-1], "model.norm=post"])


def test_a_run_named_by_sixteen_overrides_gets_a_folder_name_the_file_system_takes(tmp_path):
    """The default folder of a run with 16 model.* overrides: was `File name too long` and a traceback."""
    overrides = [f"model.{field}={value}" for field, value in [
        ("d_model", 32), ("heads", 2), ("ffn_dim", 64), ("encoder_layers", 1), ("decoder_layers", 1),
        ("dropout", 0.1), ("clip", 2), ("rel_key", "true"), ("rel_value", "true"), ("share_heads", "false"),
        ("position", "relative"), ("edge_buckets", 0), ("max_positions", 128), ("t5_buckets", 32),
        ("t5_max_distance", 128), ("norm", "pre")]]
    done = subprocess.run([sys.executable, "-m", "nmt.train", "data=local", "data.train=my_corpora/europarl_v7_train", *overrides],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)
    one_error_line(done, "")  # the data's own one line, not the folder's OSError
    assert "File name too long" not in done.stderr


SBATCH_REFUSES = """#!/bin/bash
echo "sbatch: error: Batch job submission failed: Invalid account or account/partition combination specified" >&2
exit 1
"""


def test_a_submission_sbatch_refuses_is_said_once_as_one(tmp_path):
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "sbatch").write_text(SBATCH_REFUSES)
    (shim / "srun").write_text("#!/bin/bash\nexit 0\n")
    for tool in shim.iterdir():
        tool.chmod(0o755)
    sweep = [sys.executable, "-m", "nmt.train", "-m", "hydra/launcher=slurm", "model.clip=0,1",
             f"hydra.sweep.dir={tmp_path / 'sweep'}", "train.max_steps=2"]
    done = subprocess.run(sweep, cwd=ROOT, env={**ENV, "PATH": f"{shim}:{ENV['PATH']}"}, capture_output=True,
                          text=True, timeout=120)
    line = one_error_line(done, "the sweep was not submitted", "Invalid account")
    assert done.stderr.count("Invalid account") == 1 and "a cell of the sweep failed" not in line
    bare = subprocess.run(sweep, cwd=ROOT, env={**ENV, "PATH": os.path.dirname(sys.executable) + ":/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    one_error_line(bare, "hydra/launcher=slurm submits through SLURM's commands", "not on PATH")


SBATCH_KEEPS = """#!/bin/bash
cp "$1" "$SHIM_SCRIPTS/$(ls "$SHIM_SCRIPTS" | wc -l).sh"
echo "sbatch: error: the shim submits nothing" >&2
exit 1
"""


def slurm_sweep(tmp_path, *overrides):
    """A -m sweep with hydra/launcher=slurm under an sbatch that keeps each script it is given, then refuses it."""
    shim, scripts = tmp_path / "bin", tmp_path / "scripts"
    shim.mkdir(parents=True)
    scripts.mkdir()
    (shim / "sbatch").write_text(SBATCH_KEEPS)
    (shim / "srun").write_text("#!/bin/bash\nexit 0\n")
    for tool in shim.iterdir():
        tool.chmod(0o755)
    done = subprocess.run([sys.executable, "-m", "nmt.train", "-m", "hydra/launcher=slurm",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}", "train.max_tokens=300",
                           "train.tokens_per_update=600", *overrides], cwd=ROOT,
                          env={**ENV, "PATH": f"{shim}:{ENV['PATH']}", "SHIM_SCRIPTS": str(scripts)},
                          capture_output=True, text=True, timeout=120)
    return done, sorted(scripts.iterdir())


def test_a_cells_job_is_named_after_the_sweep_and_the_cell_and_may_be_requeued(tmp_path):
    done, scripts = slurm_sweep(tmp_path, "hydra.launcher.tasks_per_node=2", "model.clip=3,5")
    one_error_line(done, "the sweep was not submitted", "the shim submits nothing")
    script = scripts[0].read_text()  # the first cell's: sbatch refused it, and nothing more was submitted
    name = re.search(r"#SBATCH --job-name=(\S+)", script)[1]  # the sweep folder's name / the cell folder's
    assert len(scripts) == 1 and name.startswith("sweep/") and "model.clip-3" in name, script
    assert "#SBATCH --requeue\n" in script and "--account" not in script and "--mem" not in script
    assert "--array" not in script  # one job per cell, each with its name
    _, scripts = slurm_sweep(tmp_path / "paid", "hydra.launcher.account=nmt", "hydra.launcher.mem_gb=200",
                             "hydra.launcher.tasks_per_node=1",
                             "model.clip=3")
    assert "#SBATCH --account=nmt\n" in scripts[0].read_text() and "#SBATCH --mem=200GB\n" in scripts[0].read_text()


def test_nodes_and_tasks_that_cannot_deal_the_recipes_batch_are_refused_before_submitting(tmp_path):
    """2 x 2 tasks cannot deal 2 micro-batches of 300 tokens: one line before sbatch, not inside the job after the
    queue's wait."""
    done, scripts = slurm_sweep(tmp_path, "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2",
                                "model.clip=3,5")
    one_error_line(done, "the sweep was not submitted", "= 4 task(s)", "cannot be reached on 4 device(s)",
                   "set train.max_tokens to one of 150")
    assert scripts == []


def test_a_slurm_tasks_threads_are_its_cpus_not_the_nodes(monkeypatch):
    import torch

    from nmt.runtime.process import setup_env

    for name in ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "3")
    before = torch.get_num_threads()
    try:
        setup_env("cpu")
        assert torch.get_num_threads() == 3
        setup_env("cpu", threads=2)  # train.threads still decides
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
