"""The README's headline figures against the records they name: the results-at-a-glance table, the demo's BLEU and
minutes, the decoding ratios. Each expected value is computed here from the committed records (results/), so a
figure that drifts from its record, or a record that changes under its figure, fails."""

import json
import re
import statistics

import pytest

from nmt.lab.collect import read_cells
from nmt.lab.page import holm_family, load_tables, rate_table, seed_bleu, table_rows
from nmt.lab.stats import seed_p
from tests.conftest import ROOT

RESULTS = ROOT / "results"
README = (ROOT / "README.md").read_text()


def agrees(printed: str, value: float) -> bool:
    """`printed` is `value` rounded to the digits it shows (1,000 and 0.058 alike)."""
    text = printed.replace(",", "")
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9


def glance_row(label: str) -> str:
    """The number cell of the results-at-a-glance row that starts with `label`."""
    rows = [line for line in README.splitlines() if line.startswith(f"| {label}")]
    assert len(rows) == 1, f"no single row '{label}' in the README's results at a glance"
    return rows[0].split(" | ")[1]


def numbers(pattern: str, text: str) -> list[str]:
    found = re.search(pattern, text)
    assert found, f"'{pattern}' not in: {text}"
    return list(found.groups())


def check(printed: list[str], values: list[float], what: str) -> None:
    wrong = [(p, round(v, 4)) for p, v in zip(printed, values, strict=True) if not agrees(p, v)]
    assert not wrong, f"{what}: printed vs record {wrong}"


BLEU_TABLES = ("table1", "table2", "table3", "beyond", "descendants")  # the tables of the paper's recipe, 3 pairs


@pytest.fixture(scope="module")
def declared():
    cells = read_cells(RESULTS / "cells")[0]
    return {name: (table, table_rows(cells, table, rescore=False))
            for name, table in load_tables(RESULTS / "tables.yaml").items()}


@pytest.fixture(scope="module")
def tables(declared):
    return {name: rows for name, (_, rows) in declared.items()}


@pytest.fixture(scope="module")
def adjusted(declared):
    return holm_family(declared)


def summary(rows: dict, name: str) -> list[float]:
    bleu = list(seed_bleu(rows[name]))
    return [statistics.mean(bleu), statistics.stdev(bleu)]


def record(path: str) -> dict:
    return json.loads((RESULTS / path).read_text())


def test_the_demo_figures_are_its_records():
    bf16, fp32 = record("demo/result.json"), record("demo_fp32/result.json")
    cell = glance_row("`make demo`")
    check(numbers(r"sacreBLEU (\S+)", cell), [bf16["bleu"]], "demo row")
    printed = numbers(r"\*\*(\S+)\*\* \(bf16; chrF (\S+), compound-split\s+(\S+);\s+(\S+) min to train and decode,[^)]*\) and (\S+) \(fp32,\s+(\S+)"
                      r" min,", " ".join(README.split()))
    check(printed, [bf16["bleu"], bf16["chrf"], bf16["compound_split_bleu"], bf16["total_minutes"], fp32["bleu"],
                    fp32["total_minutes"]], "the demo's paragraph")
    epyc, avx2 = record("demo_epyc_bf16/result.json"), record("demo_avx2_fp32/result.json")
    assert epyc["host"]["native_bf16"] and "no native bf16" in avx2["device"]  # that EPYC, held to AVX2 for the second
    assert avx2["host"]["model"] == epyc["host"]["model"] and avx2["config"]["train"]["precision"] == "fp32"
    check(numbers(r"an AMD EPYC with AVX512-BF16: (\S+), (\S+) min\) and \S+ \(fp32, \S+ min, an Intel Xeon with AVX-512\) "
                  r"and (\S+) \(fp32, (\S+) min, AVX2 only", " ".join(README.split())),
          [epyc["bleu"], epyc["train_minutes"] + epyc["score_minutes"], avx2["bleu"],
           avx2["train_minutes"] + avx2["score_minutes"]], "the demo's CPU classes")


