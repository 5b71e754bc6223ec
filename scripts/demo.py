"""The embedded default, end to end on a CPU: prepare -> train -> average -> decode -> score.

    python scripts/demo.py [--updates N] [--lines N] [--split test|valid] [--output outputs/demo] [overrides ...]

Bundled Multi30k En-De, the `tiny` relative-position model (configs/experiment/demo.yaml), beam 4 and
alpha 0.6 on test_2016_flickr. The budget is a number of updates, so every machine trains the same model
(same seed, same data order); only the time differs. `--updates N` keeps the recipe's shape: warmup over the
first half, then the linear decay to 0 at update N. `--lines N` decodes and scores only the first N sentences (a
quick check of the whole chain; its BLEU is not the demo's). `--split valid` scores the validation set instead:
settings are tuned there, never on test. Extra arguments are Hydra overrides for the training job.
Writes OUTPUT/{averaged.pt, <split>.hyp.de, result.json}, as every scored run does (the one lifecycle,
nmt/lab/run.py): run again, a finished demo says it is done. Stopped (Ctrl-C, SIGTERM), it saves a checkpoint and
exits 75; the same command continues it, to the same result as a run never stopped. A run of other settings in OUTPUT
is refused in one line (remove it, or choose another --output).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from nmt.cli import ends_in_one_line
from nmt.experiment import scored_run_overrides
from nmt.lab.record import RESULT, summary
from nmt.lab.run import composed_run
from nmt.runtime.memory import retain_freed_memory
from nmt.runtime.precision import experiment_cpu_precision
from nmt.checkpoints.checkpoint import LAST
from nmt.config import TrainJob
from nmt.train import estimated_seconds, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--updates", type=int, help="training budget in optimizer updates (default: "
                        "configs/experiment/demo.yaml's train.max_steps)")
    parser.add_argument("--lines", type=int, help="decode and score only the first N sentences of the split")
    parser.add_argument("--split", choices=["test", "valid"], default="test", help="which set to decode and score")
    parser.add_argument("--output", type=Path, default=Path("outputs/demo"))
    parser.add_argument("overrides", nargs="*", help="extra Hydra overrides for the training job")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    retain_freed_memory()
    # the recipe's shape at any budget: warmup over the first half, the linear decay to 0 over the second
    budget = [f"train.max_steps={args.updates}", f"optim.warmup={max(1, args.updates // 2)}"] if args.updates else []
    overrides = scored_run_overrides(args.output, args.split, args.lines, [
        "model=tiny", "data=multi30k_en_de", "+experiment=demo", *budget,
        f"train.precision={experiment_cpu_precision().value}", *args.overrides])
    command = " ".join(["python", "scripts/demo.py", *sys.argv[1:]])
    with ends_in_one_line("demo"):  # a stop: exit 75 (nmt.train said how to continue); a bad input: one line
        result = composed_run(overrides, said_how_long_then_run, command)
    print(f"{summary(result)}; wrote {args.output / RESULT}")


def said_how_long_then_run(job: TrainJob):
    """The run, after a line saying how long its training should take here (the dry run's estimate: a few timed
    updates; a demo that continues a stopped one shows it on its progress bar instead)."""
    if not (Path(job.train.output_dir) / LAST).is_file():
        seconds = estimated_seconds(job)
        about = f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} seconds"
        print(f"demo: about {about} to train {job.train.max_steps} updates on this machine in "
              f"{job.train.precision.value} (the dry run's estimate: train.dry_run=true), then decoding; the records' "
              "times on three kinds of CPU: README.md", file=sys.stderr, flush=True)
    return run(job)


if __name__ == "__main__":
    main()
