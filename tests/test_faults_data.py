"""A run knows its data: a resume onto other data is refused, a prepare that keeps no pair is refused, an empty
split never makes a loop wait for ever, a prepare during a run does not change what the run reads, and prepare's
workers fail as one process does and never outlive it."""

import errno
import json
import multiprocessing
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

from nmt.checkpoints.checkpoint import CheckpointError, load_checkpoint
from nmt.checkpoints.resume import check_same_data
from nmt.data import encode, pipeline
from nmt.data.batching import training_stream
from nmt.data.pipeline import open_prepared, prepare, prepared_dir
from nmt.data.readers import DataError, PairBlock, file_digest
from nmt.data.shards import ShardWriter
from nmt.data.vocab import Vocab
from tests.conftest import (INTERACTIVE, ROOT, data_overrides, local_config, make_corpus, model_overrides, multi30k_lines,
                            one_error_line, write)

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
SMALL = ["train.max_tokens=300", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1",
         "train.save_every_steps=2", "train.device=cpu"]


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def corpus_in(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return make_corpus(directory)


def other_corpus(directory: Path) -> Path:
    """Another local corpus of the same shape: later Multi30k lines."""
    directory.mkdir(parents=True, exist_ok=True)
    for lang in ("en", "de"):
        write(directory / f"train.{lang}", multi30k_lines("train", lang, 3000)[1500:])
        write(directory / f"valid.{lang}", multi30k_lines("val", lang, 40)[20:])
        write(directory / f"test.{lang}", multi30k_lines("test_2016_flickr", lang, 15))
    return directory


def test_a_run_resumed_onto_other_data_is_refused_in_one_line(tmp_path):
    first = local_config(corpus_in(tmp_path / "a"), prepared_dir=str(tmp_path / "prepared"))
    out = tmp_path / "run"
    made = cli("nmt.train", *data_overrides(first), *model_overrides(), *SMALL, "train.max_steps=2",
               f"train.output_dir={out}")
    assert made.returncode == 0, made.stderr[-2000:]
    record, last = (out / "config.yaml").read_bytes(), (out / "checkpoint_last.pt").read_bytes()
    assert load_checkpoint(out / "checkpoint_last.pt")["data"]["src"] == "en"

    second = local_config(other_corpus(tmp_path / "b"), prepared_dir=str(tmp_path / "prepared_b"))
    other = cli("nmt.train", *data_overrides(second), *model_overrides(), *SMALL, "train.max_steps=4",
                f"train.output_dir={out}")
    assert other.returncode == 2 and "Traceback" not in other.stderr
    error = [line for line in other.stderr.splitlines() if "ERROR" in line]
    assert len(error) == 1 and "holds a run trained on other data" in error[0], other.stderr[-2000:]
    assert f"{tmp_path}/b/train.en" in error[0] and "SentencePiece" in error[0]
    assert (out / "config.yaml").read_bytes() == record and (out / "checkpoint_last.pt").read_bytes() == last


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


@pytest.mark.parametrize("tool", ["nmt.prepare", "nmt.train"])
def test_a_prepared_folder_of_another_corpus_is_refused_not_rebuilt(tmp_path, tool):
    """`relnmt-train data=local data.train=<a new corpus> ... data.prepared_dir=prepared/multi30k_en_de`: the folder
    holds another corpus's vocabulary and shards (and runs trained on them); it is refused, naming both, not
    rebuilt; force=true replaces it, as the line says."""
    first = local_config(corpus_in(tmp_path / "a"), prepared_dir=str(tmp_path / "prepared"))
    target = prepare(first)
    before = folder_bytes(target)
    second = local_config(other_corpus(tmp_path / "b"), prepared_dir=str(tmp_path / "prepared"))
    extra = [*model_overrides(), *SMALL, "train.max_steps=2", f"train.output_dir={tmp_path / 'run'}"]
    done = cli(tool, *data_overrides(second), *(extra if tool == "nmt.train" else []))
    one_error_line(done, f"{target} holds another corpus: its data.train is {tmp_path}/a/train.en and "
                         f"{tmp_path}/a/train.de, not this job's {tmp_path}/b/train.en and {tmp_path}/b/train.de",
                   "nothing was changed", "force=true")
    assert folder_bytes(target) == before and not (tmp_path / "run").exists()
    prepare(second, force=True)  # the documented way to replace it
    assert f"{tmp_path}/b/train.en" in (target / "manifest.json").read_text()


def test_the_same_files_edited_rebuild_the_folder_saying_what_changed(tmp_path, caplog):
    cfg = local_config(corpus_in(tmp_path / "a"), prepared_dir=str(tmp_path / "prepared"))
    target = prepare(cfg)
    lines = (tmp_path / "a" / "train.de").read_text().split("\n")
    (tmp_path / "a" / "train.de").write_text("\n".join(["Etwas ganz anderes.", *lines[1:]]))
    with caplog.at_level("INFO", logger="nmt.data.pipeline"):
        prepare(local_config(tmp_path / "a", prepared_dir=str(target), max_len=90))
    assert f"{target}: rebuilding (stale: train.de changed; data.max_len 100 -> 90)" in caplog.text
    inputs = json.loads((target / "manifest.json").read_text())["key"]["inputs"]["train"]
    assert inputs[str(tmp_path / "a" / "train.de")] == file_digest(tmp_path / "a" / "train.de")


def test_the_data_check_names_pair_filters_and_vocabulary(prepared):
    data = open_prepared(prepared)
    state = {"data": data.identity, "vocab": torch.frombuffer(bytearray(data.spm_model), dtype=torch.uint8)}
    check_same_data(state, data.identity, data.spm_model, Path("out"))  # the same data: resumes
    changed = json.loads(json.dumps(data.identity))
    changed["tgt"], changed["filters"]["max_len"] = "fr", 50
    with pytest.raises(CheckpointError) as err:
        check_same_data(state, changed, data.spm_model + b"x", Path("out"))
    assert "the pair en-fr (the folder's run: en-de)" in str(err.value) and "'max_len': 50" in str(err.value)
    assert "another SentencePiece vocabulary" in str(err.value)
    check_same_data({"model": {}}, changed, data.spm_model, Path("out"))  # a checkpoint from before: nothing to compare


def test_a_prepare_that_keeps_no_pair_is_refused_naming_the_filter(corpus, tmp_path):
    cfg = local_config(corpus, max_len=1, prepared_dir=str(tmp_path / "none"))
    with pytest.raises(DataError, match=r"dropped all 1,500 \(.*by data.max_len=1 "):
        prepare(cfg)
    assert not prepared_dir(cfg).exists() and not list(tmp_path.glob(".none.tmp-*"))
    done = cli("nmt.prepare", *data_overrides(cfg)[:-1], "data.chunk_lines=400", timeout=120)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr and len(errors) == 1, done.stderr
    assert "no training pair left" in errors[0] and "data.max_len=1" in errors[0]


def empty_training_split(prepared_cfg, tmp_path) -> Path:
    """A copy of a prepared folder whose training split holds no pair (as prepare wrote it before it refused)."""
    copy = tmp_path / "empty"
    shutil.copytree(prepared_dir(prepared_cfg), copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for side in ("src", "tgt"):
        ShardWriter(copy, "train", side, manifest["vocab_size"]).close()
    manifest["stats"]["train"]["kept"] = 0
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_an_empty_training_split_is_refused_and_never_waited_for(prepared, tmp_path):
    from nmt.data.shards import EncodedSplit

    copy = empty_training_split(prepared, tmp_path)
    with pytest.raises(DataError, match="the training split holds no pair"):
        open_prepared(local_config(Path(prepared.train).parent, prepared_dir=str(copy)))
    with pytest.raises(ValueError, match="no batch can come"):
        next(training_stream(EncodedSplit(copy, "train", 600), 300, 1, 0, 1, 0, 0))
    started = time.monotonic()
    done = cli("nmt.train", *data_overrides(prepared, prepared_dir=copy), *model_overrides(), *SMALL,
               "train.max_steps=4", f"train.output_dir={tmp_path}/run", timeout=60)
    assert done.returncode == 2 and "holds no pair" in done.stderr and "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_a_prepare_during_a_run_does_not_change_what_the_run_reads(tmp_path):
    from nmt.config import TrainConfig
    from nmt.runtime.process import Env
    from nmt.training.validate import Validator

    cfg = local_config(corpus_in(tmp_path / "a"), prepared_dir=str(tmp_path / "prepared"))
    prepare(cfg)
    data = open_prepared(cfg)
    validator = Validator(data, cfg, 300, 5, 0.1, Env(), None, TrainConfig().loss_chunk_tokens)
    before = ([data.train[i][0].copy() for i in range(20)], validator.sentences, data.spm_model)
    prepare(local_config(other_corpus(tmp_path / "b"), prepared_dir=str(tmp_path / "prepared")), force=True)
    assert open_prepared(cfg).spm_model != before[2] or not np.array_equal(open_prepared(cfg).train[0][0], before[0][0])
    after = ([data.train[i][0] for i in range(20)], validator.sentences, data.spm_model)
    assert all(np.array_equal(a, b) for a, b in zip(before[0], after[0]))  # the open shards are the old files
    assert after[1] == before[1] and after[2] == before[2]


def test_a_full_disk_during_prepare_is_one_line_and_keeps_the_earlier_folder(corpus, monkeypatch):
    cfg = local_config(corpus)
    target = prepare(cfg)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    real = pipeline.write_split

    def full_disk(cfg, split, vocab, work, workers):
        real(cfg, split, vocab, work, workers)  # written whole, then the next split finds the disk full
        if split == "train":
            raise OSError(errno.ENOSPC, "No space left on device", str(work / "valid.000.bin"))

    monkeypatch.setattr(pipeline, "write_split", full_disk)
    with pytest.raises(DataError, match=rf"could not write the prepared data {target}: No space left on device "
                                        r"\(valid.000.bin\); [\d,]+ MiB free there; nothing was kept"):
        prepare(cfg, force=True)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before  # the earlier folder, whole
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".")] == []  # nothing half-written
    monkeypatch.undo()
    assert open_prepared(cfg).train is not None  # and it is still taken as up to date