@pytest.mark.parametrize("label, part, table, row, reference", [  # part: of a cell "En-De figures / En-Fr figures"
    ("Table 1 at tiny scale, En-De", 0, "table1", "en-de.relative", "en-de.absolute"),
    ("Table 1 at tiny scale, En-Fr", 0, "table1", "en-fr.relative", "en-fr.absolute"),
    ("T5 with 30×", 0, "descendants", "en-de.t5_lr30", "en-de.absolute"),
    ("T5 with 30×", 1, "descendants", "en-fr.t5_lr30", "en-fr.absolute"),
])
def test_compared_rows_are_their_seeds_means_and_tests(tables, adjusted, label, part, table, row, reference):
    """The means and SDs the row prints, and the p and Holm-adjusted p of the comparison it cites (its clause is
    written from the results page's tables: nmt/lab/claims.py), are the seeds' own."""
    rows = tables[table]
    cell = glance_row(label)
    printed = numbers(r"(\S+) ± (\S+) vs (\S+) ± (\S+)", cell.split(" / ")[part])
    a, b = list(seed_bleu(rows[row])), list(seed_bleu(rows[reference]))
    check(printed, [*summary(rows, row), *summary(rows, reference)], label)
    raw, holm_p = re.findall(r"p (?:= )?(< 0\.001|[\d.]+\d), adjusted (< 0\.001|[\d.]+\d)", cell)[part]
    for quoted, value in ((raw, seed_p(a, b)), (holm_p, adjusted[(tuple(a), tuple(b))][0])):
        assert value < 0.001 if quoted.startswith("<") else agrees(quoted, value), (label, quoted, value)


@pytest.mark.parametrize("label, table, row, reference", [
    ("Table 3: a^K only vs a^K + a^V", "table3", "key", "key+value"),
    ("one edge table per layer vs per head", "beyond", "en-de.shared", "en-de.relative"),
])
def test_null_results_are_their_seeds_means_and_tests(tables, label, table, row, reference):
    rows = tables[table]
    cell = glance_row(label)
    a, b = list(seed_bleu(rows[row])), list(seed_bleu(rows[reference]))
    clause = r" \(<!-- cmp [^>]*-->[+-][\d.]+ BLEU, p = ([\d.]+)"
    if "±" in cell:
        printed = numbers(r"(\S+) ± (\S+) vs (\S+) ± (\S+)" + clause, cell)
        check(printed, [*summary(rows, row), *summary(rows, reference), seed_p(a, b)], label)
    else:
        printed = numbers(r"(\S+) vs (\S+)" + clause, cell)
        check(printed, [statistics.mean(a), statistics.mean(b), seed_p(a, b)], label)


def test_means_without_a_test_are_their_seeds_means(tables):
    table2, descendants = tables["table2"], tables["descendants"]
    check(numbers(r"(\S+) vs (\S+)", glance_row("Table 2: k = 0 vs k = 16")),
          [statistics.mean(seed_bleu(table2["k0"])), statistics.mean(seed_bleu(table2["k16"]))], "Table 2")
    check(numbers(r"(\S+) ± (\S+) / (\S+) ± (\S+)", glance_row("RoPE / sinusoids + edge tables")),
          [*summary(descendants, "en-de.rope"), *summary(descendants, "en-de.both")], "RoPE / both")
    printed = numbers(r"(\S+) ± (\S+) vs (\S+) ± (\S+) / (\S+) ± (\S+) vs (\S+) ± (\S+): no difference found \(<!-- cmp "
                      r"[^>]*-->[+-][\d.]+ BLEU, p = ([\d.]+),[^;]*; [+-][\d.]+ BLEU, p = ([\d.]+)",
                      glance_row("Shaw's vectors by T5's log-spaced buckets"))
    printed = [*printed[:4], printed[8], *printed[4:8], printed[9]]  # per pair: the means, then the cited p
    values = []
    for pair in ("en-de", "en-fr"):
        a, b = seed_bleu(descendants[f"{pair}.buckets"]), seed_bleu(descendants[f"{pair}.relative"])
        values += [*summary(descendants, f"{pair}.buckets"), *summary(descendants, f"{pair}.relative"),
                   seed_p(list(a), list(b))]
    check(printed, values, "edge buckets")


def mean_accuracy(folder: str, mode_file: str, length: int) -> float:
    runs = sorted((RESULTS / folder).glob(f"{mode_file}_seed*.json"))
    assert runs, (folder, mode_file)
    return statistics.mean(json.loads(path.read_text())["accuracy"][str(length)] for path in runs)


