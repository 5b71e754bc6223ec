"""python -m nmt.average directory=DIR last=N [output=PATH]: average the newest N regular checkpoints of a run
(average_checkpoints: the mean of their parameters, a pure function under a thin CLI).

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

from nmt.checkpoints.averaging import averaging_note, checkpoints_to_average, write_average
from nmt.checkpoints.checkpoint import (
    BEST,
    LAST,
    PREVIOUS,
    CheckpointError,
    numbered_checkpoints,
)
from nmt.cli import ends_in_one_line, hydra_job, program_name
from nmt.config import AverageJob
from nmt.compose import register_schemas
from nmt.outputs import output_file

log = logging.getLogger("nmt.average")

INTERRUPTED = "interrupted: nothing written"  # written whole or not at all (save_checkpoint renames it)


def average(directory: str, last: int, output: str | None = None) -> Path:
    """Write the average of the newest `last` regular checkpoints; CheckpointError when there are fewer or one does
    not load."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(message)s", force=True)
    output = output or str(Path(directory) / "averaged.pt")
    if not Path(directory).is_dir():  # checked before anything is made: a mistyped folder is not created
        raise CheckpointError(f"directory={directory}: no such folder (nothing was written)")
    paths, left_out = checkpoints_to_average(directory, last)
    if len(paths) < last:
        raise CheckpointError(f"asked for the last {last} checkpoints, {directory} has {len(paths)} regular ones"
                              + (f" ({len(left_out)} more saved at a signal, left out)" if left_out else ""))
    run_files = [*numbered_checkpoints(directory), *(Path(directory) / name for name in (LAST, PREVIOUS, BEST))]
    output_file("output", output, {f"run's checkpoint {p.name}": p for p in run_files})  # a folder, or what it averages
    log.info("%s", averaging_note(paths, left_out, write_average(paths, output)))
    return Path(output)


def flag_form(argv: list[str]) -> bool:
    """The older `DIR --last N --output PATH` form."""
    return any(arg.split("=")[0] in ("--last", "--output") for arg in argv)


def main_flags(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog=program_name("nmt.average"), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", help="training output folder holding checkpoint_<update>.pt files")
    parser.add_argument("--last", type=int, required=True, help="how many of the newest regular checkpoints")
    parser.add_argument("--output", help="where to write the averaged checkpoint (default: DIR/averaged.pt)")
    args = parser.parse_args(argv)
    if args.last < 1:
        parser.error("--last must be >= 1")
    with ends_in_one_line("average", INTERRUPTED):
        average(args.directory, args.last, args.output)


register_schemas()


@hydra_job("average", AverageJob, interrupted=INTERRUPTED)
def main(cfg) -> None:
    job: AverageJob = OmegaConf.to_object(cfg).check()
    average(job.directory, job.last, job.output)


def cli() -> None:
    """relnmt-average and python -m nmt.average: the flag form or the Hydra form, as the arguments say."""
    if flag_form(sys.argv[1:]):
        main_flags(sys.argv[1:])
    else:
        main()


if __name__ == "__main__":
    cli()
