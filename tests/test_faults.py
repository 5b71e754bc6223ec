"""What a long run survives: each fault injected, then checked that nothing is lost (docs/robustness.md: what
survives what).

The multi-process cases run the real command under torchrun with two gloo workers on the CPU."""

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.checkpoints import checkpoint as checkpoint_module
from nmt.checkpoints.checkpoint import LAST, PREVIOUS, WEIGHTS, CheckpointError, load_checkpoint, numbered_checkpoints
from nmt.data.pipeline import prepared_dir
from nmt.data.readers import DataError
from nmt.errors import EXIT_STOPPED
from nmt.train import run
from tests.conftest import ROOT, data_overrides, model_overrides, wait_for
from tests.test_train import job

# a plain torchrun launch, as users write their own: no environment variable to remember (restarted workers once
# hung in gloo's connectFullMesh without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1; nmt.runtime.process.launcher_store)
ENV = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
ENV.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
STEPS = 40


def overrides(data, out: Path, **train) -> list[str]:
    settings = {**dict(max_steps=STEPS, max_tokens=300, valid_every=0, valid_bleu_sentences=0, seed=3, threads=1,
                       log_every=1, save_every_steps=4, output_dir=out), **train}
    return [*data_overrides(data), *model_overrides(), "optim.warmup=4",  # dropout stays on: the RNG streams matter
            *[f"train.{k}={v}" for k, v in settings.items()]]


def torchrun(*args, restarts=0, module="nmt.train"):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            f"--max-restarts={restarts}", "--monitor-interval=0.2", "-m", module, *args]


def finished(command, timeout=300):
    result = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)
    return result


def assert_same_parameters(a: Path, b: Path):
    got, want = load_checkpoint(a), load_checkpoint(b)
    assert got["step"] == want["step"]
    for name in want["model"]:
        assert torch.equal(got["model"][name], want["model"][name]), name
    for name, moment in want["optimizer"]["state"].items():
        assert all(torch.equal(got["optimizer"]["state"][name][k], v) for k, v in moment.items())


@pytest.fixture(scope="module")
def uninterrupted(prepared, tmp_path_factory):
    """Two gloo workers straight through STEPS updates: the reference every interrupted run must equal."""
    out = tmp_path_factory.mktemp("uninterrupted")
    result = finished(torchrun(*overrides(prepared, out)))
    assert result.returncode == 0, result.stderr[-3000:]
    return out / LAST


def logged_update(out: Path, step: int) -> bool:
    log = out / "train.log"
    return log.is_file() and f"train update {step}:" in log.read_text()


