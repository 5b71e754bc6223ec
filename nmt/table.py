"""A -m sweep's cells as one table, or every table of a page of results from the cells beside it.

    relnmt-table SWEEP_FOLDER [--rows KEY=VALUE ...] [--baseline KEY=VALUE] [--where KEY=VALUE ...]
    relnmt-table results/README.md [--blocks NAME ...]   # every table there, as results/tables.yaml declares them,
                                                         # from the cells of results/cells (nmt/lab/page.py)
                 [--cite FILE ...]                       # and the comparisons the page and FILEs cite (nmt/lab/claims.py)

Every cell of the sweep (SWEEP_FOLDER/<cell>/result.json, written by nmt/lab/record.py) is one seed of a row: the cells
of one run but for the seed form a row (nmt/lab/collect.py). A row prints its seeds, sacreBLEU (mean +- standard
deviation over seeds), the tokenized BLEU of the paper's era (compounds split for German targets: nmt/score.py), the
difference from the baseline row and Welch's t-test against it on per-seed sacreBLEU (where both rows have at
least 3 seeds), Holm-adjusted over the table. --rows picks rows (each a row whose overrides include it) and their
order; rows are named by the overrides in which they differ. Cells without a score (training, failed) and rows
asked for but not found are named on stderr; a missing row ends the command with exit 2, after the table.

    relnmt-table multirun/base_wmt14_en_de --rows ablation=k0 ablation=k16 --baseline ablation=k16 \
        --where experiment=paper_base
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from nmt.cli import ends_in_one_line, program_name
from nmt.lab.collect import read_cells
from nmt.data.readers import DataError
from nmt.errors import UserError
from nmt.config import defines_cell
from nmt.score import tokenized_bleu_of
from nmt.lab.stats import MIN_SEEDS, holm, mean_sd, welch_test


def row_overrides(cells: list[dict]) -> set[str]:
    """The overrides every seed of a row shares (each written as its key=value)."""
    sets = [{o.lstrip("+") for o in c["overrides"] if not o.lstrip("+").startswith("train.seed=")} for c in cells]
    return set.intersection(*sets)


def pick(rows: dict[str, list[dict]], wanted: list[str], where: list[str] = ()) -> tuple[list, list[str]]:
    """The rows holding each wanted override, in that order (all rows, in their natural order, for none), among those
    holding every override of `where` that defines a cell (the sweep's shared overrides: other sweeps' cells in its
    folder are left out); and the wanted overrides that no row or several rows hold."""
    shared = {o.lstrip("+") for o in where if defines_row(o.lstrip("+").split("=", 1)[0])}
    rows = {name: cells for name, cells in rows.items() if shared <= row_overrides(cells)}
    if not wanted:
        return sorted(rows.items(), key=lambda item: natural_key(item[0])), []
    picked, missing = [], []
    for override in wanted:
        found = [(name, cells) for name, cells in rows.items() if override.lstrip("+") in row_overrides(cells)]
        if len(found) == 1:
            picked.append(found[0])
        else:
            missing.append(f"{override} ({len(found)} rows hold it)")
    return picked, missing


def defines_row(key: str) -> bool:
    """Whether an override's key can tell rows apart: a config group (experiment, ablation) or a field that
    defines a cell (train.threads cannot)."""
    section, _, field = key.partition(".")
    return not field or defines_cell(section, field)


def natural_key(name: str) -> list:
    """k2 before k16: digits compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def model_summary(model: dict) -> str:
    """What a row trained, read from its result (an override given twice shows here, not only in the row's name)."""
    if model["position"] not in ("relative", "both"):  # no edge tables: k, a^K and a^V mean nothing
        return f"{model['position']}, -, -, -"
    return f"{model['position']}, {model['clip']}, {str(model['rel_key']).lower()}, {str(model['rel_value']).lower()}"


