"""Fine-tuning (train.init_from): a new run from a checkpoint's weights, everything else fresh, in a folder of its own;
refused in one line when the checkpoint's model or vocabulary is not the job's."""

import subprocess
import sys

import pytest
import torch

from nmt.checkpoints.checkpoint import LAST, CheckpointError, load_checkpoint, save_checkpoint
from nmt.run_names import init_from_suffix
from nmt.train import run
from nmt.training import trainer as train_module
from tests.conftest import ROOT, data_overrides, micro_config, micro_job, model_overrides, one_error_line


def weights_at_first_update(monkeypatch) -> list[dict]:
    """The model's parameters as each run's first update begins, one entry per run."""
    seen, real = [], train_module.Trainer.train_step

    def spy(self, *args, **kwargs):
        if not seen or seen[-1][0] is not self:
            seen.append((self, {k: v.detach().clone() for k, v in self.model.state_dict().items()}))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(train_module.Trainer, "train_step", spy)
    return seen


def test_fine_tuning_starts_from_the_weights_with_a_fresh_optimizer_step_and_data_position(prepared, tmp_path,
                                                                                           monkeypatch):
    run(micro_job(prepared, tmp_path / "source", max_steps=4))
    source = tmp_path / "source" / "checkpoint_0000004.pt"
    seen = weights_at_first_update(monkeypatch)
    tuned = micro_job(prepared, tmp_path / "tuned", max_steps=2, seed=5, init_from=str(source))
    tuned.model = micro_config(dropout=0.3)  # regularization may differ; the shape may not
    run(tuned)
    run(micro_job(prepared, tmp_path / "fresh", max_steps=2, seed=5))  # the reference for what starts afresh
    start = seen[-2][1]  # the fine-tuning run's parameters before its first update: the checkpoint's
    assert start.keys() == load_checkpoint(source)["model"].keys()
    assert all(torch.equal(start[name], tensor) for name, tensor in load_checkpoint(source)["model"].items())
    assert not torch.equal(start["embed.weight"], seen[-1][1]["embed.weight"])  # not a fresh initialization

    state, fresh = load_checkpoint(tmp_path / "tuned" / LAST), load_checkpoint(tmp_path / "fresh" / LAST)
    assert (state["step"], state["epoch"], state["batch"]) == (fresh["step"], fresh["epoch"], fresh["batch"]) == \
        (2, fresh["epoch"], fresh["batch"])
    assert state["optimizer"]["param_groups"][0]["lr"] == fresh["optimizer"]["param_groups"][0]["lr"]  # the schedule
    assert all(moments["step"].item() == 2 for moments in state["optimizer"]["state"].values())  # Adam's, fresh
    assert not torch.equal(state["model"]["embed.weight"], start["embed.weight"])  # it trained
    # its record names the checkpoint it started from
    assert state["config"]["train"]["init_from"] == str(source)
    assert load_checkpoint(tmp_path / "tuned" / "checkpoint_0000002.pt")["config"]["train"]["init_from"] == str(source)
    assert f"init_from: {source}" in (tmp_path / "tuned" / "config.yaml").read_text()
    assert f"fine-tuning from the weights of {source}" in (tmp_path / "tuned" / "train.log").read_text()

    source.unlink()  # a resumed fine-tuning run continues from its own state: the source is not read again
    tuned.train.max_steps = 3
    run(tuned)
    assert load_checkpoint(tmp_path / "tuned" / LAST)["step"] == 3
    tuned.train.init_from = str(tmp_path / "source" / LAST)  # init_from defines the run
    with pytest.raises(CheckpointError, match=r"holds another run: train.init_from="):
        run(tuned)


def test_another_model_or_vocabulary_is_refused_in_one_line(prepared, checkpoint, tmp_path):
    """The `checkpoint` fixture: the micro model with max_positions=80, on the prepared data's vocabulary."""
    def tuned(out, init_from, **model):
        j = micro_job(prepared, tmp_path / out, max_steps=2, init_from=str(init_from))
        j.model = micro_config(**{"max_positions": 80, **model})
        return j

    with pytest.raises(CheckpointError, match=r"model.d_model=64 \(the checkpoint's: 32\); model.heads=4 "):
        run(tuned("wider", checkpoint, d_model=64, heads=4))
    assert not (tmp_path / "wider").exists()  # refused before it trained: no folder of a run that never was
    with pytest.raises(CheckpointError, match=r"model.position=absolute \(the checkpoint's: relative\)"):
        run(tuned("absolute", checkpoint, position="absolute"))

    other = load_checkpoint(checkpoint)
    other["vocab"] = torch.frombuffer(bytearray(b"another sentencepiece model"), dtype=torch.uint8)
    save_checkpoint(other, tmp_path / "other_vocab.pt")
    done = subprocess.run([sys.executable, "-m", "nmt.train", *data_overrides(prepared),
                           *model_overrides(max_positions=80, ffn_dim=128), "train.max_steps=2", "train.threads=1",
                           f"train.init_from={tmp_path / 'other_vocab.pt'}", f"train.output_dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    line = one_error_line(done, "train.init_from=", "model.ffn_dim=128 (the checkpoint's: 64)",
                          "its vocabulary is another SentencePiece model than the prepared data's")
    assert "spm.model" in line and not (tmp_path / "run").exists()
    with pytest.raises(CheckpointError, match=r"train.init_from=.*missing.pt: checkpoint not found"):
        run(tuned("missing", tmp_path / "missing.pt"))


def test_a_fine_tuning_run_gets_a_default_folder_of_its_own():
    assert init_from_suffix(["model.clip=4", "train.init_from=outputs/tiny_multi30k_en_de/checkpoint_best.pt"]) == \
        ".from-tiny_multi30k_en_de-checkpoint_best"
    assert init_from_suffix(["model.clip=4"]) == "" and init_from_suffix(["train.init_from=null"]) == ""
    assert len(init_from_suffix([f"train.init_from={'x' * 300}/a.pt"])) <= 60
