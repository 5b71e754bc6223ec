"""One scored run from the shell, kept for its users: the same as `relnmt-train train.output_dir=DIR train.score=true
train.score_split=SPLIT train.score_lines=N [overrides ...]` (the one lifecycle, nmt/lab/run.py), which it says in
one line and then runs.

    python -m nmt.experiment --output DIR [--split test|valid] [--lines N] [overrides ...]
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from nmt.cli import ends_in_one_line, program_name
from nmt.lab.record import summary
from nmt.lab.run import composed_run
from nmt.runtime.memory import retain_freed_memory
from nmt.train import run


def scored_run_overrides(output: Path, split: str, lines: int | None, overrides: list[str]) -> list[str]:
    """The training job's overrides for a run that ends in its score on `split` (its first `lines` sentences)."""
    return [*overrides, f"train.output_dir={output}", "train.score=true", f"train.score_split={split}",
            f"train.score_lines={lines or 0}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=program_name("nmt.experiment"), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, type=Path, help="the run's folder (train.output_dir)")
    parser.add_argument("--split", choices=["test", "valid"], default="test", help="train.score_split")
    parser.add_argument("--lines", type=int, help="train.score_lines: score only the first N sentences of the split")
    parser.add_argument("overrides", nargs="*", help="the training job's key=value overrides (relnmt-train --help)")
    args = parser.parse_args(argv)
    overrides = scored_run_overrides(args.output, args.split, args.lines, args.overrides)
    print(f"{program_name('nmt.experiment')}: the same as relnmt-train {' '.join(overrides)}", file=sys.stderr)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    retain_freed_memory()
    command = " ".join(["python -m nmt.experiment", *(argv if argv is not None else sys.argv[1:])])
    with ends_in_one_line("experiment"):
        result = composed_run(overrides, run, command)
    print(summary(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
