"""Shared fixtures: a small real corpus cut from the bundled Multi30k."""

import contextlib
import gzip
import logging
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# Without a GPU, Triton kernels run in its interpreter (tests/test_kernels.py). The switch is read when
# Triton defines its own library functions, so it must be set before anything imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from nmt.config import DataConfig, ModelConfig

ROOT = Path(__file__).resolve().parent.parent
MULTI30K = ROOT / "data" / "multi30k"


# The micro model the tests train and run: one home for its shape; a test that needs another overrides fields.
MICRO_MODEL = dict(encoder_layers=1, decoder_layers=1, d_model=32, heads=2, ffn_dim=64, clip=4)


def micro_config(**overrides) -> ModelConfig:
    return ModelConfig(**{**MICRO_MODEL, **overrides})


def micro_job(data: DataConfig, out: Path, **train):
    """A few updates of the micro model on a prepared corpus (the `prepared` fixture), in `out`."""
    from nmt.config import OptimConfig, TrainConfig, TrainJob

    fields = dict(max_steps=6, max_tokens=600, save_every_steps=2, keep_last=10, log_every=1, valid_every=0,
                  output_dir=str(out), threads=1, seed=3)
    return TrainJob(model=micro_config(), data=data,
                    optim=OptimConfig(warmup=4, lr_scale=2.0), train=TrainConfig(**{**fields, **train}))


def model_overrides(**overrides) -> list[str]:
    """The micro model as nmt.train's command-line overrides."""
    return [f"model.{k}={v}" for k, v in {**MICRO_MODEL, **overrides}.items()]


def data_overrides(data: DataConfig, **overrides) -> list[str]:
    """A prepared local corpus (the `prepared` fixture) as command-line overrides."""
    fields = ("train", "valid", "test", "vocab_size", "max_len", "max_ratio", "prepared_dir", "chunk_lines")
    return ["data=local", *[f"data.{k}={overrides.get(k, getattr(data, k))}" for k in fields]]


def one_error_line(done, *wanted: str) -> str:
    """The job ended with exit 2, its last line holding each wanted text, said once, and no traceback."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr and lines, done.stderr[-2000:]
    assert all(text in lines[-1] for text in wanted), done.stderr[-2000:]
    assert sum(wanted[0] in line for line in lines) == 1, done.stderr[-2000:]
    return lines[-1]


def wait_for(predicate, seconds=120):
    """Poll until predicate() holds (a run reaching an update, a file appearing); TimeoutError after `seconds`."""
    import time

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError("not there in time")


def multi30k_lines(split, lang, n):
    with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


def write(path: Path, lines, newline="\n", bom=False):
    text = ("\ufeff" if bom else "") + "".join(line + newline for line in lines)
    path.write_bytes(text.encode("utf-8"))


@contextlib.contextmanager
def process_state_kept():
    """Whatever runs inside (a job run in-process: nmt.train.run sets threads, the allocator, a forced logging
    configuration with a file handler, warnings capture, the global seeds; torch.compile leaves dynamo's caches;
    a kernel case's failure is remembered module-wide) leaves the process as it was found."""
    from nmt.runtime import memory

    threads, root = torch.get_num_threads(), logging.getLogger()
    handlers, level = list(root.handlers), root.level
    capturing = logging._warnings_showwarning is not None  # logging.captureWarnings(True) is on
    seeds = torch.get_rng_state(), random.getstate(), np.random.get_state()
    deterministic, heap = torch.are_deterministic_algorithms_enabled(), memory.heap_retained
    environ = dict(os.environ)
    cases = sys.modules.get("nmt.kernels.cases")
    failed = set(cases.BACKWARD_FAILED) if cases else None
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:], root.level = handlers, level
        logging.captureWarnings(capturing)
        torch.set_rng_state(seeds[0])
        random.setstate(seeds[1])
        np.random.set_state(seeds[2])
        torch.use_deterministic_algorithms(deterministic)
        if memory.heap_retained != heap:
            memory.retain_freed_memory(heap)
        os.environ.clear()
        os.environ.update(environ)
        if cases is not None:
            cases.BACKWARD_FAILED.clear()
            cases.BACKWARD_FAILED.update(failed)
        if "torch._dynamo" in sys.modules:
            sys.modules["torch._dynamo"].reset()


@pytest.fixture(autouse=True)
def process_state_restored():
    """Every test leaves the process as it found it, so the suite passes in any order."""
    with process_state_kept():
        yield


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path)


