"""The one collector: a sweep's cells (DIR/<cell>/result.json, written by nmt/lab/record.py) grouped into rows.

A row is the cells of one run but for the seed: the cell's name less its seed (nmt/run_names.py cell_name_of),
computed from the config each result records, so two spellings of one run are one row. The tables of
results/README.md declare their rows by the overrides that sweep them (results/tables.yaml); a declared row is the
cells whose row name those overrides compose to. Every score a table prints is first scored again from the cell's
hypotheses against its reference (check_scores): a table never prints a number its hypotheses do not give."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

from nmt.data.readers import DataError
from nmt.recorded_config import with_schema_defaults
from nmt.compose import named_cell
from nmt.config import SECTIONS
from nmt.compose import cell_name_for

ROOT = Path(__file__).resolve().parents[2]
# the bundled Multi30k files a cell's split is scored against (the tables: test; the learning-rate check: valid)
SPLIT_SOURCE = {"test": ROOT / "data" / "multi30k" / "test_2016_flickr.{lang}.gz",
                "valid": ROOT / "data" / "multi30k" / "val.{lang}.gz"}
SCORES = ("bleu", "chrf", "tokenized")
WITHOUT_SEED = ("train.seed",)


def row_of(result: dict) -> str:
    """The row a cell's result belongs to: its cell's name less the seed."""
    config = {section: with_schema_defaults(section, result["config"].get(section, {})) for section in SECTIONS}
    return named_cell(config, result["choices"], WITHOUT_SEED)


def read_cells(folder: Path) -> tuple[dict[str, list[dict]], list[Path]]:
    """({row: its cells' results, by seed}, the cells of `folder` that hold no score): every cell is either."""
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder (a sweep's folder holds one folder per cell)")
    rows: dict[str, list[dict]] = {}
    unscored = []
    for cell in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        path = cell / "result.json"
        if not path.is_file():
            unscored.append(cell)
            continue
        result = json.loads(path.read_text())
        result["folder"] = cell
        rows.setdefault(row_of(result), []).append(result)
    return {row: sorted(cells, key=lambda r: r["seed"]) for row, cells in rows.items()}, unscored


@functools.cache
def declared_row(study: str, overrides: tuple[str, ...]) -> str:
    """The row name that `relnmt-train -m +study=<study> <overrides>` gives its cells."""
    return cell_name_for([f"+study={study}", *overrides], WITHOUT_SEED)


def declared_rows(rows: dict[str, list[dict]], study: str, declared: dict[str, list[str]],
                  rescore: bool = True) -> dict[str, dict[int, dict]]:
    """{row's label: {seed: result}} of the declared rows that have cells, each score checked (check_scores)."""
    found = {}
    for label, overrides in declared.items():
        cells = rows.get(declared_row(study, tuple(overrides)), [])
        for result in cells:
            result["hyps"] = (result["folder"] / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1]
            check_scores(result, SCORES if rescore else ())
        if cells:
            found[label] = {result["seed"]: result for result in cells}
    return found


@functools.cache
def reference_lines(lang: str, split: str = "test") -> tuple[str, ...]:
    with gzip.open(str(SPLIT_SOURCE[split]).format(lang=lang), "rt", encoding="utf-8") as f:
        return tuple(line.rstrip("\n").strip() for line in f)


def check_scores(result: dict, metrics: tuple[str, ...] = SCORES) -> None:
    """Score the cell's hypotheses again against the bundled references (the tokenized BLEU under the key its
    language's convention names: nmt/score.py); DataError naming the cell where a recorded score differs."""
    from sacrebleu.metrics import BLEU, CHRF

    from nmt.score import tokenized_bleu, tokenized_key

    lang, split = result["pair"].split("-")[1], result.get("split", "test")
    refs = list(reference_lines(lang, split))
    scorers = {"bleu": lambda: BLEU().corpus_score(result["hyps"], [refs]).score,
               "chrf": lambda: CHRF().corpus_score(result["hyps"], [refs]).score,
               "tokenized": lambda: tokenized_bleu(result["hyps"], refs, lang)}
    for metric in metrics:
        key = tokenized_key(lang) if metric == "tokenized" else metric
        again = scorers[metric]()
        if key not in result or abs(again - result[key]) > 1e-6:
            recorded = f"{result[key]:.4f}" if key in result else "nothing"
            raise DataError(f"{result['folder'] / 'result.json'}: records {key} = {recorded}, but {result['hyp']} "
                            f"scores {again:.4f} against {SPLIT_SOURCE[split].name.format(lang=lang)}")