def test_the_long_dependency_figures_are_the_repeat_task_records():
    cell = glance_row("dependencies up to 8× longer")
    for name, mode_file in (("relative k = 8", "relative8"), ("k = 2", "relative2"), ("k = 16", "relative16"),
                            ("Shaw's vectors on T5's buckets", "buckets128")):
        printed = numbers(re.escape(name) + r" (\S+) → ([\d.]+)", cell)
        check(printed, [mean_accuracy("extrapolate_repeat", mode_file, n) for n in (40, 320)], name)
    check(numbers(r"ALiBi (\S+) even at 40", cell), [mean_accuracy("extrapolate_repeat", "alibi", 40)], "ALiBi")
    check(numbers(r"1 seed\) k = 2 (\S+) → ([\d.]+)", cell),
          [mean_accuracy("extrapolate_repeat_4000", "relative2", n) for n in (40, 320)], "4,000 updates")


def test_the_speed_and_export_figures_are_their_records():
    layer = {row["n"]: row for row in record("bench_attention.json")["layer"]}
    other = {row["n"]: row for row in record("bench_attention_remeasured.json")["layer"]}
    check(numbers(r"(\S+)× \(another 2-core machine: (\S+)×\)", glance_row("one relative attention layer over SDPA")),
          [layer[192]["ours_over_sdpa"], other[192]["ours_over_sdpa"]], "attention layer")
    cost = record("decode_cost.json")
    relative, absolute = cost["relative"], cost["absolute"]
    check(numbers(r"(\S+)× / (\S+)×", glance_row("decoding time, relative over absolute")),
          [absolute["greedy_sentences_per_s"] / relative["greedy_sentences_per_s"],
           absolute["beam4_sentences_per_s"] / relative["beam4_sentences_per_s"]], "decoding ratios")
    agreement = record("deploy/deploy.json")["agreement"]["beam4_alpha0"]
    check(numbers(r"(\S+) of (\S+) lines identical", glance_row("CTranslate2 float32 vs relnmt")),
          [agreement["identical"], agreement["of"]], "export")


def test_the_decoding_speed_against_ctranslate2_is_its_record():
    ratio = record("decode_ratio.json")
    check(numbers(r"(\S+)× / (\S+)× / (\S+)×", glance_row("decoding speed, relnmt over CTranslate2")),
          [ratio[f"{search} 1t"]["relnmt_over_ctranslate2"] for search in ("beam4", "beam4_finished", "greedy")],
          "decoding speed")


def test_the_minutes_of_a_table_run_are_its_records(tables):
    cells = {result["folder"]: result for table in BLEU_TABLES for seeds in tables[table].values()
             for result in seeds.values()}  # a cell that two tables hold counts once
    minutes = sorted(run["train_minutes"] for run in cells.values())
    text = " ".join((RESULTS / "README.md").read_text().split())
    printed = numbers(r"The (\d+) cells of these tables \(a cell that several tables hold counted once.*? trained in "
                      r"(\S+)–(\S+) minutes, median (\S+) ", text)
    check(printed, [len(minutes), minutes[0], minutes[-1], statistics.median(minutes)], "minutes of a table run")


def test_the_demo_precisions_agree_on_the_lines_the_records_say():
    bf16 = (RESULTS / "demo" / "test.hyp.de").read_text().splitlines()
    fp32 = (RESULTS / "demo_fp32" / "test.hyp.de").read_text().splitlines()
    text = " ".join((RESULTS / "README.md").read_text().split())
    check(numbers(r"bf16 and fp32 on Intel Xeons \(the fp32 run's is not recorded: the table\) gave \S+ and \S+ with (\S+) of (\S+) lines equal", text),
          [sum(a == b for a, b in zip(bf16, fp32, strict=True)), len(bf16)], "demo lines equal")


def test_the_install_and_test_minutes_are_the_suite_record():
    steps = {step["command"]: step for step in record("suite.json")["steps"]}
    text = " ".join(README.split())
    check(numbers(r"make test # .*?\((\S+) minutes on 2 cores", text), [steps["make test"]["seconds"] / 60], "make test")
    check(numbers(r"`\.venv/` \((\S+) minutes on a fresh clone", text), [steps["make install"]["seconds"] / 60],
          "make install")


