"""The experiment pipeline (nmt.experiment), the sweep runner and the results tables."""

import argparse
import gzip
import json
import os
import subprocess
import sys

import pytest

from experiments import results_table, sweep
from nmt.experiment import run_identity, same_config, train_and_score
from nmt.score import score
from tests.conftest import MULTI30K, ROOT, data_overrides, model_overrides


def local_overrides(prepared):
    return [*data_overrides(prepared), *model_overrides(), "train.max_steps=4", "train.max_tokens=600",
            "train.save_every_steps=2",
            "train.average_last=2", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1"]


def test_train_and_score_records_what_it_ran(prepared, tmp_path):
    result = train_and_score([*local_overrides(prepared), "model.clip=3", "model.rel_value=false",
                              "train.seed=7"], tmp_path / "run", split="test")
    assert result["pair"] == "en-de" and result["seed"] == 7 and result["updates"] == 4
    assert result["model"] == {"position": "relative", "clip": 3, "rel_key": True, "rel_value": False,
                               "share_heads": False, "edge_buckets": 0}
    assert result["averaged_from"] == ["checkpoint_0000002.pt", "checkpoint_0000004.pt"]
    hyps = (tmp_path / "run" / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == result["sentences"] == 15
    assert result["signature"].startswith("nrefs:1|case:mixed") and 0.0 <= result["bleu"] <= 100.0
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "clip: 3" in config and "rel_value: false" in config  # config.yaml holds the values really used


def test_sweep_skips_finished_runs_and_reuses_identical_ones(tmp_path):
    results = tmp_path / "results"
    overrides = sweep.run_overrides("table1", "en-de", [], 1, "cpu")
    done = results / "table1" / "en-de.relative" / "seed1"
    done.mkdir(parents=True)
    (done / "result.json").write_text(json.dumps({"identity": run_identity(overrides), "bleu": 30.0, "seed": 1}))
    (done / "test.hyp.de").write_text("x\n")
    command = [sys.executable, "-m", "experiments.sweep", "--results", str(results), "--dry-run", "--seeds=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([*command, "table2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "table2/k16/seed1: the same run as" in out.stdout  # k=16 is Table 1's relative En-De run
    assert "table2/k0/seed1: would run" in out.stdout and "model.clip=0" in out.stdout
    assert not (results / "table2").exists()  # a dry run writes nothing
    args = argparse.Namespace(results=results, dry_run=False, device="cpu")
    assert "copied" in sweep.one_run("table2", "k16", "en-de", ["model.clip=16"], 1, args)
    copied = json.loads((results / "table2" / "k16" / "seed1" / "result.json").read_text())
    assert copied["bleu"] == 30.0 and copied["same_run_as"].endswith("table1/en-de.relative/seed1")
    assert (results / "table2" / "k16" / "seed1" / "test.hyp.de").read_text() == "x\n"
    again = subprocess.run([*command, "table1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert "table1/en-de.relative/seed1: done already" in again.stdout
    assert "table1/en-de.absolute/seed1: would run" in again.stdout
    subset = subprocess.run([*command, "table3", "--rows", "value", "neither"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert [line.split(":")[0] for line in subset.stdout.splitlines()] == ["table3/value/seed1", "table3/neither/seed1"]
    wrong = subprocess.run([*command, "table3", "--rows", "k16"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert wrong.returncode == 2 and "table3 has no row k16" in wrong.stderr


def test_results_table_means_seeds_and_tests_rows_against_the_full_model(tmp_path):
    with gzip.open(MULTI30K / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    broken = [" ".join(line.split()[::-1]) for line in refs]  # word order scrambled: far worse BLEU
    for row, hyps_by_seed in (("key+value", (refs, refs[:500] + broken[500:])), ("neither", (broken, broken))):
        for seed, hyps in enumerate(hyps_by_seed, 1):
            folder = tmp_path / "table3" / row / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "test.hyp.de").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
            result = {"pair": "en-de", "seed": seed, "hyp": "test.hyp.de", **score(hyps, refs, "de")}
            (folder / "result.json").write_text(json.dumps(result))
    rows = results_table.load_runs(tmp_path, "table3")
    assert list(rows) == ["key+value", "neither"]
    table = results_table.bleu_table("table3", rows, samples=200, adjusted=results_table.holm_family({"table3": rows}))
    full = [r["bleu"] for r in rows["key+value"].values()]
    assert f"| key+value | 2 | {sum(full) / 2:.2f} ± " in table
    p_value = float(table.splitlines()[-1].split("|")[-2])
    assert p_value < 0.05 and "| 12.5 | key+value |" in table
    readme = tmp_path / "README.md"
    readme.write_text("before\n<!-- results:table3 -->\nold\n<!-- /results:table3 -->\nafter\n")
    readme.write_text(results_table.replace_block(readme.read_text(), "table3", table))
    assert "old" not in readme.read_text() and table in readme.read_text() and "after" in readme.read_text()


def test_results_table_refuses_a_record_its_hypotheses_do_not_give(tmp_path):
    with gzip.open(MULTI30K / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    folder = tmp_path / "table1" / "en-de.relative" / "seed1"
    folder.mkdir(parents=True)
    hyps = refs[:900] + [""] * 100
    (folder / "test.hyp.de").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    honest = {"pair": "en-de", "seed": 1, "hyp": "test.hyp.de", **score(hyps, refs, "de")}
    (folder / "result.json").write_text(json.dumps(honest))
    assert results_table.load_runs(tmp_path, "table1")["en-de.relative"][1]["bleu"] == honest["bleu"]
    (folder / "result.json").write_text(json.dumps({**honest, "chrf": honest["chrf"] + 0.5}))
    with pytest.raises(SystemExit, match=r"seed1/result.json: records chrf = .*test.hyp.de scores"):
        results_table.load_runs(tmp_path, "table1")


def test_rescore_rewrites_a_french_record_without_the_compound_split(tmp_path):
    """French targets: tokenized BLEU without get_ende_bleu.sh's split; --rescore rewrites an old record so, keeping
    the value it replaced and the command, and the record then passes the tables' check."""
    from nmt.score import compound_split_bleu

    refs = results_table.test_lines("fr")
    folder = tmp_path / "table1" / "en-fr.relative" / "seed1"
    folder.mkdir(parents=True)
    hyps = refs[:700] + [line.replace("-", " ") for line in refs[700:]]
    (folder / "test.hyp.fr").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    result = {"pair": "en-fr", "seed": 1, "hyp": "test.hyp.fr", **score(hyps, refs, "fr")}
    assert "compound_split_bleu" not in result
    old = {**{k: v for k, v in result.items() if k != "tokenized_bleu"},
           "compound_split_bleu": compound_split_bleu(hyps, refs, "fr")}
    assert abs(old["compound_split_bleu"] - result["tokenized_bleu"]) > 0.1  # the split changes the French score
    (folder / "result.json").write_text(json.dumps(old))
    with pytest.raises(SystemExit, match="records tokenized_bleu = nothing"):
        results_table.load_runs(tmp_path, "table1")
    assert results_table.rescore(folder / "result.json", "the command")
    rescored = json.loads((folder / "result.json").read_text())
    assert rescored["tokenized_bleu"] == pytest.approx(result["tokenized_bleu"])
    assert "compound_split_bleu" not in rescored
    assert rescored["rescored"] == [{"replaced": {"compound_split_bleu": old["compound_split_bleu"]},
                                     "tokenized_bleu": rescored["tokenized_bleu"], "command": "the command"}]
    results_table.load_runs(tmp_path, "table1")  # passes the check now
    assert not results_table.rescore(folder / "result.json", "the command")  # nothing left to change


@pytest.mark.slow
def test_every_committed_run_rescores_from_its_hypotheses():
    """results/ is the record of every table in the README: each BLEU there must come back from its hypotheses."""
    runs = sorted((ROOT / "results").glob("*/*/seed*/result.json"))
    tables = {path.parent.parent.parent.name for path in runs}
    assert {"table1", "table2", "table3", "beyond", "descendants", "length"} <= tables
    for table in sorted(tables):
        results_table.load_runs(ROOT / "results", table, rescore=("bleu",))


def test_a_field_added_to_the_schema_later_does_not_hide_a_same_run():
    old = {"model": {"clip": 16}, "train": {"seed": 1}}
    new = {"model": {"clip": 16}, "train": {"seed": 1, "compile": None}}
    assert same_config(old, new) and same_config(new, old)
    assert not same_config(old, {"model": {"clip": 2}, "train": {"seed": 1, "compile": None}})
    assert not same_config(old, {"model": {"clip": 16}, "train": {"seed": 1, "compile": True}})


def test_attention_preference_by_distance_reads_each_modes_real_weights(prepared, tmp_path):
    """--by-mode's ratio (observed over evenly spread mass): about 1 at every distance for a model with no position
    at all, falling with |j - i| under ALiBi's bias even before training, in encoder and decoder alike."""
    from experiments.plot_attention_distance import by_mode_lines, preference_by_distance
    from nmt.config import OptimConfig, TrainConfig, TrainJob
    from nmt.modes import Position
    from nmt.train import run
    from tests.conftest import micro_config, multi30k_lines

    sources, targets = multi30k_lines("test_2016_flickr", "en", 60), multi30k_lines("test_2016_flickr", "de", 60)
    results = {}
    for position in (Position.none, Position.alibi):
        out = tmp_path / position.value
        run(TrainJob(model=micro_config(position=position, dropout=0.0, heads=4), data=prepared,
                     optim=OptimConfig(warmup=2), train=TrainConfig(max_steps=2, max_tokens=600, save_every_steps=2,
                                                                   valid_every=0, threads=1, output_dir=str(out),
                                                                   average_last=1)))
        results[position] = preference_by_distance(out / "averaged.pt", sources, targets, 8)
    d = results[Position.none]["distances"]
    for side in ("encoder", "decoder"):
        flat = results[Position.none]["ratio"][side][0]
        assert all(0.8 < flat[d.index(x)] < 1.25 for x in (-8, -4, -1))
        falling = results[Position.alibi]["ratio"][side][0]
        assert falling[d.index(-1)] > 1.2 and falling[d.index(-1)] > falling[d.index(-4)] > falling[d.index(-8)], falling
    later = results[Position.none]["ratio"]["decoder"][0][d.index(1)]
    assert later != later  # NaN: no decoder query sees a later key
    assert results[Position.alibi]["mode"] == "alibi" and len(by_mode_lines(list(results.values()))) == 2 + 2 * 2
