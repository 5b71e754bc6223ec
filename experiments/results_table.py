"""Turn results/<table>/<row>/seed<k>/result.json into the tables of results/README.md (Markdown).

    python -m experiments.results_table [--readme results/README.md] [--samples 1000] [--blocks descendants ...]
                                        [--rescore]

Each row: sacreBLEU mean ± sample std over its seeds (n = seeds found), chrF, the tokenized BLEU of the paper's era
(compounds split for German targets only: nmt/score.py), and two tests of the row against its table's reference
rows. The verdict's: Welch's t-test on the per-seed BLEU (experiments/significance.py: the seed is the unit, so the
p-value counts seed variance; no p-value for a row of fewer than 3 seeds), Holm-adjusted over one family: every
distinct seed-level comparison in every table of the page (the text's conclusions draw on all of them; a comparison
printed in two tables counts once, so it gets one verdict); the verdict column reads the adjusted p only
("higher"/"lower" below 0.05, else no difference found, with the smallest difference the seeds could have detected at 80% power). Beside it,
sacrebleu's paired bootstrap (`--paired-bs`; 1,000 resamples, seed 12345) on the concatenation of the seeds'
hypotheses (seed k against seed k), which resamples sentences only: it shows whether the test set could tell the
two systems apart, not whether other seeds would; 0.001 is its floor at 1,000 resamples. Every run's BLEU, chrF and
tokenized BLEU are scored again from its committed hypotheses and the bundled references; a record that disagrees
stops the script, naming its file (--rescore first rewrites the tokenized BLEU of every record under the current
convention, keeping the old value and the command in the record's "rescored"). With --readme (results/README.md, as
make plots writes it), the text between `<!-- results:NAME -->` and `<!-- /results:NAME -->` in that file is
replaced by the table NAME.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import re
import statistics
import sys
from pathlib import Path

from experiments.lr_check import lr_check_table
from experiments.modes import ABSOLUTE, ALIBI, BOTH, BUCKETS, DESCENDANTS, LEARNED, NONE, RELATIVE, ROPE, T5
from experiments.significance import holm, p_cell, seed_p, verdict
from nmt.score import tokenized_bleu_of

ROOT = Path(__file__).resolve().parent.parent
# the bundled Multi30k files a record's split was scored against (the tables: test; the learning-rate check: valid)
SPLIT_SOURCE = {"test": ROOT / "data" / "multi30k" / "test_2016_flickr.{lang}.gz",
                "valid": ROOT / "data" / "multi30k" / "val.{lang}.gz"}
LENGTH_BUCKETS = [(1, 9), (10, 12), (13, 15), (16, 19), (20, 999)]

# The paper's figures next to ours: base model, compound-split BLEU; Table 1 on newstest2014, 2 and 3 on newstest2013.
PAPER = {
    "table1": {"en-de.absolute": 26.5, "en-de.relative": 26.8, "en-fr.absolute": 38.2, "en-fr.relative": 38.7},
    "table2": {"k0": 12.5, "k1": 25.5, "k2": 25.8, "k4": 25.9, "k16": 25.8, "k64": 25.9},
    "table3": {"key+value": 25.8, "key": 25.8, "value": 25.3, "neither": 12.5},
}
# Which row each row is tested against.
REFERENCE = {
    "table1": {"en-de.relative": "en-de.absolute", "en-fr.relative": "en-fr.absolute"},
    "table2": {f"k{k}": "k16" for k in (0, 1, 2, 4, 64)},
    "table3": {"key": "key+value", "value": "key+value", "neither": "key+value"},
    "length": {RELATIVE: ABSOLUTE, **{row: (ABSOLUTE, RELATIVE) for row in (LEARNED, T5, ALIBI, ROPE, BUCKETS)}},
    "descendants": {**{f"{pair}.relative": f"{pair}.absolute" for pair in ("en-de", "en-fr")},
                    **{f"{pair}.{row}": (f"{pair}.absolute", f"{pair}.relative")  # against sinusoids, then Shaw
                       for pair in ("en-de", "en-fr") for row in (LEARNED, BOTH, NONE, T5, ALIBI)},
                    # T5 with 10x the rate for its bias tables: against sinusoids, then T5 at the shared rate
                    **{f"{pair}.t5_lr10": (f"{pair}.absolute", f"{pair}.t5") for pair in ("en-de", "en-fr")},
                    # RoPE also against the best of the earlier rows, sinusoids with edge tables
                    **{f"{pair}.rope": (f"{pair}.absolute", f"{pair}.relative", f"{pair}.both")
                       for pair in ("en-de", "en-fr")},
                    # Shaw's vectors by T5's buckets: against Shaw's clip, then T5's bias on the same buckets
                    **{f"{pair}.buckets": (f"{pair}.relative", f"{pair}.t5") for pair in ("en-de", "en-fr")}},
    "beyond": {"en-de.relative": "en-de.absolute", "en-fr.relative": "en-fr.absolute", "en-de.shared": "en-de.relative",
               **{f"{pair}.{row}": (f"{pair}.absolute", f"{pair}.relative")  # against sinusoids, then relative
                  for pair in ("en-de", "en-fr") for row in (LEARNED, BOTH)}},
}
ORDER = {"length": [ABSOLUTE, RELATIVE, LEARNED, T5, ALIBI, ROPE, BUCKETS],
         "descendants": [f"{pair}.{row}" for pair in ("en-de", "en-fr")
                         for row in (*DESCENDANTS[:6], "t5_lr10", *DESCENDANTS[6:],
                                     BUCKETS)],
         "beyond": ["en-de.absolute", "en-de.relative", "en-de.learned", "en-de.both", "en-de.shared",
                    "en-fr.absolute", "en-fr.relative", "en-fr.learned", "en-fr.both"]}


SCORES = ("bleu", "chrf", "tokenized")
TOKENIZED_COLUMN = "tokenized BLEU (de: compounds split; fr: not)"

BLEU_BLOCKS = ("table1", "table2", "table3", "beyond", "descendants")
# The length study's rows, in two blocks of results/README.md: the paper's section (with learned positions) and
# the descendants'.
LENGTH_BLOCKS = {"length": (ABSOLUTE, RELATIVE, LEARNED), "descendants-length": (ABSOLUTE, RELATIVE, T5, ALIBI, ROPE, BUCKETS)}


def load_runs(results: Path, table: str, rescore: tuple[str, ...] = SCORES) -> dict[str, dict[int, dict]]:
    """row -> seed -> result (with its hypotheses), each score in `rescore` checked against its hypotheses."""
    rows: dict[str, dict[int, dict]] = {}
    for path in sorted(results.glob(f"{table}/*/seed*/result.json")):
        result = json.loads(path.read_text())
        result["hyps"] = (path.parent / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1]
        check_scores(path, result, rescore)
        rows.setdefault(path.parent.parent.name, {})[result["seed"]] = result
    order = ORDER.get(table) or list(PAPER.get(table, {}))
    return dict(sorted(rows.items(), key=lambda item: (order.index(item[0]) if item[0] in order else len(order),
                                                       item[0])))


@functools.cache
def test_lines(lang: str, split: str = "test") -> list[str]:
    with gzip.open(str(SPLIT_SOURCE[split]).format(lang=lang), "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").strip() for line in f]


def check_scores(path: Path, result: dict, metrics: tuple[str, ...] = SCORES) -> None:
    """Score the run's committed hypotheses again against the bundled references: a table never prints a number
    its hypotheses do not give (the tokenized BLEU under the key its language's convention names: nmt/score.py)."""
    from sacrebleu.metrics import BLEU, CHRF

    from nmt.score import tokenized_bleu, tokenized_key

    lang, split = result["pair"].split("-")[1], result.get("split", "test")
    refs = test_lines(lang, split)
    scorers = {"bleu": lambda: BLEU().corpus_score(result["hyps"], [refs]).score,
               "chrf": lambda: CHRF().corpus_score(result["hyps"], [refs]).score,
               "tokenized": lambda: tokenized_bleu(result["hyps"], refs, lang)}
    for metric in metrics:
        key = tokenized_key(lang) if metric == "tokenized" else metric
        again = scorers[metric]()
        if key not in result or abs(again - result[key]) > 1e-6:
            recorded = f"{result[key]:.4f}" if key in result else "nothing"
            raise SystemExit(f"{path}: records {key} = {recorded}, but {result['hyp']} scores {again:.4f} against "
                             f"{SPLIT_SOURCE[split].name.format(lang=lang)} (python -m experiments.results_table --rescore "
                             f"writes the scores of the current convention)")


def rescore(path: Path, command: str) -> bool:
    """Rewrite a record's tokenized BLEU under its language's current convention (nmt/score.py), the old value
    kept under "rescored"; whether it changed."""
    from nmt.score import tokenized_bleu, tokenized_key

    result = json.loads(path.read_text())
    lang = result["pair"].split("-")[1]
    key = tokenized_key(lang)
    value = tokenized_bleu((path.parent / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1],
                           test_lines(lang, result.get("split", "test")), lang)
    old = {k: result[k] for k in ("compound_split_bleu", "tokenized_bleu") if k in result and k != key}
    if not old and key in result and abs(result[key] - value) <= 1e-6:
        return False
    for k in old:
        del result[k]
    result[key] = value
    result.setdefault("rescored", []).append({"replaced": old, key: value, "command": command})
    path.write_text(json.dumps(result, indent=2) + "\n")
    return True


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def paired_bootstrap(system: list[str], baseline: list[str], refs: list[str], samples: int) -> float:
    """sacrebleu's paired bootstrap resampling (as `sacrebleu --paired-bs`): p-value of system vs baseline."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU()}, [refs],
                      test_type="bs", n_samples=samples)
    _, scores = test()
    return scores["BLEU"][1].p_value


def seed_paired(row: dict[int, dict], other: dict[int, dict], refs: list[str]) -> tuple[list, list, list]:
    seeds = sorted(set(row) & set(other))
    return ([h for s in seeds for h in row[s]["hyps"]], [h for s in seeds for h in other[s]["hyps"]],
            [r for _ in seeds for r in refs])


def parameters(result: dict) -> int:
    """The row's parameter count, from the model config and vocabulary size its result records."""
    from nmt.config import ModelConfig
    from nmt.modeling.transformer import Transformer, count_parameters

    return count_parameters(Transformer(ModelConfig(**result["config"]["model"]), result["config"]["data"]["vocab_size"]))


def comparisons(table: str, rows: dict[str, dict[int, dict]]) -> dict[str, list[str]]:
    """row -> the rows it is tested against (REFERENCE), those present with a seed in common."""
    against = {}
    for name, seeds in rows.items():
        references = REFERENCE.get(table, {}).get(name) or ()
        against[name] = [r for r in ((references,) if isinstance(references, str) else references)
                         if r in rows and set(rows[r]) & set(seeds)]
    return against


def seed_bleu(seeds: dict[int, dict]) -> tuple[float, ...]:
    return tuple(seeds[s]["bleu"] for s in sorted(seeds))


def holm_family(tables: dict[str, dict[str, dict[int, dict]]]) -> dict[tuple, float]:
    """The family the page concludes from: every distinct seed-level comparison in every table of results/README.md
    (one comparison printed in two tables, the same runs, counts once), each Holm-adjusted over all of them;
    keyed by the two rows' per-seed BLEU."""
    raw = {}
    for table, rows in tables.items():
        for name, references in comparisons(table, rows).items():
            for r in references:
                key = (seed_bleu(rows[name]), seed_bleu(rows[r]))
                p = seed_p(list(key[0]), list(key[1]))
                if p is not None:
                    raw[key] = p
    return dict(zip(raw, holm(list(raw.values()))))


def bleu_table(table: str, rows: dict[str, dict[int, dict]], samples: int, adjusted: dict[tuple, float]) -> str:
    """The table's rows, each against its reference rows: Welch's p over seeds, the Holm-adjusted p over the page's
    family (holm_family), the verdict from the adjusted p, and the paired bootstrap."""
    counted = table == "descendants"  # its rows differ in their position parameters: each count beside its BLEU
    lines = [f"| row | seeds | sacreBLEU (mean ± std) | chrF | {TOKENIZED_COLUMN} | paper | vs | p (seeds, Welch) "
             "| p (Holm, all tables) | verdict (Holm, family-wise 0.05) | p (sentences, paired bootstrap) |"
             + (" parameters |" if counted else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if counted else "")]
    against = comparisons(table, rows)
    bleu = {name: list(seed_bleu(seeds)) for name, seeds in rows.items()}
    refs_by_pair = {}
    for name, seeds in rows.items():
        pair = next(iter(seeds.values()))["pair"]
        if pair not in refs_by_pair:
            refs_by_pair[pair] = test_lines(pair.split("-")[1])
        results = [seeds[s] for s in sorted(seeds)]
        tested = [(name, r) for r in against[name]]
        raw = {t: seed_p(bleu[t[0]], bleu[t[1]]) for t in tested}
        adjusted_p = {t: adjusted.get((tuple(bleu[t[0]]), tuple(bleu[t[1]]))) for t in tested}
        p = " / ".join(f"{paired_bootstrap(*seed_paired(seeds, rows[r], refs_by_pair[pair]), samples):.4f}"
                       for r in against[name])
        paper = PAPER.get(table, {}).get(name)
        lines.append(f"| {name} | {len(results)} | {mean_std(bleu[name])} | "
                     f"{statistics.mean(r['chrf'] for r in results):.2f} | "
                     f"{statistics.mean(tokenized_bleu_of(r) for r in results):.2f} | "
                     f"{paper if paper is not None else ''} | {' / '.join(against[name])} | "
                     f"{' / '.join(p_cell(raw[t]) for t in tested)} | "
                     f"{' / '.join(p_cell(adjusted_p[t]) for t in tested)} | "
                     f"{' / '.join(verdict(bleu[name], bleu[t[1]], adjusted_p[t]) for t in tested)} | {p} |"
                     + (f" {parameters(results[0]):,} |" if counted else ""))
    return "\n".join(lines)


def bucket_label(lo: int, hi: int) -> str:
    return f"{lo}–{hi}" if hi < 999 else f"≥ {lo}"


def length_table(rows: dict[str, dict[int, dict]]) -> str:
    """sacreBLEU by source length (words) of test_2016_flickr, mean over seeds."""
    from sacrebleu.metrics import BLEU

    sources, refs = test_lines("en"), test_lines("de")
    buckets = [[i for i, s in enumerate(sources) if lo <= len(s.split()) <= hi] for lo, hi in LENGTH_BUCKETS]
    head = " | ".join(bucket_label(lo, hi) for lo, hi in LENGTH_BUCKETS)
    lines = [f"| row | seeds | {head} |", "|---|---|" + "---|" * len(buckets),
             "| sentences | | " + " | ".join(str(len(b)) for b in buckets) + " |"]
    for name, seeds in rows.items():
        cells = []
        for bucket in buckets:
            scores = [BLEU().corpus_score([r["hyps"][i] for i in bucket], [[refs[i] for i in bucket]]).score
                      for r in seeds.values()]
            cells.append(mean_std(scores))
        lines.append(f"| {name} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def replace_block(text: str, name: str, block: str) -> str:
    pattern = re.compile(rf"(<!-- results:{re.escape(name)} -->\n).*?(<!-- /results:{re.escape(name)} -->)", re.DOTALL)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- results:{name} --> ... <!-- /results:{name} --> block in the file given to "
                         "--readme (results/README.md)")
    return pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=ROOT / "results")
    parser.add_argument("--readme", type=Path, help="replace the marked blocks in this file (results/README.md)")
    parser.add_argument("--samples", type=int, default=1000, help="bootstrap resamples")
    parser.add_argument("--rescore", action="store_true", help="first rewrite every record's tokenized BLEU under "
                        "its target language's convention (nmt/score.py), noting the old value and this command")
    parser.add_argument("--blocks", nargs="+", choices=[*BLEU_BLOCKS, *LENGTH_BLOCKS, "lr_check"], default=None,
                        help="only these blocks (default: all)")
    args = parser.parse_args()
    wanted = set(args.blocks or [*BLEU_BLOCKS, *LENGTH_BLOCKS, "lr_check"])
    if args.rescore:
        command = "python -m experiments.results_table --rescore"
        changed = [p for p in sorted(args.results.glob("*/*/seed*/result.json")) if rescore(p, command)]
        print(f"rescored {len(changed)} records: " + ", ".join(str(p.relative_to(args.results)) for p in changed))
    runs = {table: load_runs(args.results, table, SCORES if wanted & {table, *LENGTH_BLOCKS} else ())
            for table in (*BLEU_BLOCKS, "length")}  # every table: the family of tests is the page's
    adjusted = holm_family(runs)
    blocks = {table: bleu_table(table, runs[table], args.samples, adjusted)
              for table in BLEU_BLOCKS if table in wanted and runs[table]}
    if "lr_check" in wanted and (args.results / "lr_check").is_dir():
        blocks["lr_check"] = lr_check_table(args.results)
    for block, names in LENGTH_BLOCKS.items():
        rows = {name: seeds for name, seeds in runs["length"].items() if name in names}
        if rows and block in wanted:
            blocks[block] = bleu_table("length", rows, args.samples, adjusted) + \
                "\n\nBy source length (words):\n\n" + length_table(rows)
    for name, block in blocks.items():
        print(f"## {name}\n\n{block}\n")
    if args.readme:
        text = args.readme.read_text(encoding="utf-8")
        for name, block in blocks.items():
            text = replace_block(text, name, block)
        args.readme.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
