"""Whole translate processes under OpenMP's wait policies, alone and beside busy processes:

    python -m benchmarks.translate_pools [--checkpoint outputs/demo/averaged.pt] [--lines 200] [--repeats 5]

Each call is one `relnmt-translate` process (beam 4, torch's threads: every core) over the first --lines lines of
the Multi30k test set, with GNU OpenMP's default spin (GOMP_SPINCOUNT=300000), relnmt's (10000: nmt/translate.py) or
none (OMP_WAIT_POLICY=PASSIVE), interleaved; then the same beside --busy processes that spin a core each (another
job on the machine). Medians, into results/translate_pools.json.
"""

from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.report import write_report
from nmt.timing import interleaved_samples

POLICIES = {"GNU default (GOMP_SPINCOUNT=300000)": {"GOMP_SPINCOUNT": "300000"},
            "relnmt's (GOMP_SPINCOUNT=10000)": {},  # nmt/translate.py's own setting
            "OMP_WAIT_POLICY=PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", default="outputs/demo/averaged.pt")
    parser.add_argument("--lines", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes beside the loaded runs")
    parser.add_argument("--output", default="results/translate_pools.json")
    args = parser.parse_args()
    with gzip.open("data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(args.lines)]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "input.en"
        source.write_text("".join(lines), encoding="utf-8")
        base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}

        def translate(extra: dict) -> None:
            subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={args.checkpoint}", f"input={source}",
                            f"output={Path(tmp) / 'out.de'}"], env={**base, **extra}, check=True, capture_output=True)

        seconds = {}
        for busy in (0, args.busy):
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
            try:
                samples = interleaved_samples({name: (lambda e=extra: translate(e)) for name, extra in POLICIES.items()},
                                              args.repeats, "cpu", warmup=0)
            finally:
                for hog in hogs:
                    hog.kill()
            seconds[f"beside {busy} busy processes"] = {name: statistics.median(t) for name, t in samples.items()}
            print(busy, {name: round(statistics.median(t), 2) for name, t in samples.items()}, flush=True)
    write_report(args.output, {"lines": args.lines, "beam": 4, "repeats": args.repeats, "cores": os.cpu_count(),
                               "checkpoint": args.checkpoint, "seconds_median": seconds})
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