def test_the_learning_rate_check_is_its_records(tables):
    block = re.search(r"<!-- results:lr_check -->\n(.*?)\n<!-- /results:lr_check -->",
                      (RESULTS / "README.md").read_text(), re.DOTALL)
    assert block and block.group(1) == rate_table(tables["lr_check"], tables["descendants"]), \
        "rerun relnmt-table results/README.md --blocks lr_check"


def test_the_learning_rate_check_picks_by_validation_bleu_and_measures_seed_spread(tmp_path):
    def run(folder, bleu, nll):
        folder.mkdir(parents=True)
        (folder / "train.log").write_text(f"x INFO nmt.train: valid update 600: loss 3 nll {nll + 1} ppl 9\n"
                                          f"x INFO nmt.train: valid update 600: loss 3 nll {nll} ppl 8\n")
        return {"bleu": bleu, "folder": folder}

    def rows(shared: list[float]) -> dict:
        rates = {f"en-de.mode.{rate}": {1: run(tmp_path / str(shared) / rate, bleu, 2.0)}
                 for rate, bleu in {"lr0.5": 31.5, "lr2": 20.0, "other": 29.0}.items()}
        rates["en-de.mode.lr1"] = {seed: run(tmp_path / str(shared) / f"lr1.{seed}", bleu, 2.0)
                                   for seed, bleu in enumerate(shared, 1)}
        return rates
    control = {"en-de.mode": {seed: run(tmp_path / f"seed{seed}", 0.0, nll) for seed, nll in enumerate((2.1, 2.2, 2.4), 1)}}
    nll_sd = f"{statistics.stdev([2.1, 2.2, 2.4]):.3f} (3 seeds)"
    # one seed at the shared rate: the best by the means, its lead unweighed
    row = rate_table(rows([30.0]), control).splitlines()[-1]
    assert row == (f"| mode | 31.50 / 30.00 / 20.00 | 2.000 / 2.000 / 2.000 | other: 29.00 (NLL 2.000) | – | ×0.5, 1.50 "
                   f"above ×1 (seed spread not measured: its repeated seeds give fewer than 2 degrees of freedom) | 2.100 | {nll_sd} |")
    # three seeds at x1, sd 1: a lead of 1.50 over their mean of 30 is within t(0.975, 2) * 1 * sqrt(1 + 1/3) = 4.97
    row = rate_table(rows([29.0, 30.0, 31.0]), control).splitlines()[-1]
    assert "| 1.00 (3 seeds) | ×0.5, 1.50 above ×1: within seed noise (±4.97) |" in row
    # a tight spread (sd 0.1): the same lead is beyond it
    row = rate_table(rows([29.9, 30.0, 30.1]), control).splitlines()[-1]
    assert "| 0.10 (3 seeds) | ×0.5, 1.50 above ×1: beyond seed noise (±0.50) |" in row
    # two seeds at each of two rates pool to the same degrees of freedom as three at one
    rates = rows([29.9, 30.1])
    rates["en-de.mode.lr0.5"][2] = run(tmp_path / "lr0.5.2", 31.5, 2.0)
    rates["en-de.mode.lr0.5"][1]["bleu"] = 31.6
    rates["en-de.mode.lr0.5"][2]["bleu"] = 31.4
    row = rate_table(rates, control).splitlines()[-1]
    bound = 4.303 * 0.02 ** 0.5 * 1.0  # t(0.975, 2) * pooled sd (0.1414) * sqrt(1/2 + 1/2)
    assert f"×0.5 (2 seeds)" not in row and f"31.50 (2 seeds) / 30.00 (2 seeds)" in row
    assert f"×0.5, 1.50 above ×1: beyond seed noise (±{bound:.2f})" in row


