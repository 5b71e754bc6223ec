"""Move the tables' runs from the old per-table layout (results/<table>/<row>/seed<k>/, written by the retired
experiments.sweep) into the cells of the one engine (results/cells/<cell>/, nmt/run_names.py), without retraining:
hypotheses, config, log and TensorBoard files kept, a run that several tables held (copied there) one cell.

    python scripts/migrate_results.py [--check]

Each record gains the cell's name, its composed choices and the command that now reproduces it; what it said
before (its command, table, row and identity) is kept under "migrated_from". Before anything moves, every record's
new command is composed and must name the cell its recorded config names (--check stops there)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from nmt.compose import register_schemas
from nmt.outputs import write_json
from nmt.recorded_config import with_schema_defaults
from nmt.compose import named_cell
from nmt.config import SECTIONS
from nmt.compose import cell_name_for

ROOT = Path(__file__).resolve().parent.parent
TABLES = ("table1", "table2", "table3", "beyond", "descendants", "length", "lr_check")  # a cell's study: the first
ROW_ABLATION = {"none": "neither", "key+value": "k16"}  # the old rows' names that differ from configs/ablation/


def new_overrides(table: str, row: str, seed: int) -> list[str]:
    """The overrides of `relnmt-train -m +study=<table>` that run this row's seed alone."""
    pair, _, mode = row.partition(".") if row.startswith(("en-de.", "en-fr.")) else ("en-de", "", row)
    extra = []
    if table == "lr_check":
        mode, _, rate = mode.partition(".")
        extra = [f"optim.bias_lr_scale={rate.removeprefix('bias_lr')}" if rate.startswith("bias_lr")
                 else f"optim.lr_scale={rate.removeprefix('lr')}"]
    data = [f"data=multi30k_{pair.replace('-', '_')}"] if table in ("table1", "beyond", "descendants") else []
    return [f"+study={table}", f"+ablation={ROW_ABLATION.get(mode, mode)}", *data, *extra, f"train.seed={seed}"]


def cell_of(record: dict) -> str:
    """The cell the record's resolved config names (its score split is the cell's; its lines were all)."""
    config = {section: with_schema_defaults(section, record["config"].get(section, {})) for section in SECTIONS}
    config["train"].update(score_split=record["split"], score_lines=0)
    overrides = dict(o.lstrip("+").split("=", 1) for o in record["command"].split()[4:] if "=" in o)
    choices = {"model": overrides["model"], "data": overrides["data"], "experiment": overrides["experiment"]}
    return named_cell(config, choices), choices, config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compose and compare only; move nothing")
    args = parser.parse_args()
    register_schemas()
    cells: dict[str, dict] = {}
    for table in TABLES:
        for path in sorted((ROOT / "results").glob(f"{table}/*/seed*/result.json")):
            record = json.loads(path.read_text())
            if "same_run_as" in record:  # a copy: its original's cell must be the same
                record["command"] = json.loads((ROOT / record["same_run_as"] / "result.json").read_text())["command"]
            name, choices, config = cell_of(record)
            overrides = new_overrides(table, path.parent.parent.name, record["seed"])
            composed = cell_name_for(overrides)
            if composed != name:
                sys.exit(f"{path}: its config names {name}, but `relnmt-train -m {' '.join(overrides)}` composes "
                         f"{composed}")
            cell = cells.setdefault(name, {"paths": [], "record": record, "config": config, "choices": choices,
                                           "overrides": overrides})
            cell["paths"].append(path)
            if record["bleu"] != cell["record"]["bleu"] or record.get("hyp") != cell["record"].get("hyp"):
                sys.exit(f"{path} and {cell['paths'][0]} are one cell, {name}, with different scores")
    print(f"{sum(len(c['paths']) for c in cells.values())} records, {len(cells)} cells")
    if args.check:
        return 0
    for name, cell in cells.items():
        target, source = ROOT / "results" / "cells" / name, cell["paths"][0].parent
        record = cell["record"]
        if (target / "result.json").is_file():
            continue
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("result.json"))
        original = {key: record.pop(key) for key in ("command", "command_as_run", "table", "row", "identity",
                                                     "same_run_as") if key in record}
        original["records"] = [str(p.relative_to(ROOT)) for p in cell["paths"]]
        record.update(config=cell["config"], choices=cell["choices"], cell=name,
                      overrides=cell["overrides"][1:], migrated_from=original,
                      command=f"relnmt-train -m {' '.join(cell['overrides'])}")
        write_json(target / "result.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
