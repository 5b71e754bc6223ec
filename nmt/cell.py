"""A cell of a -m sweep (`python -m nmt.train -m ... model.clip=0,4,16`): a run in a folder named by the overrides
that define it (configs/train.yaml, nmt/run_names.py), which ends in its score. After training, rank 0 decodes
train.score_split of the prepared data (beam 4, alpha 0.6) with the checkpoint the recipe leaves (averaged.pt where
it averages, else checkpoint_last.pt) and writes the score to CELL/result.json, beside the hypotheses. A cell whose
result.json holds its budget is done: the same sweep run again skips it. `python -m nmt.table SWEEP_FOLDER` collects
the cells into a table. nmt.experiment decodes and scores its run with the same function."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable

import torch

from nmt.checkpoints.checkpoint import load_checkpoint, numbered_checkpoints
from nmt.cluster import export_ranks, requeue_after
from nmt.config import ConfigError, DataConfig, SearchConfig, TrainJob
from nmt.data.pipeline import prepared_dir
from nmt.data.readers import read_lines
from nmt.decoding.decode import load_translator, translate_lines
from nmt.errors import Stopped, UserError
from nmt.machine import host, machine
from nmt.outputs import write_json
from nmt.recorded_config import plain_job
from nmt.run_names import defines_run
from nmt.runtime.process import resolve_device
from nmt.score import score

RESULT = "result.json"


def is_sweep_cell() -> bool:
    """Whether this job is one cell of a Hydra -m sweep (any launcher)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def cell_finished(job: TrainJob) -> bool:
    """A cell whose result is this run's, at this budget (train.max_steps), split and lines, is done. A longer budget
    continues it; a result of another run in the folder (a definition changed under the same name) leaves it to the
    trainer, which refuses it in one line naming the fields."""
    path = Path(job.train.output_dir) / RESULT
    if not path.is_file():
        return False
    result, train = json.loads(path.read_text()), job.train
    if (result.get("updates"), result.get("split"), result.get("score_lines", 0)) != \
            (train.max_steps, train.score_split, train.score_lines) or \
            defining_config(result.get("config", {})) != defining_config(plain_job(job)):
        return False
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"{path.parent}: done ({train.max_steps} updates, scored in {path.name})", file=sys.stderr)
    return True


def defining_config(config: dict) -> dict:
    """A resolved job's fields that define its run (nmt.run_names.defines_run)."""
    return {section: {name: value for name, value in config.get(section, {}).items() if defines_run(section, name)}
            for section in ("model", "optim", "train", "data")}


def run_cell(job: TrainJob, train: Callable[[TrainJob], Path]) -> None:
    """The cell's job: skipped when done; trained (`train`: nmt.train.run); on a submitit job's preemption signal,
    requeued after its checkpoint; then scored by rank 0, the other ranks waiting for its score (under torchrun they
    go on to the next cell together)."""
    from hydra.core.hydra_config import HydraConfig

    if any(o.startswith("train.output_dir=") for o in HydraConfig.get().overrides.task):
        raise ConfigError("train.output_dir in a -m sweep would put every cell in one folder: leave it out (each cell "
                          "trains in hydra.sweep.dir/<its overrides>)")
    export_ranks()  # a submitit job's tasks learn their ranks here, before anything below reads RANK
    if cell_finished(job):
        return
    main, failed = int(os.environ.get("RANK", "0")) == 0, Path(job.train.output_dir) / SCORE_FAILED
    if main:
        failed.unlink(missing_ok=True)  # an earlier attempt's: the other ranks read it only after this training
    try:
        out = train(job)
    except Stopped as stopped:
        requeue_after(getattr(stopped, "signal_name", None))
        raise
    if not main:
        return wait_for_score(out / RESULT, failed)
    try:
        score_cell(job, out)
    except BaseException:
        failed.touch()  # the other ranks stop waiting
        raise


