"""One budgeted experiment end to end: train -> average -> decode -> score, with a result record.

    python -m nmt.experiment --output DIR [--split test|valid] [--lines N] [--result FILE] [overrides ...]

The demo (scripts/demo.py) and the table sweeps (experiments/sweep.py) are this function with different
overrides. The training budget is train.max_steps (updates), never minutes, so a slower machine gives the
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

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from nmt.batch import micro_batches
from nmt.cell import checkpoint_to_decode, decode_and_score
from nmt.checkpoints.checkpoint import LAST, CheckpointError, load_checkpoint
from nmt.checkpoints.folder_lock import lock_folder
from nmt.cli import ends_in_one_line, program_name
from nmt.config import SearchConfig, TrainJob, register_schemas
from nmt.outputs import write_json
from nmt.recorded_config import schema_default
from nmt.runtime.memory import retain_freed_memory
from nmt.score import tokenized_bleu_of, tokenized_label
from nmt.train import run

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
log = logging.getLogger("nmt.experiment")


def compose_job(overrides: list[str]) -> tuple[TrainJob, dict]:
    """The training job configs/train.yaml and the overrides describe, and its resolved plain form.

    The overrides must set train.output_dir: its default names the folder of a Hydra run, and this is none."""
    register_schemas()
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=overrides)
    return OmegaConf.to_object(cfg).check(), OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


_COMPOSE = threading.Lock()  # Hydra's compose API is a process-wide singleton: one thread at a time


def preset_job(*overrides: str) -> TrainJob:
    """The checked job that presets and overrides describe (e.g. "model=big", "+experiment=paper_big"), for scripts
    that need a preset's values: the schema and configs/ stay their one home. Not a run: no output folder."""
    with _COMPOSE:
        return compose_job([*overrides, "train.output_dir=-"])[0]


def run_identity(overrides: list[str]) -> str:
    """What makes two runs the same run: the resolved config, less where it was written, with how many threads,
    on which device and through which attention implementation (none of which changes the result)."""
    with _COMPOSE:
        job, resolved = compose_job([*overrides, "train.output_dir=-"])  # compose outside a Hydra run needs one
    for name in ("output_dir", "threads", "device", "attention", "tokens_per_update"):
        resolved["train"].pop(name)
    # an experiment is one process: its batch is max_tokens x the accumulation, however the recipe states it
    resolved["train"]["update_freq"] = micro_batches(job.train, 1)
    return json.dumps(resolved, sort_keys=True)


def same_config(a, b, path: tuple[str, ...] = ()) -> bool:
    """Equal resolved configs; a field only one side has counts as equal when the other side holds null or the
    schema's default there (a field added to the schema after a run was recorded, left at its default)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(same_config(a.get(name, MISSING), b.get(name, MISSING), (*path, name)) for name in set(a) | set(b))
    if a is MISSING or b is MISSING:
        present = b if a is MISSING else a
        return present is None or (len(path) == 2 and present == schema_default(*path))
    return a == b


MISSING = object()  # a field one side of same_config does not have


def find_same_run(identity: str, results: Path, exclude: Path, split: str = "test") -> Path | None:
    """A finished run under results/<table>/<row>/seed<k>/ with the same identity, scored on the same split, other
    than `exclude`."""
    wanted = json.loads(identity)
    for found in sorted(results.glob("*/*/seed*/result.json")):
        record = json.loads(found.read_text())
        recorded, scored_on = record.get("identity"), record.get("split", "test")
        if found.parent != exclude and recorded and scored_on == split and same_config(json.loads(recorded), wanted):
            return found.parent
    return None


RECORD = "experiment.json"  # in an experiment's folder: which run it holds (its identity), and whether it finished


def differing_fields(a: dict, b: dict, prefix: str = "") -> list[str]:
    """The dotted fields where two resolved configs differ (same_config's rule for a field only one side has)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [f for name in sorted(set(a) | set(b))
                for f in differing_fields(a.get(name, MISSING), b.get(name, MISSING), f"{prefix}{name}.")]
    return [] if same_config(a, b, tuple(prefix.rstrip(".").split("."))) else [prefix.rstrip(".")]