def make_corpus(tmp_path: Path) -> Path:
    """A small local corpus cut from Multi30k, with hand-placed lines the filters must catch."""
    en, de = multi30k_lines("train", "en", 1500), multi30k_lines("train", "de", 1500)
    en[10], de[10] = "", "Ein Satz ohne Quelle."
    en[20], de[20] = "   ", "   "
    en[30], de[30] = " ".join(["word"] * 150), " ".join(["Wort"] * 150)  # too long at max_len 100
    en[40], de[40] = "Hi.", "Ein sehr langer deutscher Satz mit vielen zusätzlichen Wörtern darin."
    write(tmp_path / "train.en", en)
    write(tmp_path / "train.de", de)
    valid_en = multi30k_lines("val", "en", 20)
    valid_en[3] = ""  # valid/test keep every line, even an empty one
    write(tmp_path / "valid.en", valid_en)
    write(tmp_path / "valid.de", multi30k_lines("val", "de", 20))
    write(tmp_path / "test.en", multi30k_lines("test_2016_flickr", "en", 15), newline="\r\n", bom=True)
    write(tmp_path / "test.de", multi30k_lines("test_2016_flickr", "de", 15), newline="\r\n")
    return tmp_path


def local_config(directory: Path, **overrides) -> DataConfig:
    fields = dict(name="local", src="en", tgt="de", train=str(directory / "train"), valid=str(directory / "valid"),
                  test=str(directory / "test"), vocab_size=600, max_len=100, max_ratio=2.5,
                  prepared_dir=str(directory / "prepared"), chunk_lines=400)
    return DataConfig(**{**fields, **overrides})


@pytest.fixture(scope="session")
def prepared(tmp_path_factory):
    """A prepared (vocab + shards) copy of the corpus above, built once per test session."""
    from nmt.data.pipeline import prepare

    directory = tmp_path_factory.mktemp("prepared_corpus")
    make_corpus(directory)
    cfg = local_config(directory)
    with process_state_kept():
        prepare(cfg)
    return cfg


@pytest.fixture(scope="session")
def checkpoint(prepared, tmp_path_factory):
    """A micro model trained 20 updates on the prepared corpus: averaged.pt of its last two checkpoints."""
    from nmt.config import OptimConfig, TrainConfig, TrainJob
    from nmt.train import run

    out = tmp_path_factory.mktemp("trained")
    with process_state_kept():
        run(TrainJob(model=micro_config(max_positions=80), data=prepared, optim=OptimConfig(warmup=10, lr_scale=2.0),
                     train=TrainConfig(max_steps=20, max_tokens=800, save_every_steps=10, valid_every=0,
                                       output_dir=str(out), threads=1, average_last=2)))
    return out / "averaged.pt"


def at_a_terminal() -> None:
    """A child's SIGINT as a shell gives a foreground job: Python's Ctrl-C, whatever this process inherited (a test
    run from `nohup` or a scheduler starts with SIGINT ignored, and a child keeps an ignored signal ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


INTERACTIVE = {"preexec_fn": at_a_terminal}  # Popen(..., **INTERACTIVE): a child that Ctrl-C reaches as at a terminal


def fake_cell(folder, hyps: list[str], refs: list[str], seed: int, *overrides: str) -> dict:
    """A scored cell as nmt/lab/record.py writes one, of `relnmt-train -m +study=table3 <overrides> train.seed=<seed>`."""
    import json

    from omegaconf import OmegaConf

    from nmt.compose import cell_name_for, composed
    from nmt.score import score

    cfg = composed(["+study=table3", *overrides, f"train.seed={seed}"], with_hydra=True)
    cell = folder / cell_name_for(["+study=table3", *overrides, f"train.seed={seed}"])
    cell.mkdir(parents=True)
    (cell / "test.hyp.de").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    config = {section: {k: v for k, v in OmegaConf.to_container(cfg[section], enum_to_str=True).items()
                        if k != "output_dir"} for section in ("model", "optim", "train", "data")}
    result = {"pair": "en-de", "seed": seed, "hyp": "test.hyp.de", "split": cfg.train.score_split,
              **score(hyps, refs, "de"),
              "overrides": list(overrides), "config": config,
              "choices": {name: cfg.hydra.runtime.choices.get(name) for name in ("model", "data", "experiment")}}
    (cell / "result.json").write_text(json.dumps(result))
    return result


def multi30k(split: str) -> list[str]:
    """Multi30k's bundled German references of a split (test_2016_flickr, val)."""
    with gzip.open(MULTI30K / f"{split}.de.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]
