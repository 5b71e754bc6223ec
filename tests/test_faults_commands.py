"""What a command says and leaves when it cannot do its job (docs/robustness.md): a required field left out, an
average of two models, a folder that is not there, a run refused before it trained. One line, exit 2, and nothing
made that a later command would trip over."""

import os
import subprocess
import sys

import pytest
import torch

from nmt.checkpoints.averaging import write_average
from nmt.checkpoints.checkpoint import CheckpointError, save_checkpoint
from tests.conftest import ROOT, data_overrides, model_overrides, one_error_line

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def command(tool: str, *args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"nmt.{tool}", *args], cwd=cwd, env=ENV, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("tool, args, missing", [
    ("translate", [], "checkpoint"),
    ("average", [], "directory, last"),
    ("average", ["directory=outputs/demo"], "last"),
    ("score", [], "hyp, ref"),
    ("score", ["hyp=x.txt"], "ref"),
    ("export", [], "checkpoint, output"),
])
def test_a_required_field_left_out_is_one_line_naming_it(tool, args, missing):
    line = one_error_line(command(tool, *args), f"{missing} must be given")
    assert "--help lists the fields" in line


def fake_checkpoint(path, vocab: bytes, **model):
    save_checkpoint({"model": {"w": torch.ones(2, 2) * len(path.name)}, "step": 1, "vocab": torch.frombuffer(
        bytearray(vocab), dtype=torch.uint8), "config": {"model": {"d_model": 2, "clip": 4, **model}}}, path)


@pytest.mark.parametrize("other, said", [({"vocab": b"another vocabulary"}, "its vocabulary differs"),
                                         ({"clip": 8}, "its model differs in model.clip")])
def test_checkpoints_of_another_vocabulary_or_model_are_not_averaged(tmp_path, other, said):
    fake_checkpoint(tmp_path / "checkpoint_1.pt", b"one vocabulary")
    fake_checkpoint(tmp_path / "checkpoint_2.pt", other.pop("vocab", b"one vocabulary"), **other)
    with pytest.raises(CheckpointError, match=said):
        write_average([tmp_path / "checkpoint_1.pt", tmp_path / "checkpoint_2.pt"], tmp_path / "averaged.pt")
    assert not (tmp_path / "averaged.pt").exists()
    one_error_line(command("average", f"directory={tmp_path}", "last=2"), said)
    fake_checkpoint(tmp_path / "checkpoint_2.pt", b"one vocabulary")  # the same model: averaged
    write_average([tmp_path / "checkpoint_1.pt", tmp_path / "checkpoint_2.pt"], tmp_path / "averaged.pt")


def test_averaging_a_folder_that_is_not_there_makes_nothing(tmp_path):
    one_error_line(command("average", f"directory={tmp_path / 'nope'}", "last=5"), "no such folder")
    assert not (tmp_path / "nope").exists()


def test_a_run_refused_before_it_trained_leaves_no_folder(tmp_path):
    out = tmp_path / "run"
    one_error_line(command("train", "data=local", f"train.output_dir={out}"), "data=local needs data.train")
    assert not out.exists()
    # its default folder, which Hydra makes before the job starts, goes too
    one_error_line(command("train", "data=local", cwd=tmp_path), "data=local needs data.train")
    assert not any((tmp_path / "outputs").glob("*"))


@pytest.mark.parametrize("sweep", [False, True])
def test_a_job_refused_by_its_checks_leaves_no_folder_hydra_made(tmp_path, sweep):
    """A config check (train.max_steps=0) refuses the job after Hydra made its folder (the run's hydra.run.dir, a
    sweep cell's): one line, and the folder goes."""
    where = ["-m", f"hydra.sweep.dir={tmp_path / 'cells'}", "hydra/launcher=basic"] if sweep else \
        [f"hydra.run.dir={tmp_path / 'run'}"]
    done = command("train", *where, "model=tiny", "data=multi30k_en_de", "train.max_steps=0")
    assert "error: train.max_steps=0 is invalid" in done.stderr and done.returncode == 2, done.stderr[-2000:]
    assert not (tmp_path / "run").exists()
    assert [path.name for path in (tmp_path / "cells").glob("*")] == (["multirun.yaml"] if sweep else [])


@pytest.mark.parametrize("added", [["+train.patiense=3"], ["++train.patiense=3"], ["-m", "+train.patiense=2,3"]])
def test_an_added_key_that_is_no_field_is_refused_like_a_typo(prepared, tmp_path, added):
    """`+key` and `++key` lift Hydra's schema check: unchecked, the typo trains with early stopping left off, and a
    sweep makes cells named after it (`...+train.patiense-2`). It is the same one line as `train.patiense=3`."""
    out = tmp_path / "run"
    done = command("train", *added, *data_overrides(prepared), *model_overrides(), "train.max_steps=1",
                   "train.valid_every=0", "train.threads=1", f"train.output_dir={out}",
                   f"hydra.sweep.dir={tmp_path / 'cells'}", "hydra/launcher=basic", cwd=tmp_path)
    one_error_line(done, "train.patiense is not a field: did you mean train.patience?")
    assert not out.exists() and not (tmp_path / "cells").exists()


@pytest.mark.parametrize("config_name, overrides", [
    ("train", ["+experiment=table1", "+ablation=k0", "++model.clip=3", "++train.patience=2", "+hydra.job.chdir=false"]),
    ("train", ["+study=table1"]),
    ("decode", ["checkpoint=x.pt", "++beam=2"]),
])
def test_adding_a_preset_or_setting_a_field_with_plus_plus_stays_allowed(config_name, overrides):
    from nmt.compose import register_schemas
    from nmt.overrides import override_error

    register_schemas()
    assert override_error(config_name, overrides) is None


@pytest.mark.parametrize("tool", ["translate", "train"])
def test_a_gpu_that_is_not_here_is_one_line_naming_the_field(checkpoint, prepared, tmp_path, tool):
    """device=cuda on a machine without a GPU (or cuda:N past the last one): PyTorch's traceback came when the first
    tensor moved (exit 1); it is one line naming the field, exit 2, and a run makes no folder."""
    missing = f"cuda:{torch.cuda.device_count() if torch.cuda.is_available() else 0}"  # one past the last GPU
    out = tmp_path / "run"
    if tool == "translate":
        done = command("translate", f"checkpoint={checkpoint}", f"device={missing}")
    else:
        done = command("train", *data_overrides(prepared), *model_overrides(), "train.max_steps=1",
                       f"train.device={missing}", f"train.output_dir={out}")
    field = "device" if tool == "translate" else "train.device"
    one_error_line(done, f"{field}={missing}: {missing} is not here", f"use {field}=auto")
    assert not out.exists()


@pytest.mark.parametrize("closed, said", [(0, "standard input is closed: pipe the lines in"),
                                          (1, "standard output is closed: give output=FILE")])
def test_translate_with_its_standard_stream_closed_is_one_line(checkpoint, closed, said):
    """`relnmt-translate checkpoint=C <&-` (or `>&-`): Python starts with sys.stdin (sys.stdout) None, and the job
    failed with an AttributeError traceback (exit 1) after loading the model."""
    done = subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}"], cwd=ROOT, env=ENV,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.close(closed))
    one_error_line(done, said)
