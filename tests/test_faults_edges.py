"""Nothing lost at the edges a cluster reaches (issue 56): ranks that read different data, a vocabulary too
small for its text, an experiment that does not average, a run folder that lost its whole state, an output that is
an input or a folder, a killed writer's temporary file, a refusal under torchrun's
restarts, and an old multi-process checkpoint's data position."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.checkpoints.checkpoint import LAST, PREVIOUS, global_data_position, numbered_checkpoints
from nmt.checkpoints.resume import first_disagreement
from nmt.config import OptimConfig, TrainConfig, TrainJob
from nmt.data.pipeline import prepared_dir
from nmt.data.readers import file_digest
from nmt.data.vocab import train_vocab
from nmt.outputs import process_alive
from nmt.train import run
from tests.conftest import (
    ROOT,
    data_overrides,
    micro_config,
    model_overrides,
    multi30k_lines,
    one_error_line,
    write,
)

ENV = {k: v for k, v in os.environ.items() if k != "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"}
ENV.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
SMALL = ["train.max_tokens=300", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1",
         "train.save_every_steps=2", "train.device=cpu"]


def cli(*args, stdin=None, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def run_dir(prepared, tmp_path_factory) -> Path:
    """A finished micro run: checkpoints 2 and 4, the whole state of both; one edge table per layer (exportable)."""
    out = tmp_path_factory.mktemp("run")
    run(TrainJob(model=micro_config(share_heads=True), data=prepared, optim=OptimConfig(warmup=2),
                 train=TrainConfig(max_steps=4, max_tokens=300, save_every_steps=2, valid_every=0, threads=1,
                                   valid_bleu_sentences=0, output_dir=str(out))))
    return out


# 1. Two ranks, two vocabularies; and a refusal under torchrun's restarts made once

def test_the_first_rank_whose_data_differs_from_rank_0s_is_found():
    same = {"manifest.json": "a", "spm.model": "b"}
    assert first_disagreement([same, dict(same), dict(same)]) is None
    assert first_disagreement([same, same, {**same, "spm.model": "c"}]) == (2, "spm.model")
    assert first_disagreement([same, {**same, "manifest.json": "x"}, {}]) == (1, "manifest.json")


def test_ranks_with_other_vocabularies_are_refused_once_under_torchruns_restarts(prepared, tmp_path):
    """Rank 1 reads a copy of the prepared folder whose SentencePiece model (same size) is another one, as a node
    prepared on its own disk: one line naming rank 1 and the file, every worker exit 2, and torchrun's three
    restarts end at once without saying it again."""
    ours = prepared_dir(prepared)
    theirs = tmp_path / "node1"
    shutil.copytree(ours, theirs)
    manifest = json.loads((theirs / "manifest.json").read_text())
    text = tmp_path / "other.txt"
    write(text, multi30k_lines("train", "de", 3000)[1500:] + multi30k_lines("train", "en", 3000)[1500:])
    train_vocab(text, tmp_path / "other", manifest["vocab_size"], 10_000)
    shutil.copy(tmp_path / "other.model", theirs / "spm.model")
    manifest["spm_sha256"] = file_digest(theirs / "spm.model")  # a whole, consistent folder of its own
    (theirs / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--max-restarts=3", "--monitor-interval=0.2", "-m", "tests.other_vocab_rank",
                           *data_overrides(prepared), *model_overrides(), *SMALL, "train.max_steps=4",
                           f"train.output_dir={out}"], cwd=ROOT, env={**ENV, "RANK1_PREPARED_DIR": str(theirs)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and done.stderr.count("Traceback") == 1  # torchrun's own report, no worker's
    assert done.stderr.count("failed (exitcode: 2)") == 4  # the first attempt and its 3 restarts, all refused
    said = [line for line in done.stderr.splitlines() if "reads other prepared data" in line]
    assert len(said) == 1, done.stderr[-3000:]
    assert f"rank 1 reads other prepared data than rank 0: its {ours / 'spm.model'} differs from rank 0's" in said[0]
    assert "exitcode  : 2" in done.stderr
    assert not list(out.glob("checkpoint_*.pt"))


def test_a_batch_out_of_reach_under_torchruns_restarts_is_refused_once(prepared, tmp_path):
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--max-restarts=3", "--monitor-interval=0.2", "-m", "nmt.train", *data_overrides(prepared),
                           *model_overrides(), *SMALL, "train.tokens_per_update=1000", "train.max_tokens=600",
                           f"train.output_dir={tmp_path / 'out'}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=300)
    said = [line for line in done.stderr.splitlines() if "train.tokens_per_update=1000 cannot be reached" in line]
    assert len(said) == 1 and done.stderr.count("failed (exitcode: 2)") == 4, done.stderr[-3000:]
    assert not (tmp_path / "out").exists()


# 2. A vocabulary smaller than the corpus's characters

def test_a_vocabulary_too_small_for_the_characters_is_one_line_naming_the_setting(prepared, tmp_path):
    local = [*data_overrides(prepared), f"data.prepared_dir={tmp_path / 'prepared'}"]
    done = cli("nmt.prepare", *local, "data.vocab_size=60")
    line = one_error_line(done, "data.vocab_size=60 is too small for this training text", "set data.vocab_size=")
    needed = int(line.split("set data.vocab_size=")[1].split()[0])
    assert needed > 260 and f"need {needed} word pieces" in line
    assert not (tmp_path / "prepared").exists() and not list(tmp_path.glob(".prepared*"))
    done = cli("nmt.prepare", *local, "data.vocab_sample=50")  # SentencePiece refuses samples of 1 to 100
    one_error_line(done, "data.vocab_sample=50 is invalid: it must be > 100")


# 3. An experiment whose recipe does not average

def test_an_experiment_that_does_not_average_decodes_its_newest_checkpoint(prepared, tmp_path):
    out = tmp_path / "exp"
    done = cli("nmt.experiment", "--output", str(out), "--lines", "5", *data_overrides(prepared), *model_overrides(),
               *SMALL, "train.max_steps=4", "train.average_last=0")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "train.average_last=0: decoding the newest checkpoint, checkpoint_0000004.pt (no average)" in done.stderr
    result = json.loads((out / "result.json").read_text())
    assert (result["checkpoint"], result["updates"], result["sentences"]) == ("checkpoint_0000004.pt", 4, 5)
    assert not (out / "averaged.pt").exists()


# 4. A run folder that lost its whole-state checkpoints

def test_numbered_checkpoints_without_a_whole_state_are_never_restarted_over(prepared, run_dir, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(run_dir, folder)
    for name in (LAST, PREVIOUS):
        (folder / name).unlink()  # a clean-up script, a partial copy
    before = listing(folder)
    done = cli("nmt.train", *data_overrides(prepared), *model_overrides(), *SMALL, "train.max_steps=6",
               f"train.output_dir={folder}")
    one_error_line(done, f"{folder} holds checkpoint_0000002.pt, checkpoint_0000004.pt but no whole training state "
                         f"({LAST}, {PREVIOUS}) to resume from", "Move them away to start afresh")
    after = listing(folder)
    assert {name: after[name] for name in before if name != "train.log"} == \
        {name: data for name, data in before.items() if name != "train.log"}
    assert [p.name for p in numbered_checkpoints(folder)] == ["checkpoint_0000002.pt", "checkpoint_0000004.pt"]


# 5. and 6. An output that is an input, or a folder

def test_translate_refuses_to_write_the_file_on_its_standard_input(run_dir, tmp_path):
    source = tmp_path / "in.en"
    source.write_text("A man rides a bike.\n")
    with open(source) as stdin:  # nmt.translate checkpoint=C output=in.en < in.en
        done = subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={run_dir / 'checkpoint_0000004.pt'}",
                               f"output={source}"], cwd=ROOT, env=ENV, stdin=stdin, capture_output=True, text=True,
                              timeout=300)
    one_error_line(done, f"output={source} is the standard input (/dev/stdin): writing it would destroy it")
    assert source.read_text() == "A man rides a bike.\n"


def test_translate_refuses_to_write_its_own_input(run_dir, tmp_path):
    source = tmp_path / "in.en"
    source.write_text("A man rides a bike.\nTwo dogs play.\n")
    done = cli("nmt.translate", f"checkpoint={run_dir / 'checkpoint_0000004.pt'}", f"input={source}",
               f"output={tmp_path / '.' / 'in.en'}")
    one_error_line(done, f"output={tmp_path / '.' / 'in.en'} is the input file ({source}): writing it would destroy "
                         "it; choose another output (nothing was written)")
    assert source.read_text() == "A man rides a bike.\nTwo dogs play.\n"


@pytest.mark.parametrize("tool", ["translate", "average", "score"])
def test_an_output_that_is_a_folder_is_one_line(run_dir, tmp_path, tool):
    folder = tmp_path / "somewhere"
    folder.mkdir()
    (tmp_path / "hyp").write_text("a\n")
    args = {"translate": [f"checkpoint={run_dir / 'checkpoint_0000004.pt'}"],
            "average": [f"directory={run_dir}", "last=2"],
            "score": [f"hyp={tmp_path / 'hyp'}", f"ref={tmp_path / 'hyp'}"]}[tool]
    done = cli(f"nmt.{tool}", *args, f"output={folder}", stdin="A man.\n")
    one_error_line(done, f"output={folder} is a folder: give the path of a file to write there")
    assert list(folder.iterdir()) == []


def test_average_and_score_refuse_to_write_over_their_inputs(run_dir, tmp_path):
    before = listing(run_dir)
    newest = run_dir / "checkpoint_0000004.pt"
    done = cli("nmt.average", f"directory={run_dir}", "last=2", f"output={newest}")
    one_error_line(done, f"output={newest} is the run's checkpoint checkpoint_0000004.pt ({newest}): writing it "
                         "would destroy it")
    done = cli("nmt.average", f"directory={run_dir}", "last=1", f"output={run_dir / LAST}")
    one_error_line(done, f"output={run_dir / LAST} is the run's checkpoint {LAST}")
    assert listing(run_dir) == before
    (tmp_path / "hyp.de").write_text("Ein Mann.\n")
    done = cli("nmt.score", f"hyp={tmp_path / 'hyp.de'}", f"ref={tmp_path / 'hyp.de'}",
               f"output={tmp_path / 'hyp.de'}")
    one_error_line(done, f"output={tmp_path / 'hyp.de'} is the hyp file")
    assert (tmp_path / "hyp.de").read_text() == "Ein Mann.\n"


# A killed writer's temporary file

def test_the_next_average_removes_a_killed_writers_temporary_file_and_keeps_a_live_ones(run_dir, tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        assert not process_alive(dead.pid) and process_alive(alive.pid)
        out, host = tmp_path / "out.pt", socket.gethostname()
        (tmp_path / f".out.pt.tmp-{host}-{dead.pid}").write_bytes(b"x" * 1000)  # SIGKILLed mid-write
        (tmp_path / f".out.pt.tmp-{host}-{alive.pid}").write_bytes(b"y")  # being written now
        (tmp_path / f".out.pt.tmp-othernode-{dead.pid}").write_bytes(b"z")  # another node's: not ours to judge
        done = cli("nmt.average", f"directory={run_dir}", "last=2", f"output={out}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f".out.pt.tmp-{host}-{alive.pid}",
                                                                      f".out.pt.tmp-othernode-{dead.pid}", "out.pt"])
    finally:
        alive.kill()
        alive.wait()


def test_the_next_export_removes_a_killed_exports_staging_folder(run_dir, tmp_path):
    pytest.importorskip("ctranslate2")
    from nmt.export import export

    dead = subprocess.Popen(["true"])
    dead.wait()
    staging = tmp_path / f".ct2.tmp-{socket.gethostname()}-{dead.pid}"
    staging.mkdir()
    (staging / "model.bin").write_bytes(b"x" * 1000)  # SIGTERM mid-export
    export(run_dir / "checkpoint_0000004.pt", tmp_path / "ct2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2"]


# An old multi-process checkpoint's data position

def test_an_old_multi_process_checkpoints_per_rank_position_is_read_as_global():
    new = {"step": 10, "batch": 40, "world_size": 4, "config": {"train": {"tokens_per_update": 0}}}
    old = {"step": 10, "batch": 10, "world_size": 4, "config": {"train": {"max_tokens": 300}}}  # before the field
    assert global_data_position(new) == 40
    assert global_data_position(old) == 40  # each of its 4 ranks had taken 10 batches
    assert global_data_position({**old, "world_size": 1}) == 10
