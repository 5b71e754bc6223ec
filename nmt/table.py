"""python -m nmt.table DIR [--testset newstest2013]: the Markdown table of an ablation's rows.

Every row is a run folder DIR/<row>/ holding the score record that `make score` wrote beside its checkpoint
(<testset>.<pair>.json, from nmt.score): sacreBLEU first (its signature under the table), then the tokenized BLEU
of the paper's era (compounds split for German targets: nmt/score.py). `make ablate-k` / `make ablate-kv` end with it (Tables 2 and 3).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from nmt.cli import ends_in_one_line
from nmt.data.readers import DataError
from nmt.score import tokenized_bleu_of


def ablation_rows(directory: Path, testset: str) -> list[tuple[str, dict]]:
    """(row folder name, score record) for every row of the ablation, in the folders' natural order."""
    rows = []
    for record in sorted(directory.glob(f"*/{testset}.*.json"), key=lambda p: natural_key(p.parent.name)):
        rows.append((record.parent.name, json.loads(record.read_text())))
    return rows


def natural_key(name: str) -> list:
    """k2 before k16: digits compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def markdown_table(rows: list[tuple[str, dict]], testset: str) -> str:
    lines = [f"| run | sacreBLEU ({testset}) | tokenized BLEU (de: compounds split) | sentences |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['bleu']:.2f} | {tokenized_bleu_of(r):.2f} | {r['sentences']} |" for name, r in rows]
    signatures = sorted({r["signature"] for _, r in rows})
    return "\n".join([*lines, "", *(f"sacreBLEU signature: {s}" for s in signatures)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m nmt.table", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="the ablation's folder, one run folder per row")
    parser.add_argument("--testset", default="newstest2013", help="the score records' test set (default %(default)s)")
    args = parser.parse_args(argv)
    with ends_in_one_line("table"):
        rows = ablation_rows(args.directory, args.testset)
        if not rows:
            raise DataError(f"no {args.testset}.*.json score record under {args.directory}/*/: run make score for "
                            "each row first")
        sys.stdout.write(markdown_table(rows, args.testset))


if __name__ == "__main__":
    main()
