"""nmt.export: every mode CTranslate2 can hold translates token for token as relnmt does (greedy, beam 4 at
alpha 0, where the two searches are the same, and beam 4 at alpha 0.6 under relnmt's stop=finished); the
others are refused in one line; nmt.translate runs the export."""

import os
import subprocess
import sys

import pytest
import torch

from nmt.config import ModelConfig, OptimConfig, SearchConfig, TrainConfig, TrainJob
from nmt.decoding.decode import ExportedModel, encode_lines, load_translator, translate_ids
from nmt.export import export, refusal
from nmt.modes import Position, Stop
from nmt.train import run
from tests.conftest import ROOT, micro_config, multi30k_lines

ctranslate2 = pytest.importorskip("ctranslate2")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
EXPORTABLE = {"absolute": {}, "learned": {}, "none": {}, "relative": {}, "relative_key_only": {"rel_value": False},
              "t5": {"t5_buckets": 8, "t5_max_distance": 16}, "rope": {},
              "relative_buckets": {"edge_buckets": 8, "clip": 20}}


def trained(prepared, directory, **model) -> str:
    """A small model trained enough that most greedy outputs end before the length limit and differ."""
    run(TrainJob(model=micro_config(share_heads=True, dropout=0.0, max_positions=200, d_model=64, heads=4,
                                    ffn_dim=128, **model), data=prepared,
                 optim=OptimConfig(warmup=100, lr_scale=3.0),
                 train=TrainConfig(max_steps=300, max_tokens=800, save_every_steps=300, valid_every=0, threads=1,
                                   output_dir=str(directory), average_last=1)))
    return str(directory / "averaged.pt")


@pytest.fixture(scope="module")
def sentences(prepared):
    return multi30k_lines("test_2016_flickr", "en", 40)


@pytest.mark.parametrize("name", [name if name == "relative" else pytest.param(name, marks=pytest.mark.slow)
                                  for name in EXPORTABLE])  # make test: relative; make test-all (CI): every mode
def test_an_export_translates_token_for_token_as_relnmt(prepared, sentences, tmp_path, name):
    """Greedy: every line the same. Beam 4 at alpha 0: every line that ends before its length limit (at the limit
    relnmt scores the end of sentence it forces, CTranslate2 stops without one)."""
    position = name.removesuffix("_key_only").removesuffix("_buckets")
    checkpoint = trained(prepared, tmp_path / "run", position=Position(position), **EXPORTABLE[name])
    model, vocab = load_translator(checkpoint, torch.device("cpu"))
    exported, _ = load_translator(export(checkpoint, tmp_path / "ct2"), torch.device("cpu"))
    assert isinstance(exported, ExportedModel) and exported.cfg == model.cfg
    ids = encode_lines(vocab, sentences, None)
    greedy = SearchConfig(beam=1, max_extra=20)
    ours = translate_ids(model, ids, greedy, torch.device("cpu"))
    assert ours == translate_ids(exported, ids, greedy, None)
    assert len({tuple(row) for row in ours}) > 1  # the model says different things for different sentences
    beam = SearchConfig(beam=4, alpha=0.0, max_extra=20)
    ours, theirs = translate_ids(model, ids, beam, torch.device("cpu")), translate_ids(exported, ids, beam, None)
    ended = [i for i, row in enumerate(ours) if len(row) < len(ids[i]) + beam.max_extra]
    assert all(ours[i] == theirs[i] for i in ended), [i for i in ended if ours[i] != theirs[i]]
    assert len(ended) >= 20
    if name == "relative":  # at alpha 0.6 relnmt's stop=finished is CTranslate2's own search
        finished = SearchConfig(beam=4, alpha=0.6, max_extra=20, stop=Stop.finished)
        ours, theirs = translate_ids(model, ids, finished, torch.device("cpu")), translate_ids(exported, ids, finished,
                                                                                              None)
        ended = [i for i, row in enumerate(ours) if len(row) < len(ids[i]) + finished.max_extra]
        assert len(ended) >= 20 and all(ours[i] == theirs[i] for i in ended), [i for i in ended if ours[i] != theirs[i]]


@pytest.mark.parametrize("cfg,why", [
    (micro_config(position=Position.relative, share_heads=False), "model.share_heads=true"),
    (micro_config(position=Position.alibi), "ALiBi only in a decoder"),
    (micro_config(position=Position.both, share_heads=True), "sinusoids and edge tables together"),
])
def test_what_ctranslate2_cannot_hold_is_named(cfg, why):
    assert why in refusal(cfg)
    assert refusal(micro_config(position=Position.relative, share_heads=True)) is None


def test_the_export_command_refuses_per_head_tables_in_one_line(checkpoint, tmp_path):
    done = subprocess.run([sys.executable, "-m", "nmt.export", f"checkpoint={checkpoint}", f"output={tmp_path}/x"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr and not (tmp_path / "x").exists()
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "train with model.share_heads=true" in errors[0]


def test_translate_runs_an_exported_model_with_the_same_contract(prepared, tmp_path):
    run(TrainJob(model=micro_config(share_heads=True), data=prepared, optim=OptimConfig(warmup=4, lr_scale=2.0),
                 train=TrainConfig(max_steps=4, max_tokens=800, save_every_steps=4, valid_every=0, threads=1,
                                   output_dir=str(tmp_path / "run"), average_last=1)))
    checkpoint = tmp_path / "run" / "averaged.pt"
    out = tmp_path / "ct2_int8"
    made = subprocess.run([sys.executable, "-m", "nmt.export", f"checkpoint={checkpoint}", f"output={out}",
                           "quantization=int8"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    assert {"model.bin", "spm.model", "relnmt.json", "TRANSLATE.md"} <= {p.name for p in out.iterdir()}
    lines = ["A man rides a bike.", "", "Two dogs play in the snow.", "   "]
    for engine in (checkpoint, out):
        done = subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={engine}", "beam=2"], cwd=ROOT,
                              env=ENV, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        got = done.stdout.split("\n")[:-1]
        assert len(got) == 4 and got[1] == got[3] == "" and got[0] and got[2]  # non-empty sources: non-empty


def test_a_bad_quantization_is_one_line(checkpoint, tmp_path):
    done = subprocess.run([sys.executable, "-m", "nmt.export", f"checkpoint={checkpoint}", f"output={tmp_path}/x",
                           "quantization=int3"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "quantization=int3 is invalid" in done.stderr and "Traceback" not in done.stderr


def test_exported_config_round_trips():
    cfg = micro_config(position=Position.rope)
    assert ModelConfig(**{**cfg.__dict__}).check() == cfg.check()