def test_prepare_never_replaces_a_folder_it_did_not_write(tmp_path):
    """data.prepared_dir naming a folder of the user's (here the corpus's own): refused in one line, nothing lost."""
    corpus = corpus_in(tmp_path / "corpus")
    before = {p.name: p.read_bytes() for p in corpus.iterdir()}
    with pytest.raises(DataError, match="holds files that nmt.prepare did not write"):
        prepare(local_config(corpus, prepared_dir=str(corpus)))
    assert {p.name: p.read_bytes() for p in corpus.iterdir()} == before


# Prepare's workers: the one-worker errors, and no worker outliving its stage

def test_a_bad_line_is_the_same_error_on_workers(corpus):
    """A reading error past the first chunks, with the pool at work: the one-worker error, and nothing left behind."""
    valid_en = (corpus / "valid.en").read_bytes()
    lines = valid_en.split(b"\n")
    lines[14] = b"broken \xff byte"
    (corpus / "valid.en").write_bytes(b"\n".join(lines))
    test_de = (corpus / "test.de").read_text().split("\n")
    for workers in (1, 2):
        cfg = local_config(corpus, chunk_lines=3, workers=workers, prepared_dir=str(corpus / f"w{workers}"))
        with pytest.raises(DataError, match=rf"^{corpus}/valid.en:15: invalid UTF-8 at byte 7"):
            prepare(cfg)
        assert not [p for p in corpus.iterdir() if p.name.startswith((f"w{workers}", f".w{workers}"))]
    (corpus / "valid.en").write_bytes(valid_en)  # valid fine again, test one line short
    (corpus / "test.de").write_text("\n".join(test_de[:-2]) + "\n")
    for workers in (1, 2):
        cfg = local_config(corpus, chunk_lines=3, workers=workers, prepared_dir=str(corpus / f"w{workers}"))
        with pytest.raises(DataError, match=rf"^parallel files differ in length: {corpus}/test.en has 15 "
                                                    rf"lines, {corpus}/test.de has 14 lines"):
            prepare(cfg)
    (corpus / "test.de").write_text("\n".join(test_de))
    train_de = (corpus / "train.de").read_bytes()  # the training text, read first for the vocabulary: the same
    (corpus / "train.de").write_bytes(train_de.replace(b"\n", b"\n\xc3(", 999).replace(b"\n\xc3(", b"\n", 998))
    for workers in (1, 2):
        cfg = local_config(corpus, chunk_lines=300, workers=workers, prepared_dir=str(corpus / f"w{workers}"))
        with pytest.raises(DataError, match=rf"^{corpus}/train.de:1000: invalid UTF-8 at byte 0 \(invalid "
                                                    rf"continuation byte\)"):
            prepare(cfg)
    (corpus / "train.de").write_bytes(train_de)
    (corpus / "test.de").write_text("\n".join(test_de[:-2]) + "\n")
    test_en = (corpus / "test.en").read_bytes()  # and a bad line before the short end: its error comes first, even
    (corpus / "test.en").write_bytes(test_en.replace(b"\n", b" \xff\n", 2).replace(b" \xff\n", b"\n", 1))
    for workers in (1, 2):  # with its block still in a worker when the short end is read (3 blocks, 4 in flight)
        cfg = local_config(corpus, chunk_lines=5, workers=workers, prepared_dir=str(corpus / f"w{workers}"))
        with pytest.raises(DataError, match=rf"^{corpus}/test.en:2: invalid UTF-8"):
            prepare(cfg)