def test_the_learning_rate_checks_gaps_in_prose_are_its_table_means():
    """"half the rate loses A (mode) to B (mode) ... and twice it C (mode) to D (mode)": the smallest and largest
    gap of the table's means, ×1 less ×0.5 and ×1 less ×2, and the modes that have them."""
    text = (RESULTS / "README.md").read_text()
    block = re.search(r"<!-- results:lr_check -->\n(.*?)\n<!-- /results:lr_check -->", text, re.DOTALL).group(1)
    means = {row[0]: [float(row[i]) for i in (1, 2, 3)] for row in
             re.findall(r"^\| (\w+) \| ([\d.]+) / ([\d.]+)(?: \(\d+ seeds\))? / ([\d.]+) \|", block, re.MULTILINE)}
    assert len(means) >= 9
    printed = re.search(r"half the rate loses (\S+) \((\w+)\) to (\S+) \((\w+)\) validation BLEU and twice it (\S+) "
                        r"\((\w+)\) to (\S+) \((\w+)\)", " ".join(text.split()))
    assert printed, "the learning-rate check's gaps"
    for start, column in ((1, 0), (5, 2)):
        gaps = {mode: round(m[1] - m[column], 2) for mode, m in means.items()}
        low, high = min(gaps, key=gaps.get), max(gaps, key=gaps.get)
        assert [float(printed.group(start)), printed.group(start + 1).lower(), float(printed.group(start + 2)),
                printed.group(start + 3).lower()] == [gaps[low], low, gaps[high], high]


def test_the_fine_tuning_examples_figures_are_its_records(tmp_path):
    """docs/configuration.md's worked example: the slice's sizes, BLEU before and after, the update and minutes, the
    paired bootstrap's p (sacreBLEU's own, on the committed hypotheses) and the rates tried on validation."""
    import subprocess
    import sys

    from experiments.domain_slice import mentions, read

    folder = RESULTS / "finetune_dogs"
    text = " ".join((ROOT / "docs" / "configuration.md").read_text().split())
    sizes = [sum(bool(mentions("dog").search(line)) for line in read(split, "en")) for split in ("train", "valid", "test")]
    check(numbers(r"a dog \((\S+) training, (\S+) validation, (\S+) test pairs;", text), sizes, "slice sizes")
    before, after = json.loads((folder / "before" / "score.json").read_text()), record("finetune_dogs/tuned/result.json")
    assert after["split"] == "test" and after["checkpoint"] == "checkpoint_best.pt"
    check(numbers(r"before, sacreBLEU (\S+) on the (\S+) test sentences; after, (\S+) \(`checkpoint_best.pt`, update "
                  r"(\S+); (\S+) minutes of training", text),
          [before["bleu"], after["sentences"], after["bleu"], after["updates"], after["train_minutes"]], "before, after")
    ref = tmp_path / "test.de"  # the slice's own test side, cut again (prepared/ is not committed)
    ref.write_text("".join(de + "\n" for en, de in zip(read("test", "en"), read("test", "de"))
                           if mentions("dog").search(en)))
    done = subprocess.run([sys.executable, "-m", "sacrebleu", str(ref), "-i", str(folder / "before" / "test.hyp.de"),
                           str(folder / "tuned" / "test.hyp.de"), "--paired-bs", "-m", "bleu"],
                          capture_output=True, text=True, timeout=300, check=True)
    p = json.loads(done.stdout)[1]["BLEU"]["p_value"]
    check(numbers(r"paired bootstrap p = (\S+),", text), [p], "paired bootstrap")
    valid = [record(f"finetune_dogs/choice/lr{rate}.json")["bleu"] for rate in ("0.03", "0.1", "0.3")]
    check(numbers(r"0.03, 0.1 and 0.3 gave (\S+), (\S+) and (\S+) BLEU on the slice's (\S+) validation sentences, the "
                  r"demo's model (\S+)\)", text),
          [*valid, sizes[1], json.loads((folder / "before" / "valid_score.json").read_text())["bleu"]], "rates")


def test_the_translate_pool_figures_are_their_record():
    seconds = record("translate_pools.json")["seconds_median"]
    alone, busy = seconds["beside 0 busy processes"], seconds["beside 2 busy processes"]
    text = " ".join((ROOT / "docs" / "benchmarks.md").read_text().split())
    check(numbers(r"Alone: (\S+) s \(GNU's default\), (\S+) s \(relnmt's\), (\S+) s \(no spin,", text),
          list(alone.values()), "alone")
    check(numbers(r"a core busy: (\S+) s, (\S+) s and (\S+) s, so relnmt's spin is (\S+)× faster", text),
          [*busy.values(), busy["GNU default (GOMP_SPINCOUNT=300000)"] / busy["relnmt's (GOMP_SPINCOUNT=10000)"]],
          "beside busy processes")
