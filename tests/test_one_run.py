"""One run, one rule: every field of a training job declares what it is to its run (nmt/roles.py Role, declared in nmt/config.py), and a cell's
name, "done" (its record), resume and fine-tuning all read that one declaration; every scored run goes through one
lifecycle (nmt/lab/run.py) and leaves one record, result.json."""

import json
import subprocess
import sys

from nmt.checkpoints.checkpoint import LAST, load_checkpoint
from nmt.compose import cell_name_for, compose_job, register_schemas
from nmt.recorded_config import defines_cell, defines_record, defines_run, defines_weights, role
from nmt.roles import Role
from nmt.lab.run import done_record
from nmt.recorded_config import plain_job
from tests.conftest import ROOT, data_overrides, model_overrides

ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_every_field_that_can_change_the_scored_model_defines_the_run():
    for name in ("patience", "best_metric", "valid_every", "valid_bleu_sentences", "average_last", "init_from",
                 "seed", "precision", "max_tokens"):
        assert defines_run("train", name) and defines_cell("train", name), name
    assert role("train", "max_steps") == Role.extends and defines_record("train", "max_steps")
    assert not defines_run("train", "max_steps") and not defines_cell("train", "max_steps")
    assert role("train", "score_split") == Role.scores and defines_cell("train", "score_split")
    assert not defines_run("train", "score_split")
    for name in ("threads", "output_dir", "device", "save_every_steps", "log_every", "compile", "score"):
        assert role("train", name) == Role.places and not defines_record("train", name), name
    assert defines_weights("model", "clip") and defines_run("model", "dropout")
    assert not defines_weights("model", "dropout")  # a fine-tuning run sets its own regularization
    assert not defines_cell("data", "prepared_dir") and defines_cell("data", "vocab_size")
    assert role("train", "no_such_field") is None and not defines_run("train", "no_such_field")


def test_a_sweep_over_what_changes_the_scored_model_names_a_cell_for_each_value():
    register_schemas()
    base = ["model=tiny", "+experiment=table1"]
    for other in ("train.patience=1", "train.best_metric=bleu", "train.average_last=2", "train.valid_every=50",
                  "train.init_from=outputs/x/checkpoint_best.pt"):
        assert cell_name_for([*base, other]) != cell_name_for(base), other
    for same in ("train.max_steps=9000", "train.threads=1", "train.score=true", "train.save_every_steps=7"):
        assert cell_name_for([*base, same]) == cell_name_for(base), same


def test_a_record_is_done_only_for_its_own_job(tmp_path):
    def job(*extra):
        return compose_job(["model=tiny", "+experiment=table1", f"train.output_dir={tmp_path}", *extra])[0]

    assert done_record(job()) is None  # no record
    (tmp_path / "result.json").write_text(json.dumps({"config": plain_job(job()), "bleu": 1.0}))
    assert done_record(job())["bleu"] == 1.0
    assert done_record(job("train.threads=1", "train.save_every_steps=7")) is not None  # placed otherwise: done
    for other in ("train.patience=1", "train.max_steps=601", "train.score_split=test", "train.best_metric=bleu"):
        assert done_record(job(other)) is None, other
    (tmp_path / "result.json").write_text('{"config": {"mod')  # cut short: not a record, scored again
    assert done_record(job()) is None


def sweep(prepared, folder, *values):
    return subprocess.run(
        [sys.executable, "-m", "nmt.train", "-m", f"hydra.sweep.dir={folder}", *data_overrides(prepared),
         *model_overrides(), "optim.lr_scale=1e-30", "train.max_steps=3", "train.valid_every=1",
         "train.valid_bleu_sentences=2", "train.max_tokens=300", "train.threads=1", "train.device=cpu",
         "train.score_lines=2", "train.save_every_steps=1", *values],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


def test_a_sweep_over_patience_trains_and_scores_each_cell_and_a_rerun_trains_nothing(prepared, tmp_path):
    """With a rate of ~0 the validation loss never improves: patience 1 stops after the second validation."""
    done = sweep(prepared, tmp_path, "train.patience=0,1")
    assert done.returncode == 0, done.stderr[-3000:]
    records = {json.loads(p.read_text())["config"]["train"]["patience"]: json.loads(p.read_text())
               for p in tmp_path.glob("*/result.json")}
    assert sorted(records) == [0, 1]
    folders = {patience: tmp_path / record["cell"] for patience, record in records.items()}
    trained = {patience: load_checkpoint(folder / LAST, mmap=True)["step"] for patience, folder in folders.items()}
    assert trained == {0: 3, 1: 2} and folders[0] != folders[1]  # each cell its own run, model and score
    assert records[0]["checkpoint"] == "checkpoint_0000003.pt"
    assert records[1]["checkpoint"] == "checkpoint_best.pt"  # stopped early: the best on validation is scored
    log = (folders[1] / "train.log").read_text()  # and is the model the summary names, fairseq's way
    assert f"the model to use: {folders[1] / 'checkpoint_best.pt'} (the best on validation" in log
    assert f"next: relnmt-translate checkpoint={folders[1] / 'checkpoint_best.pt'} " in log
    assert not list(tmp_path.rglob("experiment.json"))
    again = sweep(prepared, tmp_path, "train.patience=0,1")
    assert again.returncode == 0 and again.stderr.count(": done (") == 2, again.stderr[-3000:]
    assert "train update" not in again.stderr and "resuming from" not in again.stderr
    metric = sweep(prepared, tmp_path / "metric", "train.patience=1", "train.best_metric=nll,bleu")
    assert metric.returncode == 0, metric.stderr[-3000:]
    metrics = {json.loads(p.read_text())["config"]["train"]["best_metric"] for p in (tmp_path / "metric").glob(
        "*/result.json")}
    assert metrics == {"nll", "bleu"}


def test_a_scored_run_outside_hydras_command_line_refuses_a_typo(tmp_path):
    """nmt.experiment (and the demo) compose their job themselves: a typo is still refused in one line, exit 2."""
    done = subprocess.run([sys.executable, "-m", "nmt.experiment", "--output", str(tmp_path / "run"),
                           "+train.patiense=3"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "did you mean train.patience?" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()