def test_an_interrupted_pool_ends_at_once_and_leaves_no_worker(corpus, monkeypatch):
    """Ctrl-C while the workers are busy (here: for a minute each): raised at once, no worker left running."""

    cfg = local_config(corpus, chunk_lines=2, workers=2)
    vocab = Vocab(prepare(local_config(corpus)) / "spm.model")

    def blocks_then_ctrl_c(*_):
        yield from [PairBlock([("a b", "c d")] * 2)] * 3  # fewer than the 4 in flight, so no result is waited for
        raise KeyboardInterrupt

    monkeypatch.setattr(encode, "read_blocks", blocks_then_ctrl_c)
    monkeypatch.setattr(encode, "encode_chunk", lambda *args: time.sleep(60))  # the forked workers' too
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        list(encode.map_blocks(cfg, "train", 2, vocab))
    assert time.monotonic() - start < 20
    assert multiprocessing.active_children() == []


def test_a_worker_killed_from_outside_is_one_line(corpus, monkeypatch):
    """A worker that dies (the OOM killer) ends prepare with one line naming the settings that bound its memory, and
    nothing is left behind."""
    parent, encode_here = os.getpid(), encode.encode_chunk
    monkeypatch.setattr(encode, "encode_chunk", lambda *args: encode_here(*args) if os.getpid() == parent
                        else os._exit(1))  # a forked worker dies at its first chunk
    monkeypatch.setattr(pipeline, "worker_count", lambda _: 2)
    with pytest.raises(DataError, match="a worker of prepare ended before its chunk was done "
                                                r"\(out of memory\?\): lower data.workers=2 or data.chunk_lines=400"):
        prepare(local_config(corpus))
    assert not [p for p in corpus.iterdir() if "prepared" in p.name]


