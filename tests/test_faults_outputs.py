"""Outputs never destroy inputs: an export never writes over a folder it did not write, and replaces an earlier one
only when asked, in one step; a weight that is not finite is refused at every door (averaging, translating,
exporting); an export with a file missing is one line, not CTranslate2's traceback."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt import export as export_module
from nmt.checkpoints.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from nmt.config import OptimConfig, TrainConfig, TrainJob
from nmt.decoding.decode import load_translator
from nmt.errors import UserError
from nmt.export import export
from nmt.outputs import write_json
from nmt.train import run
from tests.conftest import ROOT, data_overrides, micro_config, model_overrides, one_error_line

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, input=stdin, capture_output=True,
                          text=True, timeout=300)


def listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run_dir(prepared, tmp_path_factory) -> Path:
    """A run's folder: a micro model with one edge table per layer (exportable), two checkpoints and their average."""
    out = tmp_path_factory.mktemp("exportable")
    run(TrainJob(model=micro_config(share_heads=True), data=prepared, optim=OptimConfig(warmup=2),
                 train=TrainConfig(max_steps=4, max_tokens=800, save_every_steps=2, valid_every=0, threads=1,
                                   valid_bleu_sentences=0, output_dir=str(out), average_last=2)))
    return out


def test_an_export_never_writes_over_a_folder_it_did_not_write(run_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    before = listing(run_dir)
    done = cli("nmt.export", f"checkpoint={run_dir / 'averaged.pt'}", f"output={run_dir}", "force=true")
    one_error_line(done, f"{run_dir} exists and is not a model written by nmt.export", "nothing was written")
    assert listing(run_dir) == before  # every checkpoint of the run is still there, byte for byte
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a model written by nmt.export"):
        export(run_dir / "averaged.pt", mine, force=True)
    assert listing(mine) == {"notes.txt": b"mine"} and not list(tmp_path.glob(".mine.tmp*"))


@pytest.mark.parametrize("atomic_exchange", [True, False])
def test_an_earlier_export_is_replaced_only_when_asked_and_in_one_step(run_dir, tmp_path, monkeypatch,
                                                                      atomic_exchange):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    export(run_dir / "checkpoint_0000002.pt", out)
    first = listing(out)
    done = cli("nmt.export", f"checkpoint={run_dir / 'averaged.pt'}", f"output={out}")
    one_error_line(done, f"{out} holds an earlier export: force=true replaces it")
    assert listing(out) == first
    if not atomic_exchange:  # a system without renameat2: the old export is moved aside first
        monkeypatch.setattr(export_module, "exchange", lambda a, b: False)
    real_rmtree, seen = shutil.rmtree, []

    def rmtree(path, *args, **kwargs):  # the old export is removed only once the new one holds the name
        seen.append(listing(out) != first and (out / "model.bin").is_file())
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(export_module.shutil, "rmtree", rmtree)
    export(run_dir / "averaged.pt", out, force=True)
    assert seen[-1] and listing(out) != first and '"checkpoint": "' + str(run_dir / "averaged.pt") in \
        (out / "relnmt.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]  # no staging or old folder left beside it


def test_a_failed_export_leaves_the_earlier_one_whole(run_dir, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    export(run_dir / "checkpoint_0000002.pt", out)
    first = listing(out)

    def full_disk(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "usage", full_disk)  # while the staging folder is written
    with pytest.raises(OSError):
        export(run_dir / "averaged.pt", out, force=True)
    assert listing(out) == first and not list(tmp_path.glob(".ct2.tmp*"))  # no staging folder left beside it


def test_an_export_with_a_file_missing_or_cut_is_one_line(run_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    export(run_dir / "averaged.pt", out)
    model_bin = (out / "model.bin").read_bytes()
    (out / "model.bin").write_bytes(model_bin[: len(model_bin) // 2])  # a partial copy
    with pytest.raises(CheckpointError, match=f"model.bin has {len(model_bin) // 2} of its {len(model_bin)} bytes"):
        load_translator(out, torch.device("cpu"))
    (out / "model.bin").unlink()
    done = cli("nmt.translate", f"checkpoint={out}", stdin="A man.\n")
    one_error_line(done, f"{out}: an incomplete export (model.bin missing)", "export it again")


@pytest.fixture
def poisoned(run_dir, tmp_path) -> Path:
    """A copy of the run whose newest checkpoint holds a NaN (a bad copy, another tool)."""
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("averaged.pt"))
    state = load_checkpoint(copy / "checkpoint_0000004.pt")
    name = [n for n, t in state["model"].items() if t.is_floating_point()][-1]
    state["model"][name].view(-1)[3] = float("nan")
    save_checkpoint(state, copy / "checkpoint_0000004.pt")
    return copy


def test_a_weight_that_is_not_finite_is_refused_by_averaging_translating_and_exporting(poisoned):
    bad = poisoned / "checkpoint_0000004.pt"
    name = next(n for n, t in load_checkpoint(bad)["model"].items() if t.is_floating_point() and t.isnan().any())
    done = cli("nmt.average", f"directory={poisoned}", "last=2")
    one_error_line(done, f"{bad}: {name} holds NaN or inf values", "nothing was written")
    assert not (poisoned / "averaged.pt").exists()
    done = cli("nmt.translate", f"checkpoint={bad}", stdin="A man rides a bike.\n")
    one_error_line(done, f"{bad}: {name} holds NaN or inf values: it cannot translate")
    with pytest.raises(CheckpointError, match="holds NaN or inf values"):
        export(bad, poisoned / "ct2")


def test_a_job_given_its_output_folder_leaves_nothing_elsewhere(prepared, tmp_path):
    """Hydra makes its run folder (outputs/<preset>...) before the job starts: with train.output_dir given, that is
    the output folder, and the working directory stays as it was."""
    work = tmp_path / "work"
    work.mkdir()
    done = subprocess.run([sys.executable, "-m", "nmt.train", *data_overrides(prepared), *model_overrides(),
                           "train.max_steps=1", "train.valid_every=0", "train.valid_bleu_sentences=0",
                           "train.max_tokens=300", "train.threads=1", f"train.output_dir={tmp_path / 'run'}"],
                          cwd=work, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert list(work.iterdir()) == [] and (tmp_path / "run" / "checkpoint_last.pt").is_file()


def test_a_json_file_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "result.json"
    write_json(path, {"bleu": 1.5, "folder": tmp_path})  # a path is written as its text
    assert path.read_text() == f'{{\n  "bleu": 1.5,\n  "folder": "{tmp_path}"\n}}\n'
    circular = {}
    circular["self"] = circular
    with pytest.raises(ValueError):
        write_json(path, circular)  # fails mid-way: the earlier file stays whole, no temporary is left
    assert path.read_text().startswith('{\n  "bleu": 1.5') and [p.name for p in tmp_path.iterdir()] == ["result.json"]
