"""Fine-tuning (train.init_from): a new run from a checkpoint's weights, everything else fresh, in a folder of its own;
refused in one line when the checkpoint's model or vocabulary is not the job's."""

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.checkpoints.checkpoint import LAST, CheckpointError, load_checkpoint, save_checkpoint, vocabulary_of
from nmt.data.pipeline import prepare
from nmt.data.readers import DataError
from nmt.data.vocab import given_vocabulary
from nmt.run_names import init_from_suffix
from nmt.train import run
from nmt.training import trainer as train_module
from tests.conftest import (ROOT, data_overrides, local_config, micro_config, micro_job, model_overrides,
                            one_error_line)


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


def in_domain_corpus(directory, prepared):
    """Another corpus than the `prepared` fixture's: later Multi30k lines, the fixture's validation and test files."""
    from tests.conftest import multi30k_lines, write

    directory.mkdir()
    for lang in ("en", "de"):
        write(directory / f"train.{lang}", multi30k_lines("train", lang, 2300)[1800:])
        for split in ("valid", "test"):
            (directory / f"{split}.{lang}").write_bytes(Path(getattr(prepared, split) + f".{lang}").read_bytes())
    return local_config(directory, prepared_dir=str(directory / "prepared"))


def test_a_corpus_prepared_with_a_checkpoints_vocabulary_fine_tunes_from_it(prepared, checkpoint, tmp_path):
    """data.vocab_from (fairseq's --srcdict): the checkpoint's SentencePiece model, byte for byte, encodes the new
    corpus, so train.init_from accepts it; a prepared folder or its spm.model give the same vocabulary."""
    domain = in_domain_corpus(tmp_path / "domain", prepared)
    learned = domain.prepared_dir
    prepare(domain)  # its own vocabulary: a fine-tuning run on it is refused, naming the remedy
    with pytest.raises(CheckpointError, match=rf"data.vocab_from={checkpoint}, in a data.prepared_dir of its own"):
        run(tuned_on(domain, tmp_path / "refused", checkpoint))

    domain.prepared_dir = str(tmp_path / "domain" / "given")
    domain.vocab_from = str(checkpoint)
    folder = prepare(domain)
    assert (folder / "spm.model").read_bytes() == vocabulary_of(checkpoint) != (Path(learned) / "spm.model").read_bytes()
    assert Path(prepared.prepared_dir, "spm.model").read_bytes() == vocabulary_of(checkpoint)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["key"]["vocab"] == {"type": "sentencepiece-bpe",
                                        "given": hashlib.sha256(vocabulary_of(checkpoint)).hexdigest()}
    stamp = (folder / "manifest.json").stat().st_mtime_ns
    for same in (prepared.prepared_dir, str(Path(prepared.prepared_dir) / "spm.model")):  # the same vocabulary
        domain.vocab_from = same
        prepare(domain)
        assert (folder / "manifest.json").stat().st_mtime_ns == stamp  # up to date: nothing rebuilt

    run(tuned_on(domain, tmp_path / "tuned", checkpoint))
    state = load_checkpoint(tmp_path / "tuned" / LAST)
    assert state["step"] == 2 and state["vocab"].numpy().tobytes() == vocabulary_of(checkpoint)

    domain.vocab_from = str(Path(learned) / "spm.model")  # another vocabulary: the folder is rebuilt with it
    prepare(domain)
    assert (folder / "spm.model").read_bytes() == (Path(learned) / "spm.model").read_bytes()


def tuned_on(data, out, checkpoint):
    job = micro_job(data, out, max_steps=2, init_from=str(checkpoint))
    job.model = micro_config(max_positions=80)
    return job


def test_a_vocabulary_that_cannot_be_given_is_one_line(prepared, checkpoint, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.model").write_bytes(b"not a sentencepiece model")
    weights_only = load_checkpoint(checkpoint)
    del weights_only["vocab"]
    save_checkpoint(weights_only, tmp_path / "no_vocab.pt")
    cases = {tmp_path / "missing": "no such file or folder",
             tmp_path / "empty": "no spm.model in that folder",
             tmp_path / "broken.model": "is not a SentencePiece model",
             tmp_path / "no_vocab.pt": "carries no vocabulary"}
    for path, why in cases.items():
        with pytest.raises(DataError, match=rf"data.vocab_from={path}: .*{why}"):
            given_vocabulary(str(path))
    domain = in_domain_corpus(tmp_path / "domain", prepared)
    done = subprocess.run([sys.executable, "-m", "nmt.prepare", *data_overrides(domain)[:1],
                           *[f"data.{k}={getattr(domain, k)}" for k in ("train", "valid", "test", "prepared_dir")],
                           f"data.vocab_from={tmp_path / 'broken.model'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    one_error_line(done, f"data.vocab_from={tmp_path / 'broken.model'}", "is not a SentencePiece model")
    assert not Path(domain.prepared_dir).exists()


def test_the_examples_in_domain_slice_keeps_the_pairs_that_mention_the_word(tmp_path):
    from experiments.domain_slice import read, write_slice

    counts = write_slice("dog", tmp_path)
    for split, n in counts.items():
        en = (tmp_path / f"{split}.en").read_text().splitlines()
        de = (tmp_path / f"{split}.de").read_text().splitlines()
        assert len(en) == len(de) == n > 0
        mentioned = [(s, t) for s, t in zip(read(split, "en"), read(split, "de"))
                     if re.search(r"\bdogs?\b", s, re.IGNORECASE)]
        assert list(zip(en, de)) == mentioned  # every such pair, in order, each line beside its own translation


def test_the_slice_never_writes_over_another_corpus(tmp_path):
    from experiments.domain_slice import write_slice

    (tmp_path / "train.en").write_text("a user's own line\n")
    with pytest.raises(FileExistsError, match="train.en exists and holds other text"):
        write_slice("dog", tmp_path)
    assert (tmp_path / "train.en").read_text() == "a user's own line\n" and not (tmp_path / "train.de").exists()
    (tmp_path / "train.en").unlink()
    assert write_slice("dog", tmp_path) == write_slice("dog", tmp_path)  # the same slice again: rewritten alike
