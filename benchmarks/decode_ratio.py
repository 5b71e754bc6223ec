"""relnmt's decoding speed over CTranslate2's on the same model: whole processes, the ratio the project aims at.

    python -m benchmarks.decode_ratio CHECKPOINT [--sentences 1000] [--repeats 5] [--threads 1 2]
        [--baseline CHECKOUT] [--output results/decode_ratio.json] [--exports outputs/bench_decode_ratio]

CHECKPOINT must be exportable (the demo trained with model.share_heads=true: its edge tables shared, so that
CTranslate2 holds it); it is exported to float32 under EXPORTS/. Then whole `python -m nmt.translate` processes
(import, model load and chunked decoding included) on the first --sentences of test_2016_flickr, at each of
--threads, relnmt and CTranslate2 float32 alternated side by side, --repeats each (benchmarks/deploy.py's speed),
for three searches (SEARCHES): greedy; beam 4 at alpha 0.6 under relnmt's default rule (stop=exact, the paper's;
CTranslate2 has only its own rule, which it runs); beam 4 at alpha 0.6 under CTranslate2's rule in both
(stop=finished). Reported: the medians, relnmt's speed over CTranslate2's (its seconds over ours: >= 1 is as fast or
faster) by wall time and by each process's CPU time (user + system: on a machine shared with other work, the
steadier of the two), and how many lines of each search relnmt writes as CTranslate2 does (one more process each).
--baseline CHECKOUT also runs another source tree's relnmt (e.g. `git worktree add /tmp/before COMMIT`) in the same
alternation for the searches it has: this tree's speed over it, and how many lines the two write alike.
Without ctranslate2 installed (pip install -e '.[deploy]') it says so in one line and writes nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.deploy import ROOT, TEST, speed, test_lines
from benchmarks.report import write_report
from nmt.machine import machine


SEARCHES = {"greedy": ["beam=1"], "beam4": ["beam=4", "alpha=0.6"],
            "beam4_finished": ["beam=4", "alpha=0.6", "stop=finished"]}
NEW_SEARCHES = {"beam4_finished"}  # what a baseline from before stop=finished cannot run


def written_lines(engine: str, root: Path, source: Path, args: list[str]) -> list[str]:
    """What one `python -m nmt.translate` of `root`'s tree writes for `source`."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={engine}", f"input={source}",
                           "device=cpu", *args], env=env, cwd=root, check=True, capture_output=True,
                          text=True).stdout.splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--baseline", type=Path, help="another checkout of relnmt to time beside this one")
    parser.add_argument("--output", type=Path, default=Path("results/decode_ratio.json"))
    parser.add_argument("--exports", type=Path, default=Path("outputs/bench_decode_ratio"))
    args = parser.parse_args()
    if importlib.util.find_spec("ctranslate2") is None:
        print("decode_ratio: skipped, ctranslate2 is not installed (pip install -e '.[deploy]')")
        return
    from nmt.export import export

    checkpoint = str(args.checkpoint.resolve())
    exported = str(export(checkpoint, args.exports.resolve() / "float32", force=True))
    source = (args.exports / "source.en").resolve()
    source.write_text("".join(line + "\n" for line in test_lines(str(TEST), "en", args.sentences)), encoding="utf-8")
    engines, checkouts = {"relnmt": checkpoint, "ctranslate2": exported}, {"relnmt": ROOT}
    if args.baseline:
        engines["baseline"], checkouts["baseline"] = checkpoint, args.baseline.resolve()
    skip = frozenset(("baseline", search) for search in NEW_SEARCHES)
    rows = speed(engines, source, args.threads, args.repeats, checkouts, SEARCHES, skip)
    report = {"checkpoint": str(args.checkpoint), "sentences": args.sentences, "repeats": args.repeats,
              "machine": machine(torch.device("cpu")), "baseline": str(args.baseline) if args.baseline else None,
              "searches": {search: " ".join(search_args) for search, search_args in SEARCHES.items()},
              "seconds": {key: round(row["seconds"], 3) for key, row in rows.items()},
              "cpu_seconds": {key: round(row["cpu_seconds"], 3) for key, row in rows.items()}}
    for n in args.threads:
        for search in SEARCHES:
            ours, key = rows[f"relnmt {search} {n}t"], f"{search} {n}t"
            others = [name for name in engines if name != "relnmt" and (name, search) not in skip]
            report[key] = {f"relnmt_over_{other}{cpu}": round(rows[f"{other} {key}"][f"{measure}"] / ours[measure], 3)
                           for other in others for cpu, measure in (("", "seconds"), ("_cpu", "cpu_seconds"))}
            print(f"{search:14s} {n}t  relnmt {ours['seconds']:6.2f} s  " + "  ".join(
                f"{other} {rows[f'{other} {key}']['seconds']:6.2f} s" for other in others) + "  " + "  ".join(
                f"{k} {v:.3f}" for k, v in report[key].items()), flush=True)
    report["identical_lines"] = {}
    for search, search_args in SEARCHES.items():
        lines = {name: written_lines(engine, checkouts.get(name, ROOT), source, search_args)
                 for name, engine in engines.items() if (name, search) not in skip}
        report["identical_lines"][search] = {f"relnmt_and_{other}": sum(a == b for a, b in zip(lines["relnmt"], theirs))
                                             for other, theirs in lines.items() if other != "relnmt"}
        print(f"{search:14s} lines identical (of {args.sentences}): " + "  ".join(
            f"{k} {v}" for k, v in report["identical_lines"][search].items()), flush=True)
    write_report(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