def worker_pids(launcher: int) -> dict[int, int]:
    """{rank: pid} of torchrun's workers, from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == launcher:
            ranks = [int(v.split(b"=")[1]) for v in env if v.startswith(b"RANK=")]
            if ranks:
                found[ranks[0]] = int(entry.name)
    return found


@pytest.mark.slow  # tens of seconds: make test stays under 10 minutes
def test_two_processes_stopped_and_rerun_end_bit_identical(prepared, uninterrupted, tmp_path):
    """Each rank's RNG streams are saved and restored to that rank: resuming is exact with several processes."""
    result = finished(torchrun(*overrides(prepared, tmp_path, max_steps=STEPS // 2 + 2)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(load_checkpoint(tmp_path / LAST)["rng"]) == 2  # one entry per rank
    result = finished(torchrun(*overrides(prepared, tmp_path)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_parameters(tmp_path / LAST, uninterrupted)


@pytest.mark.slow
def test_sigterm_stops_every_rank_at_one_update_and_the_rerun_continues_bit_identically(
        prepared, uninterrupted, tmp_path):
    launcher = subprocess.Popen(torchrun(*overrides(prepared, tmp_path, save_every_steps=1000)), cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: logged_update(tmp_path, 5))
    os.kill(worker_pids(launcher.pid)[1], signal.SIGTERM)  # one rank only: the stop flag reaches the other
    _, stderr = launcher.communicate(timeout=120)
    assert launcher.returncode != 0  # torchrun reports the workers' exit code 75
    assert f"exitcode  : {EXIT_STOPPED}" in stderr or f"exit code {EXIT_STOPPED}" in stderr
    stopped = load_checkpoint(tmp_path / LAST)
    assert 5 <= stopped["step"] < STEPS  # saved though save_every_steps was never reached
    assert stopped["saved_for"] == "signal"  # off the cadence: nmt.average leaves it out
    result = finished(torchrun(*overrides(prepared, tmp_path, save_every_steps=1000)))
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_parameters(tmp_path / LAST, uninterrupted)


@pytest.mark.slow
def test_a_killed_worker_restarts_the_group_which_ends_bit_identical(prepared, uninterrupted, tmp_path):
    launcher = subprocess.Popen(torchrun(*overrides(prepared, tmp_path), restarts=2), cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (tmp_path / "checkpoint_0000008.pt").exists())
    os.kill(worker_pids(launcher.pid)[1], signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=300)
    assert launcher.returncode == 0, stderr[-3000:]
    assert "failed (exitcode: -9)" in stderr  # the kill happened mid-run and torchrun restarted the group
    assert_same_parameters(tmp_path / LAST, uninterrupted)


def test_ranks_save_by_time_together(prepared, uninterrupted, tmp_path):
    """train.save_every_minutes is judged on each rank's clock; the ranks agree through the step's reduction, so
    no rank waits in a save's all-gather while another trains on (a hang before), and the run is unchanged."""
    result = finished(torchrun(*overrides(prepared, tmp_path, save_every_steps=1000, save_every_minutes=0.0005)),
                      timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(numbered_checkpoints(tmp_path)) > 3  # saved by time, many times
    assert_same_parameters(tmp_path / LAST, uninterrupted)


def test_a_rank_that_raises_ends_the_job_promptly_with_its_error(prepared, tmp_path):
    start = time.monotonic()
    result = finished(torchrun(*overrides(prepared, tmp_path), module="tests.failing_rank"), timeout=180)
    assert result.returncode != 0
    assert "injected failure on rank 1 at update 3" in result.stderr
    assert time.monotonic() - start < 90


def test_numbered_checkpoints_hold_the_weights_and_last_and_prev_the_whole_state(prepared, tmp_path):
    run(job(prepared, tmp_path, max_steps=6, save_every_steps=2, keep_last=10))
    for path in numbered_checkpoints(tmp_path):
        assert set(load_checkpoint(path)) == set(WEIGHTS)
    last, previous = load_checkpoint(tmp_path / LAST), load_checkpoint(tmp_path / PREVIOUS)
    assert "optimizer" in last and "optimizer" in previous and (last["step"], previous["step"]) == (6, 4)
    model_bytes = sum(t.numel() * t.element_size() for t in last["model"].values())
    extra = (tmp_path / LAST).stat().st_size - numbered_checkpoints(tmp_path)[-1].stat().st_size
    assert extra > 1.9 * model_bytes  # Adam's two moments live in the whole state only


@pytest.mark.parametrize("average_last, to_use", [(0, LAST), (2, "averaged.pt")])
def test_a_finished_run_whose_numbered_checkpoints_were_deleted_says_it_is_finished(prepared, tmp_path, average_last,
                                                                                     to_use):
    """A user frees disk by deleting checkpoint_<N>.pt of a finished run (keeping last, prev and best), then runs
    the same command: nothing left to train, and the summary names the file that still holds the model."""
    command = [sys.executable, "-m", "nmt.train",
               *overrides(prepared, tmp_path, max_steps=4, save_every_steps=2, average_last=average_last)]
    assert finished(command).returncode == 0
    for path in numbered_checkpoints(tmp_path):
        path.unlink()
    again = finished(command)
    assert again.returncode == 0 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert f"the run in {tmp_path} is finished (update 4)" in again.stderr
    assert f"the model to use: {tmp_path / to_use} (" in again.stderr
    assert load_checkpoint(tmp_path / to_use)["model"]  # the file named holds the weights, and translates


def failing_save(fail_steps: set, error: str = "OSError"):
    """torch.save that writes part of the file and then finds the disk full, once at each of the given updates: as
    an OSError, or as the RuntimeError torch.save itself raises when a write fails (seen on /dev/full)."""
    real = checkpoint_module.torch.save

    def save(state, path, *args, **kwargs):
        if state.get("step") in fail_steps:
            fail_steps.discard(state["step"])
            Path(path).write_bytes(b"partial")
            if error == "OSError":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0: No space left")
        return real(state, path, *args, **kwargs)

    return save


@pytest.mark.parametrize("error", ["OSError", "RuntimeError"])
def test_a_full_disk_keeps_every_earlier_checkpoint_and_says_so_in_one_line(prepared, tmp_path, monkeypatch, error):
    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save({4}, error))
    run(job(prepared, tmp_path, max_steps=6, save_every_steps=2))  # the save at 4 fails; training goes on
    log = (tmp_path / "train.log").read_text()  # what the user reads
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "could not save update 4" in errors[0] and "No space left" in errors[0]
    # the save at update 6 (the last, and a multiple of save_every_steps) wrote: nothing left to retry
    assert "intact" in errors[0] and "Traceback" not in log
    assert [p.name for p in numbered_checkpoints(tmp_path)] == ["checkpoint_0000002.pt", "checkpoint_0000006.pt"]
    assert load_checkpoint(tmp_path / LAST)["step"] == 6 and load_checkpoint(tmp_path / PREVIOUS)["step"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != ".lock"]  # no temporary file

    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save({8}, error))
    with pytest.raises(CheckpointError, match="could not save update 8.*intact.*resumable from update 6"):
        run(job(prepared, tmp_path, max_steps=8, save_every_steps=100))  # the final save fails: the run says so
    assert load_checkpoint(tmp_path / LAST)["step"] == 6


def test_a_failed_save_at_the_last_update_is_retried_before_the_run_ends(prepared, tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_module.torch, "save", failing_save({6}))
    run(job(prepared, tmp_path, max_steps=6, save_every_steps=2))  # 6 is a save_every_steps save, and the last
    assert load_checkpoint(tmp_path / LAST)["step"] == 6


@pytest.fixture
def damaged(prepared, tmp_path):
    """A copy of the prepared data to damage, and the overrides that train on it."""
    copy = tmp_path / "prepared"
    shutil.copytree(prepared_dir(prepared), copy)
    return copy


@pytest.mark.parametrize("damage", ["truncated", "foreign ids", "missing index", "other vocabulary"])
def test_damaged_prepared_data_is_found_at_open(prepared, damaged, damage, tmp_path):
    from dataclasses import replace

    from nmt.runtime.process import setup_env
    from nmt.training.trainer import Trainer

    target = {"truncated": "train.src.bin", "foreign ids": "train.tgt.bin", "missing index": "valid.src.idx",
              "other vocabulary": "spm.model"}[damage]
    path = damaged / target
    if damage == "truncated":  # a partial copy
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "foreign ids":  # shards written with a larger vocabulary
        ids = np.fromfile(path, dtype=np.uint16)
        ids[len(ids) // 2] = 60_000
        ids.tofile(path)
    elif damage == "missing index":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes() + b"\0")
    cfg = job(replace(prepared, prepared_dir=str(damaged)), tmp_path / "out")
    with pytest.raises(DataError, match=f"{target}.*nmt.prepare"):
        Trainer(cfg, setup_env(cfg.train.device, cfg.train.threads))


def test_damaged_prepared_data_is_one_line_exit_2_from_the_command(prepared, damaged, tmp_path):
    (damaged / "train.src.bin").write_bytes((damaged / "train.src.bin").read_bytes()[:100])
    result = subprocess.run(
        [sys.executable, "-m", "nmt.train", *data_overrides(prepared, prepared_dir=damaged), *model_overrides(),
         "train.max_steps=2", "train.valid_every=0", f"train.output_dir={tmp_path}/out"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "train.src.bin" in errors[0] and "nmt.prepare" in errors[0]
