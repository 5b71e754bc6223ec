"""The best checkpoint and early stopping: validation keeps checkpoint_best.pt by train.best_metric, train.patience
ends the run normally, and a run stopped by a signal and resumed decides as an uninterrupted one."""

import errno
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.average import average
from nmt.checkpoints.checkpoint import BEST, LAST, CheckpointError, load_checkpoint, numbered_checkpoints, save_best
from nmt.config import ConfigError, TrainConfig
from nmt.errors import Stopped, UserError
from nmt.modes import BestMetric
from nmt.train import run
from nmt.training import trainer as train_module
from nmt.training.best import BestValidation
from nmt.training.validate import Validator
from tests.conftest import ROOT, data_overrides, micro_job, model_overrides

# The validation nll at each validated update (train.valid_every=2): the best at update 4; 8 ties it, which is no
# improvement; with train.patience=2 the run stops at update 8.
NLL = {2: 3.0, 4: 2.0, 6: 2.5, 8: 2.0, 10: 1.0, 12: 0.5}


def scripted_validation(monkeypatch, metric: str, sigterm_after: int | None = None) -> None:
    """Validation scores by update (NLL; BLEU falls as nll rises, so both metrics pick the same updates), and
    optionally a SIGTERM to this process during update `sigterm_after` (the run stops at the next one)."""
    trainers, init, step = [], train_module.Trainer.__init__, train_module.Trainer.train_step

    def register(self, *args, **kwargs):
        init(self, *args, **kwargs)
        trainers.append(self)

    def step_then_signal(self, *args, **kwargs):
        stats = step(self, *args, **kwargs)
        if self.step == sigterm_after:
            os.kill(os.getpid(), signal.SIGTERM)
        return stats

    def scores(self, model):
        nll = NLL[trainers[-1].step]
        return {"loss": nll, "nll": nll, **({"bleu_greedy": 40 - 10 * nll} if metric == "bleu" else {})}

    monkeypatch.setattr(train_module.Trainer, "__init__", register)
    monkeypatch.setattr(train_module.Trainer, "train_step", step_then_signal)
    monkeypatch.setattr(Validator, "__call__", scores)


def early_job(prepared, out, metric="nll", **train):
    return micro_job(prepared, out, **{**dict(max_steps=12, valid_every=2, save_every_steps=2, keep_last=0, patience=2,
                                        best_metric=metric, valid_bleu_sentences=4, average_last=2), **train})


@pytest.mark.parametrize("metric", ["nll", "bleu"])
def test_best_checkpoint_holds_the_best_validations_weights_and_patience_ends_the_run(prepared, tmp_path,
                                                                                        monkeypatch, metric):
    scripted_validation(monkeypatch, metric)
    run(early_job(prepared, tmp_path, metric))  # returns normally: exit 0
    last, best = load_checkpoint(tmp_path / LAST), load_checkpoint(tmp_path / BEST)
    assert last["step"] == 8 and last["saved_for"] != "signal"  # the second validation without improvement: regular
    assert best["step"] == 4 and best["best"]["step"] == 4 and best["best"]["metric"] == metric
    at_best = load_checkpoint(tmp_path / "checkpoint_0000004.pt")
    assert best.keys() >= {"model", "config", "vocab", "step"} and "optimizer" not in best
    assert all(torch.equal(tensor, at_best["model"][name]) for name, tensor in best["model"].items())
    assert not torch.equal(best["model"]["embed.weight"], last["model"]["embed.weight"])
    assert "stopped early at update 8: train.patience=2" in (tmp_path / "train.log").read_text()
    # the run ended as usual: its average of the regular checkpoints, which never take checkpoint_best.pt
    assert load_checkpoint(tmp_path / "averaged.pt")["averaged_from"] == ["checkpoint_0000006.pt",
                                                                          "checkpoint_0000008.pt"]
    assert BEST not in [p.name for p in numbered_checkpoints(tmp_path)]
    with pytest.raises(UserError, match="checkpoint_best.pt"):  # nor does nmt.average write over it
        average(str(tmp_path), 1, str(tmp_path / BEST))

    from nmt.config import SearchConfig
    from nmt.decoding.decode import load_translator, translate_lines  # decoding takes it as it is

    model, vocab = load_translator(tmp_path / BEST, torch.device("cpu"))
    assert len(translate_lines(model, vocab, ["A dog runs.", ""], SearchConfig(beam=2, max_extra=5))) == 2

    run(early_job(prepared, tmp_path, metric))  # the same command again: the run stays ended
    assert load_checkpoint(tmp_path / LAST)["step"] == 8
    with pytest.raises(CheckpointError, match=r"train.patience=0 \(the folder's run: 2\)"):
        run(early_job(prepared, tmp_path, metric, patience=0))  # patience decides the scored model: another run
    assert load_checkpoint(tmp_path / LAST)["step"] == 8


