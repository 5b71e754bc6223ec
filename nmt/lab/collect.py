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
import logging
from pathlib import Path

from nmt.data.readers import DataError, read_lines
from nmt.compose import cell_name_for, named_cell
from nmt.config import SECTIONS
from nmt.recorded_config import with_schema_defaults

log = logging.getLogger("nmt.lab.collect")

ROOT = Path(__file__).resolve().parents[2]
# the bundled Multi30k files a Multi30k cell's split is scored against (the tables: test; the learning-rate check:
# valid): the prepared copies its record names are not committed, the bundled files are, with the same lines
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
        try:
            result = json.loads(path.read_text())
            result["folder"] = cell
            row = row_of(result)
        except (ValueError, KeyError, TypeError, AttributeError) as broken:  # cut short, or not a record
            log.warning("%s: not a record (%s: %s), left out: score the cell again (run its command again)", path,
                        type(broken).__name__, broken)
            unscored.append(cell)
            continue
        rows.setdefault(row, []).append(result)
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


def bundled(result: dict) -> bool:
    """Whether a cell was scored on a split of the bundled Multi30k (its record's prepared copy is not committed)."""
    return str(result.get("choices", {}).get("data", "")).startswith("multi30k") and \
        result.get("split", "test") in SPLIT_SOURCE


def reference_source(result: dict) -> Path:
    """The file a cell was scored against: the bundled Multi30k file of its split, else the reference file its
    record names (`ref`, as the run saw it: relative to where it ran, here the checkout)."""
    if bundled(result):
        return Path(str(SPLIT_SOURCE[result.get("split", "test")]).format(lang=result["pair"].split("-")[1]))
    ref = Path(result.get("ref", ""))
    return ref if ref.is_absolute() or ref.is_file() else ROOT / ref


def cell_references(result: dict) -> tuple[str, ...]:
    """The reference lines a cell's hypotheses are scored against (reference_source), as many as it decoded;
    DataError naming the cell when its file is not here."""
    if bundled(result):
        lines = reference_lines(result["pair"].split("-")[1], result.get("split", "test"))
    else:
        source = reference_source(result)
        if not source.is_file():
            raise DataError(f"{result['folder'] / 'result.json'}: its reference {result.get('ref')} is not here "
                            f"({source}): prepare its data again to score it")
        lines = tuple(read_lines(source))  # as the run read it (nmt/lab/record.py decode_and_score)
    return lines[:result.get("sentences", len(lines))]


def check_scores(result: dict, metrics: tuple[str, ...] = SCORES) -> None:
    """Score the cell's hypotheses again against its references (references; the tokenized BLEU under the key its
    language's convention names: nmt/score.py); DataError naming the cell where a recorded score differs."""
    from sacrebleu.metrics import BLEU, CHRF

    from nmt.score import tokenized_bleu, tokenized_key

    lang = result["pair"].split("-")[1]
    refs = list(cell_references(result))
    scorers = {"bleu": lambda: BLEU().corpus_score(result["hyps"], [refs]).score,
               "chrf": lambda: CHRF().corpus_score(result["hyps"], [refs]).score,
               "tokenized": lambda: tokenized_bleu(result["hyps"], refs, lang)}
    for metric in metrics:
        key = tokenized_key(lang) if metric == "tokenized" else metric
        again = scorers[metric]()
        if key not in result or abs(again - result[key]) > 1e-6:
            recorded = f"{result[key]:.4f}" if key in result else "nothing"
            raise DataError(f"{result['folder'] / 'result.json'}: records {key} = {recorded}, but {result['hyp']} "
                            f"scores {again:.4f} against {reference_source(result).name}")
