"""A cluster's own faults (docs/robustness.md): a sweep re-run into the jobs its killed run is still stopping, a cell
that fails, per-node locks on a shared file system, a folder name past the file system's limit, a submission that
sbatch refuses. Each ends in one line (exit 2) or continues, with nothing lost."""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from experiments import grid
from nmt.checkpoints import folder_lock
from nmt.checkpoints.checkpoint import CheckpointError
from nmt.errors import UserError
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


def _fails_or_ends(name):
    if name == "bad":
        raise UserError("bad: exit 2, see its log")
    return f"{name}: done"


def test_a_grid_with_a_failed_cell_runs_the_others_then_fails(tmp_path):
    cells = [grid.Cell(tmp_path / name / "result.json", (name,)) for name in ("bad", "good")]
    with pytest.raises(UserError, match=f"1 of 2 runs failed .*{tmp_path / 'bad'}"):
        grid.run_grid(_fails_or_ends, cells, jobs=1)


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