def claim_folder(output: Path, identity: str) -> None:
    """Make `output` this experiment's folder. Empty or new: a fresh run. Holding the same run (same identity:
    config, data, budget), finished or not: continued, as the trainer resumes exactly, so a stopped experiment run
    again ends as an uninterrupted one would. Holding another run that finished: replaced, as a new experiment.
    Holding another run that did not finish, or files no experiment wrote: refused (CheckpointError), nothing lost."""
    held = [path for path in output.iterdir() if path.name != ".lock"] if output.is_dir() else []
    if held:
        record = json.loads((output / RECORD).read_text()) if (output / RECORD).is_file() else None
        if record is not None and same_config(json.loads(record["identity"]), json.loads(identity)):
            log.info("continuing the run in %s (the same experiment)", output)
            return
        finished = record.get("finished") if record else any(p.name in ("result.json", "score.json") for p in held)
        if not finished:
            fields = differing_fields(json.loads(record["identity"]), json.loads(identity)) if record else []
            differs = f" (it differs in {', '.join(fields[:4])})" if fields else ""
            raise CheckpointError(f"{output} holds an unfinished run of another experiment{differs}: remove it to "
                                  "start this one, or choose another --output (nothing was changed)")
        with lock_folder(output):  # never under a job that is still writing it (CheckpointError names it)
            log.info("replacing the finished run of another experiment in %s", output)
            for path in held:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    output.mkdir(parents=True, exist_ok=True)
    write_json(output / RECORD, {"identity": identity, "finished": False})


def train_and_score(overrides: list[str], output: Path, split: str = "test",
                    search: SearchConfig = SearchConfig(), lines: int | None = None) -> dict:
    """Train into `output` (continuing the same run there, see claim_folder), average, decode `split` (its first
    `lines` sentences if given), score. TrainingStopped when a signal stopped the training: the same call continues.

    Writes output/{experiment.json, averaged.pt (train.average_last > 0), <split>.hyp.<tgt>}; returns the result
    record.
    """
    started = time.monotonic()
    identity = run_identity(overrides)
    claim_folder(output, identity)
    job, resolved = compose_job([*overrides, f"train.output_dir={output}"])
    run(job)  # prepares the data first (a no-op when up to date)
    # the run's own training time, every session of it: a finished run re-scored, or a resumed one, is not the
    # seconds this call spent
    train_minutes = load_checkpoint(output / LAST, mmap=True).get("train_seconds", 0.0) / 60

    decoded = checkpoint_to_decode(output, job.train.average_last, log)
    scored = decode_and_score(decoded, job.data, split, search, output, lines, job.train.device, log)
    decoded_state = load_checkpoint(decoded, mmap=True)
    write_json(output / RECORD, {"identity": identity, "finished": True})
    return {
        **scored,
        "overrides": overrides, "seed": job.train.seed,
        "updates": decoded_state["step"], "averaged_from": decoded_state.get("averaged_from", []),
        "checkpoint": decoded.name,
        "train_minutes": round(train_minutes, 2), "total_minutes": round((time.monotonic() - started) / 60, 2),
        "model": {name: resolved["model"][name] for name in ("position", "clip", "rel_key", "rel_value",
                                                              "share_heads", "edge_buckets")},
        "config": resolved,
    }


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
    with ends_in_one_line("experiment"):
        result = train_and_score(args.overrides, args.output, args.split, lines=args.lines)
    result["command"] = " ".join(["python -m nmt.experiment", *(argv if argv is not None else sys.argv[1:])])
    for path in {args.output / "result.json", args.result or args.output / "result.json"}:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, result)
    print(f"\nsacreBLEU  {result['bleu_line']}\nsignature  {result['signature']}\n"
          f"chrF {result['chrf']:.2f}   {tokenized_label(result['pair'].split('-')[1])} "
          f"{tokenized_bleu_of(result):.2f}\n"
          f"{result['updates']} updates; {result['train_minutes']:.1f} min of training, "
          f"{result['total_minutes']:.1f} min in all on {result['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
