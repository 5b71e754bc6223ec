"""The tables of results/README.md from the cells of results/cells, as results/tables.yaml declares them:
`relnmt-table results/README.md` (nmt/table.py) replaces the text between `<!-- results:NAME -->` and
`<!-- /results:NAME -->` with the table NAME.

Each row: sacreBLEU mean ± sample std over its seeds (n = seeds found), chrF, the tokenized BLEU of the paper's era
(compounds split for German targets only: nmt/score.py), and two tests of the row against the rows it is declared
against. The verdict's: Welch's t-test on the per-seed BLEU (the seed is the unit, so the p-value counts seed
variance; none for a row of fewer than 3 seeds), Holm-adjusted over one family: every distinct seed-level
comparison the file declares (one comparison printed in two tables counts once, so it gets one verdict); the verdict
column reads the adjusted p only (nmt/lab/stats.py verdict). Beside it, sacrebleu's paired bootstrap (`--paired-bs`;
1,000 resamples, seed 12345) on the concatenation of the seeds' hypotheses (seed k against seed k), which resamples
sentences only: it shows whether the test set could tell the two systems apart, not whether other seeds would;
0.001 is its floor at 1,000 resamples. Every cell's BLEU, chrF and tokenized BLEU are scored again from its
hypotheses first (nmt/lab/collect.py check_scores)."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import yaml

from nmt.lab.collect import declared_rows, read_cells, reference_lines, cell_references
from nmt.score import tokenized_bleu_of
from nmt.lab.stats import MIN_SEEDS, holm, holm_levels, mean_sd, p_cell, seed_noise, seed_p, verdict

LENGTH_BUCKETS = [(1, 9), (10, 12), (13, 15), (16, 19), (20, 999)]
TOKENIZED_COLUMN = "tokenized BLEU (de: compounds split; fr: not)"
RATES = ("0.5", "1", "2")  # the learning-rate check's scales of the shared rate


def load_tables(declarations: Path) -> dict:
    return yaml.safe_load(declarations.read_text(encoding="utf-8"))


def table_rows(cells: dict, table: dict, rescore: bool = True) -> dict[str, dict[int, dict]]:
    return declared_rows(cells, table["study"], table["rows"], rescore)


def page_table(results: Path, name: str, rescore: bool = True) -> dict[str, dict[int, dict]]:
    """The rows of the page's table `name` ({row: {seed: result}}), from results/cells as results/tables.yaml
    declares them: what a study script (plots, the length study's report) reads."""
    return table_rows(read_cells(results / "cells")[0], load_tables(results / "tables.yaml")[name], rescore)


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


def comparisons(table: dict, rows: dict[str, dict[int, dict]]) -> dict[str, list[str]]:
    """row -> the rows it is tested against, those present with a seed in common."""
    return {name: [r for r in table.get("against", {}).get(name, []) if r in rows and set(rows[r]) & set(seeds)]
            for name, seeds in rows.items()}


def seed_bleu(seeds: dict[int, dict]) -> tuple[float, ...]:
    return tuple(seeds[s]["bleu"] for s in sorted(seeds))


def holm_family(tables: dict[str, tuple[dict, dict]]) -> dict[tuple, tuple[float, float]]:
    """The family the page concludes from: every distinct seed-level comparison the page declares (one comparison
    printed in two tables, the same cells, counts once), each Holm-adjusted over all of them, with the level Holm's
    step-down held it to (nmt/lab/stats.py holm_levels); keyed by the two rows' per-seed BLEU."""
    raw = {}
    for table, rows in tables.values():
        for name, references in comparisons(table, rows).items():
            for r in references:
                key = (seed_bleu(rows[name]), seed_bleu(rows[r]))
                p = seed_p(list(key[0]), list(key[1]))
                if p is not None:
                    raw[key] = p
    return dict(zip(raw, zip(holm(list(raw.values())), holm_levels(list(raw.values())))))


def bleu_table(table: dict, rows: dict[str, dict[int, dict]], samples: int,
               adjusted: dict[tuple, tuple[float, float]], family: str = "all tables") -> str:
    """The table's rows, each against its reference rows: Welch's p over seeds, the Holm-adjusted p over the page's
    family (holm_family), the verdict from the adjusted p, and the paired bootstrap."""
    counted = table.get("parameters", False)  # rows that differ in their position parameters: each count shown
    lines = [f"| row | seeds | sacreBLEU (mean ± std) | chrF | {TOKENIZED_COLUMN} | paper | vs | p (seeds, Welch) "
             f"| p (Holm, {family}) | verdict (Holm, family-wise 0.05) | p (sentences, paired bootstrap) |"
             + (" parameters |" if counted else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if counted else "")]
    against = comparisons(table, rows)
    bleu = {name: list(seed_bleu(seeds)) for name, seeds in rows.items()}
    for name, seeds in rows.items():
        results = [seeds[s] for s in sorted(seeds)]
        refs = list(cell_references(results[0]))  # a row's seeds share their split and lines (both define its cells)
        tested = [(name, r) for r in against[name]]
        raw = {t: seed_p(bleu[t[0]], bleu[t[1]]) for t in tested}
        adjusted_p, level = {}, {}
        for t in tested:
            adjusted_p[t], level[t] = adjusted.get((tuple(bleu[t[0]]), tuple(bleu[t[1]])), (None, None))
        p = " / ".join(f"{paired_bootstrap(*seed_paired(seeds, rows[r], refs), samples):.4f}" for r in against[name])
        paper = table.get("paper", {}).get(name)
        lines.append(f"| {name} | {len(results)} | {mean_sd(bleu[name])} | "
                     f"{statistics.mean(r['chrf'] for r in results):.2f} | "
                     f"{statistics.mean(tokenized_bleu_of(r) for r in results):.2f} | "
                     f"{paper if paper is not None else ''} | {' / '.join(against[name])} | "
                     f"{' / '.join(p_cell(raw[t]) for t in tested)} | "
                     f"{' / '.join(p_cell(adjusted_p[t]) for t in tested)} | "
                     f"{' / '.join(verdict(bleu[name], bleu[t[1]], adjusted_p[t], level[t]) for t in tested)} | {p} |"
                     + (f" {parameters(results[0]):,} |" if counted else ""))
    seen = [f"{name}: {why}" for name, why in table.get("seen_on_test_first", {}).items() if name in rows]
    return "\n".join([*lines, *(["", "Chosen after their test results were seen (not a validation choice): "
                                 + "; ".join(seen) + "."] if seen else [])])


def bucket_label(lo: int, hi: int) -> str:
    return f"{lo}–{hi}" if hi < 999 else f"≥ {lo}"


def length_table(rows: dict[str, dict[int, dict]]) -> str:
    """sacreBLEU by source length (words) of test_2016_flickr, mean over seeds."""
    from sacrebleu.metrics import BLEU

    sources, refs = reference_lines("en"), reference_lines("de")
    buckets = [[i for i, s in enumerate(sources) if lo <= len(s.split()) <= hi] for lo, hi in LENGTH_BUCKETS]
    head = " | ".join(bucket_label(lo, hi) for lo, hi in LENGTH_BUCKETS)
    lines = [f"| row | seeds | {head} |", "|---|---|" + "---|" * len(buckets),
             "| sentences | | " + " | ".join(str(len(b)) for b in buckets) + " |"]
    for name, seeds in rows.items():
        cells = []
        for bucket in buckets:
            scores = [BLEU().corpus_score([r["hyps"][i] for i in bucket], [[refs[i] for i in bucket]]).score
                      for r in seeds.values()]
            cells.append(mean_sd(scores))
        lines.append(f"| {name} | {len(seeds)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def final_valid_nll(cell: Path) -> float | None:
    """The validation NLL (nats per target token, whole valid split) the cell logged at its last update; None
    where its train.log is missing or logged no validation."""
    log = cell / "train.log"
    lines = [line for line in log.read_text().splitlines() if " valid update " in line] if log.is_file() else []
    found = re.search(r" nll ([\d.]+)", lines[-1]) if lines else None
    return float(found.group(1)) if found else None


def seeds_note(n: int) -> str:
    return f"; mean of {n} seeds" if n > 1 else ""


def best_rate(rates: dict[str, list[float]]) -> str:
    """The rate with the highest mean validation BLEU, and what seed noise allows of its lead over the next
    (nmt.lab.stats.seed_noise over the seeds of the mode's rates run more than once)."""
    ranked = sorted(rates, key=lambda rate: -statistics.mean(rates[rate]))
    best = ranked[0]
    label = f"{best.replace('lr', '×')}{' (the shared rate)' if best == 'lr1' else ''}"
    if len(ranked) == 1:
        return label
    runner = ranked[1]
    gap = statistics.mean(rates[best]) - statistics.mean(rates[runner])
    said = f"{label}, {gap:.2f} above {runner.replace('lr', '×')}"
    bound = seed_noise(list(rates.values()), len(rates[best]), len(rates[runner]))
    if bound is None:
        return f"{said} (seed spread not measured: its repeated seeds give fewer than {MIN_SEEDS - 1} degrees of freedom)"
    return f"{said}: {'beyond' if gap > bound else 'within'} seed noise (±{bound:.2f})"


def rate_table(rows: dict[str, dict[int, dict]], control: dict[str, dict[int, dict]]) -> str:
    """The learning-rate check: each mode's validation BLEU and NLL at the shared rate, half and twice it (rows
    <pair>.<mode>.lr<scale>, other rows of the mode shown beside; a rate's seeds averaged), the best rate by
    validation BLEU with what the seeds allow of its lead (best_rate), the seeds' spread at x1; beside
    them the same-code control: the final validation NLL of the `control` table's seed-1 cell of the mode (trained
    earlier, at the shared rate), with the spread of its seeds as the yardstick for "beyond seed noise"."""
    runs: dict[str, dict[str, tuple[float, float | None]]] = {}
    bleus: dict[str, dict[str, list[float]]] = {}
    for name, seeds in rows.items():
        pair, mode, rate = name.split(".", 2)
        nlls = [final_valid_nll(seeds[s]["folder"]) for s in sorted(seeds)]
        bleus.setdefault(mode, {})[rate] = [seeds[s]["bleu"] for s in sorted(seeds)]
        runs.setdefault(mode, {})[rate] = (statistics.mean(bleus[mode][rate]),
                                           None if None in nlls else statistics.mean(nlls))
    lines = [("| mode | valid BLEU at lr ×0.5 / ×1 / ×2 | valid NLL at ×0.5 / ×1 / ×2 | other rate | sd of valid BLEU "
              "at ×1 | best (valid BLEU) | NLL of the table's seed-1 run (its code) | sd of the NLL over the table's "
              "seeds |"),
             "|---|---|---|---|---|---|---|---|"]
    for mode, rates in runs.items():
        shown = [rates.get(f"lr{scale}") for scale in RATES]
        counts = {rate: len(values) for rate, values in bleus[mode].items()}
        extra = {rate: score for rate, score in rates.items() if not rate.startswith("lr")}
        seeds = control.get(f"{pair}.{mode}", {})
        nlls = [nll for nll in (final_valid_nll(seeds[s]["folder"]) for s in sorted(seeds)) if nll is not None]
        bleu = [f"{s[0]:.2f}{f' ({n} seeds)' if n > 1 else ''}" if s else "–"
                for s, n in zip(shown, (counts.get(f"lr{scale}", 1) for scale in RATES))]
        at_shared = bleus[mode].get("lr1", [])
        lines.append(f"| {mode} | {' / '.join(bleu)} | "
                     f"{' / '.join(f'{s[1]:.3f}' if s and s[1] is not None else '–' for s in shown)} | "
                     f"{', '.join(f'{rate}: {s[0]:.2f} (NLL {s[1]:.3f}{seeds_note(counts[rate])})' for rate, s in extra.items())} | "
                     f"{f'{statistics.stdev(at_shared):.2f} ({len(at_shared)} seeds)' if len(at_shared) > 1 else '–'} | "
                     f"{best_rate(bleus[mode])}"
                     f"{'' if len(rates) == len(RATES) + len(extra) else ' (not all rates run yet)'} | "
                     f"{f'{nlls[0]:.3f}' if nlls else '–'} | "
                     f"{f'{statistics.stdev(nlls):.3f} ({len(nlls)} seeds)' if len(nlls) > 1 else '–'} |")
    return "\n".join(lines)


def page_blocks(cells_folder: Path, declarations: Path, samples: int = 1000,
                wanted: set[str] | None = None) -> tuple[dict[str, str], list[Path]]:
    """{block name: its Markdown table} of every declared table (those in `wanted`), and the cells that hold no
    score. Every table is read: the family of tests is the page's."""
    cells, unscored = read_cells(cells_folder)
    tables = load_tables(declarations)
    read = {name: (table, table_rows(cells, table, rescore=wanted is None or name in wanted or
                                      bool(set(table.get("blocks", {})) & wanted)))
            for name, table in tables.items()}
    adjusted = holm_family(read)
    blocks = {}
    for name, (table, rows) in read.items():
        for block, names in (table.get("blocks") or {name: list(rows)}).items():
            if wanted is not None and block not in wanted:
                continue
            picked = {row: rows[row] for row in names if row in rows}
            if table.get("by_rate"):
                blocks[block] = rate_table(picked, read[table["control"]][1])
            elif picked:
                blocks[block] = bleu_table(table, picked, samples, adjusted) + (
                    "\n\nBy source length (words):\n\n" + length_table(picked) if table.get("by_length") else "")
    return blocks, unscored


def replace_block(text: str, name: str, block: str) -> str:
    pattern = re.compile(rf"(<!-- results:{re.escape(name)} -->\n).*?(<!-- /results:{re.escape(name)} -->)", re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"no <!-- results:{name} --> ... <!-- /results:{name} --> block in the page")
    return pattern.sub(lambda m: m.group(1) + block + "\n" + m.group(2), text)

