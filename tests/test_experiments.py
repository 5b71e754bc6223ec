"""A scored run (the one lifecycle, nmt/lab/run.py), the one collector (nmt/lab/collect.py) and the page's tables (nmt/lab/page.py)."""

import gzip
import json

import pytest
import yaml

from nmt.lab.collect import check_scores, declared_row, declared_rows, read_cells, row_of
from nmt.compose import register_schemas
from nmt.data.readers import DataError
from nmt.experiment import scored_run_overrides
from nmt.lab.run import composed_run
from nmt.train import run
from nmt.lab.page import page_blocks, replace_block
from tests.conftest import MULTI30K, ROOT, data_overrides, fake_cell, model_overrides, multi30k


def local_overrides(prepared):
    return [*data_overrides(prepared), *model_overrides(), "train.max_steps=4", "train.max_tokens=600",
            "train.save_every_steps=2",
            "train.average_last=2", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1"]


def test_a_scored_run_records_what_it_ran(prepared, tmp_path):
    overrides = [*local_overrides(prepared), "model.clip=3", "model.rel_value=false", "train.seed=7"]
    result = composed_run(scored_run_overrides(tmp_path / "run", "test", None, overrides), run, "a test")
    assert result["pair"] == "en-de" and result["seed"] == 7 and result["updates"] == 4
    assert result["model"] == {"position": "relative", "clip": 3, "rel_key": True, "rel_value": False,
                               "share_heads": False, "edge_buckets": 0}
    assert result["averaged_from"] == ["checkpoint_0000002.pt", "checkpoint_0000004.pt"]
    hyps = (tmp_path / "run" / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1]
    assert len(hyps) == result["sentences"] == 15
    assert result["signature"].startswith("nrefs:1|case:mixed") and 0.0 <= result["bleu"] <= 100.0
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "clip: 3" in config and "rel_value: false" in config  # config.yaml holds the values really used


def test_the_collector_groups_cells_into_rows_and_tests_them_against_the_full_model(tmp_path):
    register_schemas()
    with gzip.open(MULTI30K / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    broken = [" ".join(line.split()[::-1]) for line in refs]  # word order scrambled: far worse BLEU
    cells = tmp_path / "cells"
    for row, hyps_by_seed in (("k16", (refs, refs[:500] + broken[500:])), ("neither", (broken, broken))):
        for seed, hyps in enumerate(hyps_by_seed, 1):
            fake_cell(cells, hyps, refs, seed, f"+ablation={row}")
    (cells / "a-cell-still-training").mkdir()
    declared = {"table3": {"study": "table3", "rows": {"key+value": ["+ablation=relative"],
                                                       "neither": ["model.rel_key=false", "model.rel_value=false"]},
                           "against": {"neither": ["key+value"]}, "paper": {"neither": 12.5}}}
    (tmp_path / "tables.yaml").write_text(yaml.safe_dump(declared))
    blocks, unscored = page_blocks(cells, tmp_path / "tables.yaml", samples=200)
    assert unscored == [cells / "a-cell-still-training"]
    table = blocks["table3"]  # the rows' other spellings (k16, +ablation=neither) are the same cells
    full = [json.loads(p.read_text())["bleu"] for p in sorted(cells.glob("*model.rel*/result.json"))]
    assert "| key+value | 2 | " in table and "| neither | 2 | " in table
    assert f"| neither | 2 | {sum(full) / 2:.2f} ± " in table
    p_value = float(table.splitlines()[-1].split("|")[-2])
    assert p_value < 0.05 and "| 12.5 | key+value |" in table
    page = tmp_path / "README.md"
    page.write_text("before\n<!-- results:table3 -->\nold\n<!-- /results:table3 -->\nafter\n")
    page.write_text(replace_block(page.read_text(), "table3", table))
    assert "old" not in page.read_text() and table in page.read_text() and "after" in page.read_text()


def test_relnmt_table_on_a_sweep_gives_the_pages_verdicts_and_names_what_it_leaves_out(tmp_path, capsys, caplog):
    """The sweep's table is the page's (nmt/lab/page.py): Welch over seeds, Holm over the table, the verdict word
    and the detectable difference; a cut record is named and the other cells tabled; a row scored on another split
    is shown but never compared."""
    from nmt.table import main

    register_schemas()
    refs, valid = multi30k("test_2016_flickr"), multi30k("val")
    broken = [" ".join(line.split()[::-1]) for line in refs]  # word order scrambled: far worse BLEU
    cells = tmp_path / "cells"
    for seed in (1, 2, 3):  # k16 near the references, neither far from them: "lower", whatever the seed
        fake_cell(cells, refs[:900 + 20 * seed] + broken[900 + 20 * seed:], refs, seed, "+ablation=k16")
        fake_cell(cells, refs[:100 + 20 * seed] + broken[100 + 20 * seed:], refs, seed, "+ablation=neither")
        fake_cell(cells, valid, valid, seed, "+ablation=key", "train.score_split=valid")
    cut = fake_cell(cells, refs, refs, 4, "+ablation=neither")
    cut_path = next(p for p in cells.glob("*/result.json") if json.loads(p.read_text())["seed"] == 4)
    cut_path.write_text(json.dumps(cut)[:200])
    main([str(cells), "--baseline", "ablation=k16", "--samples", "100"])
    out, err = capsys.readouterr()
    row = next(line for line in out.splitlines() if line.startswith("| ablation=neither |"))
    assert "| 3 |" in row and "| lower |" in row and "| k16 |" not in row  # 3 seeds: the cut 4th left out
    assert "detectable" not in row and "p (Holm" in out
    assert "verdict (Holm, family-wise 0.05)" in out
    key = next(line for line in out.splitlines() if line.startswith("| ablation=key"))
    assert "lower" not in key and "higher" not in key and "no difference" not in key  # valid: never compared
    assert "not compared with ablation=k16" in err and "ablation=key" in err
    assert f"{cut_path}: not a record" in caplog.text


def test_the_collector_refuses_a_record_its_hypotheses_do_not_give(tmp_path):
    register_schemas()
    with gzip.open(MULTI30K / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        refs = [line.strip() for line in f]
    hyps = refs[:900] + [""] * 100
    honest = fake_cell(tmp_path, hyps, refs, 1, "+ablation=key")
    rows = read_cells(tmp_path)[0]
    study = {"key": ["+ablation=key"]}
    assert declared_rows(rows, "table3", study)["key"][1]["bleu"] == honest["bleu"]
    path = next(tmp_path.glob("*/result.json"))
    path.write_text(json.dumps({**honest, "chrf": honest["chrf"] + 0.5}))
    with pytest.raises(DataError, match=r"result.json: records chrf = .*test.hyp.de scores"):
        declared_rows(read_cells(tmp_path)[0], "table3", study)


@pytest.mark.slow
def test_every_committed_cell_rescores_from_its_hypotheses():
    """results/cells is the record of every table in the README: each BLEU there must come back from its
    hypotheses, and every cell belongs to a row the page declares."""
    rows, unscored = read_cells(ROOT / "results" / "cells")
    assert not unscored and sum(len(cells) for cells in rows.values()) >= 121
    tables = yaml.safe_load((ROOT / "results" / "tables.yaml").read_text())
    declared = {declared_row(t["study"], tuple(o)) for t in tables.values() for o in t["rows"].values()}
    assert set(rows) <= declared, set(rows) - declared
    for cells in rows.values():
        for result in cells:
            result["hyps"] = (result["folder"] / result["hyp"]).read_text(encoding="utf-8").split("\n")[:-1]
            check_scores(result, ("bleu",))


def test_a_field_added_to_the_schema_later_does_not_move_a_record_to_another_row(tmp_path):
    register_schemas()
    result = fake_cell(tmp_path, ["x"], ["x"], 1, "+ablation=key")
    old = {**result, "config": {**result["config"], "train": {k: v for k, v in result["config"]["train"].items()
                                                            if k != "loss_chunk_tokens"}}}
    assert row_of(old) == row_of(result)
    assert row_of({**result, "config": {**result["config"], "model": {**result["config"]["model"], "clip": 3}}}) \
        != row_of(result)


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