BUSY_POOL = """import time
from nmt.cli import ends_in_one_line
from nmt.workers import worker_pool
def busy(_):
    print("busy", flush=True)  # in the worker, after its set-up: the signal meets a worker at work
    time.sleep(60)
with ends_in_one_line("prepare"), worker_pool(2, int) as pool:
    tasks = [pool.submit(busy, i) for i in range(2)]
    [task.result() for task in tasks]
"""


def live_in_session(session: int) -> int:
    """Processes of a session still running (a zombie has ended: init reaps it in its own time)."""
    alive = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            state, _, _, sid = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        alive += int(sid) == session and state != "Z"
    return alive


@pytest.mark.parametrize("how", ["SIGKILL to the parent", "Ctrl-C at a terminal"])
def test_a_pool_ends_with_its_stage(how):
    """A stage with two busy workers, killed (nothing of its own runs: its workers end too, none left working for
    nobody) or stopped by Ctrl-C (the terminal's SIGINT reaches every process of the group: one line, exit 130, no
    worker's traceback, no worker left)."""

    job = subprocess.Popen([sys.executable, "-c", BUSY_POOL], cwd=ROOT, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, **INTERACTIVE)
    try:
        said = ""  # both workers at work: two "busy" lines, which the two processes may write interleaved
        while said.count("busy") < 2 and (line := job.stdout.readline()):
            said += line
        assert said.count("busy") == 2, said
        if how == "Ctrl-C at a terminal":
            os.killpg(job.pid, signal.SIGINT)
            assert job.wait(timeout=60) == 130
            assert job.stderr.read().strip() == "interrupted (Ctrl-C)"
    finally:
        job.send_signal(signal.SIGKILL)
        job.wait()
    deadline = time.monotonic() + 10
    while live_in_session(job.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert live_in_session(job.pid) == 0
