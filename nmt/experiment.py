"""One budgeted experiment end to end: train -> average -> decode -> score, with a result record.

    python -m nmt.experiment --output DIR [--split test|valid] [--lines N] [--result FILE] [overrides ...]

One cell outside a sweep: it ends in the record a sweep's cell ends in (nmt/record.py finish_run), and the demo
(scripts/demo.py) is this function with the demo's overrides. The training budget is train.max_steps (updates), never minutes, so a slower machine gives the
same model later. The hypotheses are written next to the result so anyone can re-score them with sacrebleu.
What is decoded is the average the recipe asks for (train.average_last=N); a recipe without one
(train.average_last=0) decodes the run's newest checkpoint, says so in a log line and names it in the result.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import threading
import time
from pathlib import Path

from omegaconf import OmegaConf

from nmt.checkpoints.checkpoint import CheckpointError
from nmt.checkpoints.folder_lock import lock_folder
from nmt.cli import ends_in_one_line, program_name
from nmt.config import TrainJob, register_schemas
from nmt.outputs import write_json
from nmt.record import finish_run
from nmt.runtime.memory import retain_freed_memory
from nmt.score import tokenized_bleu_of, tokenized_label
from nmt.run_names import cell_name_for, composed
from nmt.train import run

log = logging.getLogger("nmt.experiment")


def compose_job(overrides: list[str]) -> tuple[TrainJob, dict]:
    """The training job configs/train.yaml and the overrides describe, and its resolved plain form.

    The overrides must set train.output_dir: its default names the folder of a Hydra run, and this is none."""
    register_schemas()
    cfg = composed(overrides)
    return OmegaConf.to_object(cfg).check(), OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


_COMPOSE = threading.Lock()  # Hydra's compose API is a process-wide singleton: one thread at a time


def preset_job(*overrides: str) -> TrainJob:
    """The checked job that presets and overrides describe (e.g. "model=big", "+experiment=paper_big"), for scripts
    that need a preset's values: the schema and configs/ stay their one home. Not a run: no output folder."""
    with _COMPOSE:
        return compose_job([*overrides, "train.output_dir=-"])[0]


RECORD = "experiment.json"  # in an experiment's folder: which run it holds (its identity), and whether it finished


def differing_parts(a: str, b: str) -> list[str]:
    """The parts of two runs' names (nmt/run_names.py cell_name_of) that only one of them holds."""
    return sorted(set(a.split("+")) ^ set(b.split("+")))


def claim_folder(output: Path, identity: str) -> None:
    """Make `output` this experiment's folder. Empty or new: a fresh run. Holding the same run (the same identity:
    the name of the fields that define it, nmt/run_names.py cell_name_of), finished or not: continued, as the trainer resumes exactly, so a stopped experiment run
    again ends as an uninterrupted one would. Holding another run that finished: replaced, as a new experiment.
    Holding another run that did not finish, or files no experiment wrote: refused (CheckpointError), nothing lost."""
    held = [path for path in output.iterdir() if path.name != ".lock"] if output.is_dir() else []
    if held:
        record = json.loads((output / RECORD).read_text()) if (output / RECORD).is_file() else None
        if record is not None and record["identity"] == identity:
            log.info("continuing the run in %s (the same experiment)", output)
            return
        finished = record.get("finished") if record else any(p.name in ("result.json", "score.json") for p in held)
        if not finished:
            fields = differing_parts(record["identity"], identity) if record else []
            differs = f" (it differs in {', '.join(fields[:4])})" if fields else ""
            raise CheckpointError(f"{output} holds an unfinished run of another experiment{differs}: remove it to "
                                  "start this one, or choose another --output (nothing was changed)")
        with lock_folder(output):  # never under a job that is still writing it (CheckpointError names it)
            log.info("replacing the finished run of another experiment in %s", output)
            for path in held:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    output.mkdir(parents=True, exist_ok=True)
    write_json(output / RECORD, {"identity": identity, "finished": False})


def train_and_score(overrides: list[str], output: Path, split: str = "test", lines: int | None = None,
                    command: str = "") -> dict:
    """Train into `output` (continuing the same run there, see claim_folder), average, decode `split` (its first
    `lines` sentences if given), score: the run's record (nmt/record.py finish_run), as a sweep's cell ends.
    TrainingStopped when a signal stopped the training: the same call continues.

    Writes output/{experiment.json, averaged.pt (train.average_last > 0), <split>.hyp.<tgt>, result.json}.
    """
    started = time.monotonic()
    overrides = [*overrides, f"train.score_split={split}", f"train.score_lines={lines or 0}"]
    identity = cell_name_for(overrides)
    claim_folder(output, identity)
    job, resolved = compose_job([*overrides, f"train.output_dir={output}"])
    run(job)  # prepares the data first (a no-op when up to date)
    choices = dict(composed(overrides, with_hydra=True).hydra.runtime.choices)
    result = finish_run(job, output, resolved, overrides, choices, command, log)
    write_json(output / RECORD, {"identity": identity, "finished": True})
    return {**result, "total_minutes": round((time.monotonic() - started) / 60, 2)}


def summary(result: dict) -> str:
    """What a trained and scored run prints: its scores, then its minutes: of training over every session of the run
    (a resumed run's earlier ones too), and of this command."""
    return (f"\nsacreBLEU  {result['bleu_line']}\nsignature  {result['signature']}\n"
            f"chrF {result['chrf']:.2f}   {tokenized_label(result['pair'].split('-')[1])} "
            f"{tokenized_bleu_of(result):.2f}\n"
            f"{result['updates']} updates; {result['train_minutes']:.1f} min of training (every session of the run), "
            f"{result['total_minutes']:.1f} min in this command, on {result['device']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=program_name("nmt.experiment"), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, type=Path, help="training folder (the same experiment there is "
                        "continued; another one's finished run replaced)")
    parser.add_argument("--split", choices=["test", "valid"], default="test", help="the set to decode and score")
    parser.add_argument("--lines", type=int, help="decode and score only the first N sentences of the split")
    parser.add_argument("--result", type=Path, help="also write the result JSON here (default: OUTPUT/result.json)")
    parser.add_argument("overrides", nargs="*", help="the training job's key=value overrides (python -m nmt.train --help "
                        "lists them)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    retain_freed_memory()
    command = " ".join(["python -m nmt.experiment", *(argv if argv is not None else sys.argv[1:])])
    with ends_in_one_line("experiment"):
        result = train_and_score(args.overrides, args.output, args.split, args.lines, command)
    if args.result:
        args.result.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.result, result)
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