@pytest.mark.parametrize("sigterm_after", [3, 5, 6])
def test_a_run_stopped_by_sigterm_and_resumed_decides_as_an_uninterrupted_one(prepared, tmp_path, monkeypatch,
                                                                              sigterm_after):
    """SIGTERM during update 3 or 5 stops the run at update 4 or 6, a validation's update, whose validation the stop
    skips (4 is the best); during update 6, at update 7, between validations."""
    scripted_validation(monkeypatch, "nll")
    run(early_job(prepared, tmp_path / "straight", save_every_steps=1000))
    scripted_validation(monkeypatch, "nll", sigterm_after)
    with pytest.raises(Stopped):
        run(early_job(prepared, tmp_path / "stopped", save_every_steps=1000))
    assert load_checkpoint(tmp_path / "stopped" / LAST)["step"] == sigterm_after + 1
    run(early_job(prepared, tmp_path / "stopped", save_every_steps=1000))
    for name in (LAST, BEST):
        straight, resumed = load_checkpoint(tmp_path / "straight" / name), load_checkpoint(tmp_path / "stopped" / name)
        assert straight["step"] == resumed["step"] and straight["best"] == resumed["best"], name
        assert all(torch.equal(t, resumed["model"][k]) for k, t in straight["model"].items()), name
    assert load_checkpoint(tmp_path / "stopped" / LAST)["step"] == 8
    assert "stopped early at update 8" in (tmp_path / "stopped" / "train.log").read_text()


def test_a_failed_or_non_finite_best_keeps_the_earlier_best_whole(tmp_path, monkeypatch, caplog):
    record = {"metric": "nll", "score": 2.0, "step": 4}
    assert save_best({"model": {"w": torch.ones(2)}, "step": 4}, tmp_path, record)
    real = torch.save

    def full_disk(state, path, *args, **kwargs):
        Path(path).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", full_disk)
    assert not save_best({"model": {"w": torch.zeros(2)}, "step": 6}, tmp_path, {**record, "step": 6})
    monkeypatch.setattr(torch, "save", real)
    assert not save_best({"model": {"w": torch.tensor([1.0, float("nan")])}, "step": 8}, tmp_path, record)
    kept = load_checkpoint(tmp_path / BEST)
    assert kept["step"] == 4 and torch.equal(kept["model"]["w"], torch.ones(2)) and kept["saved_for"] == "best"
    assert sorted(p.name for p in tmp_path.iterdir()) == [BEST]  # no temporary file left
    assert "could not keep update 6 as checkpoint_best.pt" in caplog.text and "No space left" in caplog.text
    assert "update 8 not kept as checkpoint_best.pt: w holds NaN or inf values" in caplog.text


def test_patience_and_bleu_need_what_they_count():
    with pytest.raises(ConfigError, match="train.patience=3 is invalid"):
        TrainConfig(patience=3, valid_every=0).check()
    with pytest.raises(ConfigError, match="train.best_metric=bleu is invalid"):
        TrainConfig(best_metric="bleu", valid_bleu_sentences=0).check()


@pytest.mark.slow
def test_under_torchrun_rank_0_decides_and_every_rank_stops_at_the_same_update(prepared, tmp_path):
    """Two gloo workers and one process with two micro-batches per update take the same updates, so they keep the
    same best checkpoint and stop at the same update; a rank that went on alone would hang the job at its next
    collective (the timeout here)."""
    overrides = [*data_overrides(prepared), *model_overrides(dropout=0.0), "optim.warmup=2", "optim.lr_scale=20",
                 "train.max_steps=16", "train.max_tokens=300", "train.valid_every=1", "train.patience=2",
                 "train.valid_bleu_sentences=0", "train.seed=3", "train.threads=1", "train.save_every_steps=1000"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "nmt.train", *overrides, f"train.output_dir={tmp_path}/ddp"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    single = subprocess.run([sys.executable, "-m", "nmt.train", *overrides, "train.update_freq=2",
                             f"train.output_dir={tmp_path}/single"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0 and single.returncode == 0, ddp.stderr[-3000:] + single.stderr[-3000:]
    for name in (LAST, BEST):
        got, want = load_checkpoint(tmp_path / "ddp" / name), load_checkpoint(tmp_path / "single" / name)
        assert got["step"] == want["step"] and got["best"]["step"] == want["best"]["step"], name
    assert load_checkpoint(tmp_path / "ddp" / LAST)["step"] < 16  # patience stopped it
    assert "stopped early at update" in (tmp_path / "ddp" / "train.log").read_text()


def test_another_metric_on_a_resume_chooses_the_best_afresh():
    record = BestValidation("nll", score=2.0, step=4, since=3, validated=8)
    assert BestValidation.resumed(record.state_dict(), BestMetric.nll) == record
    assert BestValidation.resumed(record.state_dict(), BestMetric.bleu) == BestValidation("bleu", validated=8)
    assert BestValidation.resumed(None, BestMetric.nll) == BestValidation("nll")  # a state saved before it existed
