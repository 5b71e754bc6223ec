"""A -m sweep's cells as one table, or every table of a page of results from the cells beside it.

    relnmt-table SWEEP_FOLDER [--rows KEY=VALUE ...] [--baseline KEY=VALUE] [--where KEY=VALUE ...]
    relnmt-table results/README.md [--blocks NAME ...]   # every table there, as results/tables.yaml declares them,
                                                         # from the cells of results/cells (nmt/lab/page.py)
                 [--cite FILE ...]                       # and the comparisons the page and FILEs cite (nmt/lab/claims.py)

Every cell of the sweep (SWEEP_FOLDER/<cell>/result.json, written by nmt/lab/record.py) is one seed of a row: the cells
of one run but for the seed form a row (nmt/lab/collect.py), named by the overrides in which the rows differ. The
table is the page's (nmt/lab/page.py bleu_table, the same code): each cell's scores checked against its hypotheses
and the references its record names, sacreBLEU (mean +- standard deviation over seeds), chrF, the tokenized BLEU of
the paper's era, and each row against --baseline: Welch's t-test on per-seed sacreBLEU (rows of at least 3 seeds),
Holm-adjusted over this table's comparisons, the verdict word (a null with the smallest difference the seeds could
have detected at the corrected level) and sacrebleu's paired bootstrap. A row scored on another split, reference or
line count than the baseline is not compared (said on stderr). --rows picks rows (each a row whose overrides include
it) and their order. Cells without a score (training, failed, a record cut short) and rows asked for but not found
are named on stderr; a missing row ends the command with exit 2, after the table.

    relnmt-table multirun/base_wmt14_en_de --rows ablation=k0 ablation=k16 --baseline ablation=k16 \
        --where experiment=paper_base
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

from nmt.cli import ends_in_one_line, program_name
from nmt.data.readers import DataError
from nmt.errors import UserError
from nmt.lab.collect import check_scores, read_cells, reference_source
from nmt.lab.page import bleu_table, holm_family
from nmt.recorded_config import defines_cell


def row_overrides(cells: list[dict]) -> set[str]:
    """The overrides every seed of a row shares (each written as its key=value)."""
    sets = [{o.lstrip("+") for o in c["overrides"] if not o.lstrip("+").startswith("train.seed=")} for c in cells]
    return set.intersection(*sets)


def pick(rows: dict[str, list[dict]], wanted: list[str], where: list[str] = ()) -> tuple[list, list[str]]:
    """The rows holding each wanted override, in that order (all rows, in their natural order, for none), among those
    holding every override of `where` that defines a cell (the sweep's shared overrides: other sweeps' cells in its
    folder are left out); and the wanted overrides that no row or several rows hold."""
    seeds = {o.split("=", 1)[1] for o in where if o.lstrip("+").startswith("train.seed=")}  # a row's cells
    shared = {o.lstrip("+") for o in where if defines_row(o.lstrip("+").split("=", 1)[0])
              and not o.lstrip("+").startswith("train.seed=")}
    rows = {name: [c for c in cells if not seeds or str(c["seed"]) in seeds] for name, cells in rows.items()
            if shared <= row_overrides(cells)}
    rows = {name: cells for name, cells in rows.items() if cells}
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


def comparable(row: dict[int, dict], base: dict[int, dict]) -> bool:
    """Whether two rows were scored on the same thing (split, reference, lines): only then is one tested against
    the other."""
    def scored_on(seeds):
        return {(r.get("split"), str(reference_source(r)), r.get("sentences")) for r in seeds.values()}
    return scored_on(row) == scored_on(base) and len(scored_on(row)) == 1


def sweep_table(picked: list[tuple[str, list[dict]]], baseline: str | None, samples: int) -> str:
    """The rows, each named by the overrides in which the picked rows differ, through the page's code
    (nmt/lab/page.py bleu_table): every score checked against its hypotheses, each row tested against the baseline
    (Welch on per-seed BLEU, Holm over this table's comparisons, the verdict word, the detectable difference at the
    corrected level, the paired bootstrap); a row scored on another split, reference or line count is not."""
    shared = set.intersection(*(row_overrides(cells) for _, cells in picked))
    names = [" ".join(sorted(row_overrides(cells) - shared)) or "(the shared overrides)" for _, cells in picked]
    rows = {}
    for name, (_, cells) in zip(names, picked):
        for result in cells:
            result["hyps"] = (result["folder"] / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1]
            check_scores(result)
        rows[name] = {result["seed"]: result for result in cells}
    base = next((name for name, (_, cells) in zip(names, picked)
                 if baseline.lstrip("+") in row_overrides(cells)), None) if baseline else None
    if baseline and base is None:
        raise DataError(f"--baseline {baseline}: no picked row holds it")
    others = [name for name in rows if base is not None and name != base]
    against = {name: [base] for name in others if comparable(rows[name], rows[base])}
    apart = [name for name in others if name not in against]
    if apart:
        print(f"not compared with {base}, scored on another split, reference or line count: {', '.join(apart)}",
              file=sys.stderr)
    table = {"against": against}
    adjusted = holm_family({"sweep": (table, rows)})
    signatures = sorted({c["signature"] for _, cells in picked for c in cells})
    scored = sorted({f"{r.get('split')} ({r.get('sentences')} sentences of {reference_source(r).name})"
                     for seeds in rows.values() for r in seeds.values()})
    return "\n".join([bleu_table(table, rows, samples, adjusted, "this table"), "",
                      f"Shared by every row: {' '.join(sorted(shared)) or 'nothing'}",
                      f"Scored on: {'; '.join(scored)}", *(f"sacreBLEU signature: {s}" for s in signatures)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=program_name("nmt.table"), description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a -m sweep's folder (one cell per folder), or a page of tables "
                        "(results/README.md: its cells are results/cells, its tables results/tables.yaml)")
    parser.add_argument("--rows", nargs="+", default=[], metavar="KEY=VALUE", help="the rows to show, in order")
    parser.add_argument("--baseline", metavar="KEY=VALUE", help="the row the others are compared with")
    parser.add_argument("--where", nargs="+", default=[], metavar="KEY=VALUE",
                        help="only the rows holding these overrides (those that define a run; others are ignored), "
                        "and with train.seed=N only those seeds' cells")
    parser.add_argument("--blocks", nargs="+", metavar="NAME", help="a page: only these tables (default: all)")
    parser.add_argument("--samples", type=int, default=1000, help="paired-bootstrap resamples")
    parser.add_argument("--cite", nargs="+", default=[], type=Path, metavar="FILE",
                        help="a page: also write the comparisons these files cite from its tables (nmt/lab/claims.py)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # a broken cell's line (nmt/lab/collect.py)
    with ends_in_one_line("table"):
        if args.folder.suffix == ".md":
            return write_page(args.folder, args.blocks, args.samples, args.cite)
        rows, unscored = read_cells(args.folder)
        name_unscored(unscored)
        if not rows:
            raise DataError(f"no cell of {args.folder} holds a result.json: its sweep has not scored a cell yet")
        picked, missing = pick(rows, args.rows, args.where)
        if not picked and not missing:
            raise UserError(f"no row of {args.folder} holds every --where override ({' '.join(args.where)}); its "
                            "rows: " + ", ".join(sorted(rows)))
        if picked:
            sys.stdout.write(sweep_table(picked, args.baseline, args.samples))
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
