"""python -m nmt.average DIR --last N --output PATH: average the last N checkpoints by update number."""

import argparse
import logging
import sys

from nmt.checkpoint import CheckpointError, numbered_checkpoints, write_average

log = logging.getLogger("nmt.average")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("directory", help="training output folder holding checkpoint_<update>.pt files")
    parser.add_argument("--last", type=int, required=True, help="how many of the newest checkpoints to average")
    parser.add_argument("--output", required=True, help="where to write the averaged checkpoint")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    found = numbered_checkpoints(args.directory)
    if args.last < 1 or len(found) < args.last:
        log.error("asked for the last %d checkpoints, %s has %d", args.last, args.directory, len(found))
        return 2
    try:
        path = write_average(found[-args.last:], args.output)
    except CheckpointError as err:
        log.error("%s", err)
        return 2
    log.info("averaged %s -> %s", ", ".join(p.name for p in found[-args.last:]), path)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # the average is written whole or not at all (save_checkpoint renames it into place)
        print("\ninterrupted (Ctrl-C): nothing written", file=sys.stderr)
        sys.exit(130)
