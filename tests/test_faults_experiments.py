"""A stopped experiment continues: nmt.experiment (and the demo and the sweeps built on it) stopped by a signal exits
75 in one line with a checkpoint, and the same command ends with the result of a run never stopped; two sweeps do
not share the cores unknowingly."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.checkpoints.checkpoint import LAST, load_checkpoint
from nmt.errors import EXIT_STOPPED
from tests.conftest import ROOT, data_overrides, model_overrides, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def experiment(prepared, out: Path, *extra) -> list[str]:
    return [sys.executable, "-m", "nmt.experiment", "--output", str(out), "--lines", "12", *data_overrides(prepared),
            *model_overrides(), "train.max_steps=40", "train.save_every_steps=10", "train.average_last=2",
            "train.max_tokens=300", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1",
            "train.log_every=1", "train.device=cpu", *extra]


@pytest.mark.slow  # tens of seconds: make test stays under 10 minutes
def test_a_stopped_experiment_run_again_ends_as_one_never_stopped(prepared, tmp_path):
    whole = subprocess.run(experiment(prepared, tmp_path / "whole"), cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-2000:]
    out = tmp_path / "stopped"
    job = subprocess.Popen(experiment(prepared, out), cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (out / "train.log").is_file() and "train update 13:" in (out / "train.log").read_text())
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == EXIT_STOPPED and "Traceback" not in stderr, stderr[-2000:]
    assert "run the same command again to continue" in stderr and not (out / "result.json").exists()
    again = subprocess.run(experiment(prepared, out), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming from" in (out / "train.log").read_text()
    ours, theirs = (json.loads((folder / "result.json").read_text()) for folder in (out, tmp_path / "whole"))
    assert (ours["bleu"], ours["chrf"], ours["updates"]) == (theirs["bleu"], theirs["chrf"], theirs["updates"]) == \
        (ours["bleu"], ours["chrf"], 40)
    assert (out / ours["hyp"]).read_bytes() == (tmp_path / "whole" / theirs["hyp"]).read_bytes()
    # the record's training minutes are the run's, every session of it; a finished run re-scored keeps them
    trained = round(load_checkpoint(out / LAST, mmap=True)["train_seconds"] / 60, 2)
    assert ours["train_minutes"] == trained
    rescored = subprocess.run(experiment(prepared, out), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert rescored.returncode == 0 and json.loads((out / "result.json").read_text())["train_minutes"] == trained


def test_the_demo_stopped_exits_75_in_one_line(prepared, tmp_path):
    """scripts/demo.py on the test corpus (later overrides win), stopped by SIGTERM as make demo would be."""
    out = tmp_path / "demo"
    job = subprocess.Popen([sys.executable, "scripts/demo.py", "--output", str(out), "--lines", "5",
                            *data_overrides(prepared), *model_overrides(), "train.max_steps=100000",
                            "train.max_tokens=300", "train.threads=1", "train.log_every=1", "train.valid_every=0",
                            "train.valid_bleu_sentences=0"], cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    wait_for(lambda: (out / "train.log").is_file() and "train update 3:" in (out / "train.log").read_text())
    job.send_signal(signal.SIGTERM)
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == EXIT_STOPPED and "Traceback" not in stderr, stderr[-2000:]
    assert "run the same command again to continue (exit code 75)" in stderr.strip().splitlines()[-1]