SCORE_FAILED = ".score_failed"  # rank 0 could not score the cell (its log says why)
SCORE_WAIT_S = 6 * 3600  # rank 0 averages, decodes and scores: minutes on a GPU


def wait_for_score(path: Path, failed: Path, poll_s: float = 2.0) -> None:
    """Block until rank 0 has written the cell's score; a UserError when it says it could not, or after
    SCORE_WAIT_S (a rank 0 that died without a word)."""
    deadline = time.monotonic() + SCORE_WAIT_S
    while not path.is_file():
        if failed.exists() or time.monotonic() > deadline:
            raise UserError(f"rank 0 did not score the cell in {path.parent}: its log says why")
        time.sleep(poll_s)


def checkpoint_to_decode(output: Path, average_last: int, log=None) -> Path:
    """What a run decodes: the average its recipe asks for (train.average_last=N: averaged.pt), else the run's newest
    checkpoint, said in a log line. A recipe without averaging still ends in its score."""
    if average_last > 0:
        return output / "averaged.pt"
    newest = numbered_checkpoints(output)[-1]
    if log is not None:
        log.info("train.average_last=0: decoding the newest checkpoint, %s (no average)", newest.name)
    return newest


def decode_and_score(checkpoint: Path, data: DataConfig, split: str, search: SearchConfig, output: Path,
                     lines: int | None = None, device_name: str = "auto", log=None) -> dict:
    """Decode the prepared `split` (its first `lines` sentences if given) with `checkpoint` into
    output/<split>.hyp.<tgt> and score it against its reference: the score record's common part."""
    data_dir = prepared_dir(data)
    device = resolve_device(device_name)
    model, vocab = load_translator(checkpoint, device)
    sources = list(read_lines(data_dir / f"{split}.{data.src}"))[:lines]
    refs = list(read_lines(data_dir / f"{split}.{data.tgt}"))[:lines]
    if log is not None:
        log.info("decoding %d %s sentences with beam %d, alpha %g", len(sources), split, search.beam, search.alpha)
    started = time.monotonic()
    hyps = translate_lines(model, vocab, sources, search, device, progress=True)
    decode_seconds = time.monotonic() - started
    hyp_path = output / f"{split}.hyp.{data.tgt}"
    hyp_path.write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    return {**score(hyps, refs, data.tgt), "pair": f"{data.src}-{data.tgt}", "split": split,
            "sentences": len(sources), "beam": search.beam, "alpha": search.alpha,
            "ref": str(data_dir / f"{split}.{data.tgt}"), "hyp": hyp_path.name,
            "decode_seconds": round(decode_seconds, 1), "device": machine(device), "host": host(),
            "threads": torch.get_num_threads()}


def score_cell(job: TrainJob, out: Path) -> dict:
    """Decode and score the finished cell in `out`; write out/result.json (whole or not at all) and return it."""
    from hydra.core.hydra_config import HydraConfig

    checkpoint = checkpoint_to_decode(out, job.train.average_last)
    state = load_checkpoint(checkpoint, mmap=True)
    result = decode_and_score(checkpoint, job.data, job.train.score_split, SearchConfig(), out,
                              job.train.score_lines or None, job.train.device)
    resolved = plain_job(job)
    result.update({"overrides": list(HydraConfig.get().overrides.task), "cell": out.name, "seed": job.train.seed,
                   "score_lines": job.train.score_lines,
                   "updates": state["step"], "checkpoint": checkpoint.name,
                   "averaged_from": state.get("averaged_from"),
                   "model": {name: resolved["model"][name] for name in ("position", "clip", "rel_key", "rel_value",
                                                                        "share_heads", "edge_buckets")},
                   "config": resolved})
    write_json(out / RESULT, result)
    print(f"{out}: sacreBLEU {result['bleu']:.2f} on {result['sentences']} {result['split']} sentences "
          f"({checkpoint.name}, {result['updates']} updates)", file=sys.stderr)
    return result