def markdown_table(picked: list[tuple[str, list[dict]]], baseline: str | None) -> str:
    """The rows, each named by the overrides in which the picked rows differ."""
    shared = set.intersection(*(row_overrides(cells) for _, cells in picked))
    base = next((cells for _, cells in picked if baseline.lstrip("+") in row_overrides(cells)), None) if baseline \
        else None
    if baseline and base is None:
        raise DataError(f"--baseline {baseline}: no picked row holds it")
    split = picked[0][1][0]["split"]
    lines = [f"| row | model (position, k, a^K, a^V) | seeds | sacreBLEU ({split}) | tokenized BLEU (de: compounds "
             f"split) | Δ sacreBLEU vs {baseline or '-'} | Welch p (seeds) | Holm p (this table) |",
             "|---|---|---|---|---|---|---|---|"]
    compared = [cells for _, cells in picked if base is not None and cells is not base
                and min(len(cells), len(base)) >= MIN_SEEDS]  # the family the Holm column corrects for
    raw = {id(cells): welch_test([c["bleu"] for c in cells], [c["bleu"] for c in base])[2] for cells in compared}
    adjusted = dict(zip(raw, holm(list(raw.values()))))
    for _, cells in picked:
        name = " ".join(sorted(row_overrides(cells) - shared)) or "(the shared overrides)"
        bleu = [c["bleu"] for c in cells]
        delta, p, p_holm = "", "", ""
        if base is not None and cells is not base:
            delta = f"{statistics.mean(bleu) - statistics.mean(c['bleu'] for c in base):+.2f}"
            p, p_holm = ((f"{raw[id(cells)]:.3f}", f"{adjusted[id(cells)]:.3f}") if id(cells) in raw
                         else (f"n < {MIN_SEEDS} seeds", ""))
        split_bleu = mean_sd([tokenized_bleu_of(c) for c in cells])
        lines.append(f"| {name} | {model_summary(cells[0]['model'])} | {len(cells)} | {mean_sd(bleu)} | {split_bleu} | "
                     f"{delta} | {p} | {p_holm} |")
    signatures = sorted({c["signature"] for _, cells in picked for c in cells})
    return "\n".join([*lines, "", f"Shared by every row: {' '.join(sorted(shared)) or 'nothing'}",
                      *(f"sacreBLEU signature: {s}" for s in signatures)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=program_name("nmt.table"), description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a -m sweep's folder (one cell per folder), or a page of tables "
                        "(results/README.md: its cells are results/cells, its tables results/tables.yaml)")
    parser.add_argument("--rows", nargs="+", default=[], metavar="KEY=VALUE", help="the rows to show, in order")
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="the row the others are compared with")
    parser.add_argument("--where", nargs="+", default=[], metavar="KEY=VALUE",
                        help="only the rows holding these overrides (those that define a run; others are ignored)")
    parser.add_argument("--blocks", nargs="+", metavar="NAME", help="a page: only these tables (default: all)")
    parser.add_argument("--samples", type=int, default=1000, help="a page: paired-bootstrap resamples")
    parser.add_argument("--cite", nargs="+", default=[], type=Path, metavar="FILE",
                        help="a page: also write the comparisons these files cite from its tables (nmt/lab/claims.py)")
    args = parser.parse_args(argv)
    with ends_in_one_line("table"):
        if args.folder.suffix == ".md":
            return write_page(args.folder, args.blocks, args.samples, args.cite)
        rows, unscored = read_cells(args.folder)
        name_unscored(unscored)
        if not rows:
            raise DataError(f"no cell of {args.folder} holds a result.json: its sweep has not scored a cell yet")
        picked, missing = pick(rows, args.rows, args.where)
        if picked:
            sys.stdout.write(markdown_table(picked, args.baseline))
        if missing:
            raise UserError(f"no single row of {args.folder} for {', '.join(missing)}; its rows: "
                            + ", ".join(sorted(rows)))


def name_unscored(cells: list[Path]) -> None:
    if cells:
        print(f"{len(cells)} cells hold no score yet (training, stopped or failed; their train.log says which), "
              f"left out: {', '.join(str(c) for c in cells)}", file=sys.stderr)


def write_page(page: Path, blocks: list[str] | None, samples: int, citing: list[Path] = ()) -> None:
    """Replace the page's marked blocks with the tables rebuilt from the cells beside it, then every comparison
    the page and `citing` cite with what those tables computed."""
    from nmt.lab.claims import cite_files
    from nmt.lab.page import page_blocks, replace_block

    if not page.is_file():
        raise DataError(f"{page}: no such page")
    tables, unscored = page_blocks(page.parent / "cells", page.parent / "tables.yaml", samples,
                                   set(blocks) if blocks else None)
    name_unscored(unscored)
    text = page.read_text(encoding="utf-8")
    for name, block in tables.items():
        text = replace_block(text, name, block)
    page.write_text(text, encoding="utf-8")
    print(f"{page}: {len(tables)} tables rebuilt from {page.parent / 'cells'} ({', '.join(tables)})")
    try:
        cited = cite_files(page, list(citing))
    except ValueError as error:
        raise DataError(str(error)) from None
    print(f"comparisons cited again in: {', '.join(map(str, cited)) or 'none changed'}")


if __name__ == "__main__":
    main()
