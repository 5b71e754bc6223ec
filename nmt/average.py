"""python -m nmt.average directory=DIR last=N [output=PATH]: average the newest N regular checkpoints of a run.

Regular: saved at the run's save cadence or at its end; a checkpoint saved when a signal stopped the run between
two saves is left out, and the one line written says which were taken and which left out. The older flag form,
`python -m nmt.average DIR --last N --output PATH`, works too.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from omegaconf import OmegaConf

from nmt.checkpoint import CheckpointError, averaging_note, checkpoints_to_average, write_average
from nmt.cli import hydra_job
from nmt.config import AverageJob, ConfigError, register_schemas

log = logging.getLogger("nmt.average")

INTERRUPTED = "interrupted (Ctrl-C): nothing written"  # written whole or not at all (save_checkpoint renames it)


def average(directory: str, last: int, output: str | None = None) -> int:
    """Write the average; the exit code (2: too few checkpoints, or one that does not load)."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s", force=True)
    output = output or str(Path(directory) / "averaged.pt")
    try:
        paths, left_out = checkpoints_to_average(directory, last)
        if len(paths) < last:
            log.error("asked for the last %d checkpoints, %s has %d regular ones%s", last, directory, len(paths),
                      f" ({len(left_out)} more saved at a signal, left out)" if left_out else "")
            return 2
        log.info("%s", averaging_note(paths, left_out, write_average(paths, output)))
    except CheckpointError as err:
        log.error("%s", err)
        return 2
    return 0


def flag_form(argv: list[str]) -> bool:
    """The older `DIR --last N --output PATH` form."""
    return any(arg.split("=")[0] in ("--last", "--output") for arg in argv)


def main_flags(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m nmt.average", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="training output folder holding checkpoint_<update>.pt files")
    parser.add_argument("--last", type=int, required=True, help="how many of the newest regular checkpoints")
    parser.add_argument("--output", help="where to write the averaged checkpoint (default: DIR/averaged.pt)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error("--last must be >= 1")
    return average(args.directory, args.last, args.output)


register_schemas()


@hydra_job("average", AverageJob, interrupted=INTERRUPTED)
def main(cfg) -> None:
    job: AverageJob = OmegaConf.to_object(cfg)
    try:
        job.check()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    sys.exit(average(job.directory, job.last, job.output))


if __name__ == "__main__":
    if flag_form(sys.argv[1:]):
        try:
            sys.exit(main_flags(sys.argv[1:]))
        except KeyboardInterrupt:
            print(f"\n{INTERRUPTED}", file=sys.stderr)
            sys.exit(130)
    main()
