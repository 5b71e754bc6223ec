"""The learning-rate check's table (experiments.sweep lr_check): each mode's validation BLEU (beam 4, the whole valid
split) and NLL at the shared learning rate, half and twice it (and T5's bias tables at 10x), one seed, and the best
rate by validation BLEU. Beside them the same-code control: the NLL the descendants table's seed-1 run of the mode
logged at its last update (trained earlier, at the shared rate) against this check's run at x1 (the same config and
seed, the current code), with the spread of the table's own seeds as the yardstick for "beyond seed noise"."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

from experiments.sweep import TABLES

RATES = ("0.5", "1", "2")


def final_valid_nll(run_dir: Path) -> float | None:
    """The validation NLL (nats per target token, whole valid split) the run logged at its last update; None
    where its train.log is missing or logged no validation."""
    log = run_dir / "train.log"
    lines = [line for line in log.read_text().splitlines() if " valid update " in line] if log.is_file() else []
    found = re.search(r" nll ([\d.]+)", lines[-1]) if lines else None
    return float(found.group(1)) if found else None


def table_nlls(results: Path, mode: str) -> list[float]:
    """The final validation NLL of each seed of the descendants table's En-De row of this mode, seed 1 first."""
    runs = sorted((results / "descendants" / f"en-de.{mode}").glob("seed*/train.log"))
    return [nll for nll in (final_valid_nll(log.parent) for log in runs) if nll is not None]


def lr_check_table(results: Path) -> str:
    order = {}  # the modes in the sweep's order: sinusoids, Shaw, then the descendants
    for row in TABLES["lr_check"]["rows"]:
        order.setdefault(row.split(".")[1], len(order))
    runs: dict[str, dict[str, tuple[float, float | None]]] = {}
    for path in sorted(results.glob("lr_check/*/seed1/result.json")):
        mode, _, rate = path.parent.parent.name.removeprefix("en-de.").partition(".")
        runs.setdefault(mode, {})[rate] = (json.loads(path.read_text())["bleu"], final_valid_nll(path.parent))
    lines = [("| mode | valid BLEU at lr ×0.5 / ×1 / ×2 | valid NLL at ×0.5 / ×1 / ×2 | other rate | best (valid BLEU) "
              "| NLL of the table's seed-1 run (its code) | sd of the NLL over the table's seeds |"),
             "|---|---|---|---|---|---|---|"]
    for mode, rates in sorted(runs.items(), key=lambda item: order.get(item[0], len(order))):
        shown = [rates.get(f"lr{scale}") for scale in RATES]
        extra = {rate: score for rate, score in rates.items() if not rate.startswith("lr")}
        best = max(rates, key=lambda rate: rates[rate][0])
        nlls = table_nlls(results, mode)
        lines.append(f"| {mode} | {' / '.join(f'{s[0]:.2f}' if s else '–' for s in shown)} | "
                     f"{' / '.join(f'{s[1]:.3f}' if s and s[1] is not None else '–' for s in shown)} | "
                     f"{', '.join(f'{rate}: {s[0]:.2f} (NLL {s[1]:.3f})' for rate, s in extra.items())} | "
                     f"{best.replace('lr', '×')}{' (the shared rate)' if best == 'lr1' else ''}"
                     f"{'' if len(rates) == len(RATES) + len(extra) else ' (not all rates run yet)'} | "
                     f"{f'{nlls[0]:.3f}' if nlls else '–'} | "
                     f"{f'{statistics.stdev(nlls):.3f} ({len(nlls)} seeds)' if len(nlls) > 1 else '–'} |")
    return "\n".join(lines)
