"""A study is a Hydra sweep of the one cell path (configs/study/), run N cells at a time by an existing launcher
(Hydra's joblib launcher here, SLURM's on a cluster) and collected by the one collector (relnmt-table)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from nmt.checkpoints.checkpoint import LAST, load_checkpoint
from nmt.compose import register_schemas
from nmt.lab.page import page_blocks
from nmt.compose import composed
from tests.conftest import INTERACTIVE, ROOT, data_overrides, model_overrides, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
SMALL = ["train.max_tokens=300", "train.tokens_per_update=300", "train.valid_every=0", "train.valid_bleu_sentences=0",
         "train.log_every=1", "train.save_every_steps=2", "train.keep_last=2", "train.average_last=1",
         "train.device=cpu", "train.score_lines=5", "train.precision=fp32"]


def study(prepared, sweep_dir, *extra) -> list[str]:
    """Table 1's study shrunk: its sweep (rows, seeds) as the study declares it, on the test corpus and model."""
    return [sys.executable, "-m", "nmt.train", "-m", "+study=table1", f"hydra.sweep.dir={sweep_dir}",
            *data_overrides(prepared), *model_overrides(), *SMALL, *extra]


def test_every_study_composes_for_this_machine_and_for_slurm():
    register_schemas()
    for path in sorted((ROOT / "configs" / "study").glob("*.yaml")):
        for launcher in ([], ["hydra/launcher=slurm"]):
            cfg = composed([f"+study={path.stem}", *launcher], with_hydra=True)
            params = cfg.hydra.sweeper.params
            assert "train.seed" in params and cfg.hydra.sweep.dir == "multirun/studies", path.name
            target = cfg.hydra.launcher._target_
            assert target.endswith("SlurmLauncher" if launcher else "JoblibLauncher"), (path.name, target)


@pytest.mark.slow
def test_a_study_trains_scores_collects_and_runs_again_for_nothing(prepared, tmp_path):
    """2 rows x 3 seeds, 2 cells at a time: every cell trained and scored, the table tested with Holm; the study run
    again trains nothing; a cell killed mid-run continues, on the re-run, to the very model an unkilled run gives."""
    sweep = tmp_path / "cells"
    rows = ["+ablation=absolute,relative", "train.seed=1,2,3", "train.max_steps=4"]
    done = subprocess.run(study(prepared, sweep, *rows), cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = sorted(sweep.glob("*/result.json"))
    assert len(results) == 6 and all(json.loads(p.read_text())["updates"] == 4 for p in results)
    tables = tmp_path / "tables.yaml"
    label = "local_en_de"  # the rows as the page declares them: the overrides that sweep them, less the seed
    shared = [*data_overrides(prepared), *model_overrides(), *SMALL, "train.max_steps=4"]
    tables.write_text(yaml.safe_dump({"toy": {
        "study": "table1",
        "rows": {f"{label}.absolute": ["+ablation=absolute", *shared], f"{label}.relative": ["+ablation=relative", *shared]},
        "against": {f"{label}.relative": [f"{label}.absolute"]}}}))
    blocks, unscored = page_blocks(sweep, tables, samples=50)
    assert not unscored and f"| {label}.absolute | 3 |" in blocks["toy"] and f"| {label}.relative | 3 |" in blocks["toy"]
    relative_row = blocks["toy"].splitlines()[-1].split(" | ")
    assert relative_row[6] == f"{label}.absolute" and float(relative_row[8]) >= float(relative_row[7])  # Holm's p

    stamps = {p: p.stat().st_mtime_ns for p in results}
    again = subprocess.run(study(prepared, sweep, *rows), cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and again.stderr.count("done (4 updates") == 6, again.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in results} == stamps and "training" not in again.stderr.lower().split(
        "done (")[0][-200:]

    longer = ["+ablation=relative", "train.seed=1", "train.max_steps=10"]
    killed = subprocess.Popen(study(prepared, tmp_path / "killed", *longer), cwd=ROOT, env=ENV,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    wait_for(lambda: any((tmp_path / "killed").glob("*/checkpoint_0000004.pt")), seconds=300)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    assert not any((tmp_path / "killed").glob("*/result.json"))
    for folder in ("killed", "unkilled"):
        run = subprocess.run(study(prepared, tmp_path / folder, *longer), cwd=ROOT, env=ENV, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
    (resumed,), (reference,) = ((tmp_path / f).glob("*/result.json") for f in ("killed", "unkilled"))
    assert resumed.parent.name == reference.parent.name
    weights = [torch.load(p.parent / LAST, map_location="cpu", weights_only=False)["model"] for p in (resumed, reference)]
    assert all(torch.equal(weights[0][name], weights[1][name]) for name in weights[1])
    assert (resumed.parent / "test.hyp.de").read_text() == (reference.parent / "test.hyp.de").read_text()


@pytest.mark.slow
def test_a_cell_that_fails_costs_only_itself_and_is_named(prepared, tmp_path):
    """Under the joblib launcher a cell's refusal (exit 2 in its worker) must not end the pool: the other cell is
    trained and scored, and the sweep ends (exit 1) with one line naming the failed cell's folder."""
    done = subprocess.run(study(prepared, tmp_path / "cells", "+ablation=relative", "train.seed=1", "train.max_steps=2",
                                f"train.init_from=null,{tmp_path / 'missing.pt'}"),
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    (scored,) = (tmp_path / "cells").glob("*/result.json")
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("1 of 2 cells failed: ") and str(scored.parent) not in last and "Traceback" not in done.stderr
    assert "missing.pt: checkpoint not found" in done.stderr  # the cell's own line


def updated(sweep: Path, update: int) -> int:
    """How many cells of the sweep have logged this update."""
    return sum(f"train update {update}:" in log.read_text() for log in sweep.glob("*/train.log"))


@pytest.mark.slow
def test_a_study_whose_launcher_alone_is_killed_leaves_no_cell_training_and_continues(prepared, tmp_path):
    """The joblib launcher SIGKILLed alone (the OOM killer, a lost login shell; not its process group) while its
    two cells train: each cell stops after its update with a checkpoint instead of training on for nobody, and the
    same command run at once waits for those checkpoints and continues both cells to their scores."""
    command = study(prepared, tmp_path, "+ablation=absolute,relative", "train.seed=1", "train.max_steps=60",
                    "hydra.launcher.n_jobs=2")
    launcher = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    wait_for(lambda: updated(tmp_path, 4) == 2, seconds=300)
    os.kill(launcher.pid, signal.SIGKILL)
    launcher.wait()
    cells = sorted(p for p in tmp_path.iterdir() if p.is_dir())

    def training() -> list[str]:
        found = subprocess.run(["pgrep", "-f", "-s", str(launcher.pid), "."], capture_output=True, text=True)
        return found.stdout.split()

    wait_for(lambda: not training(), seconds=120)  # no orphan: every worker ended with its launcher
    stopped = [load_checkpoint(cell / LAST, mmap=True)["step"] for cell in cells]
    assert all(step < 60 for step in stopped), stopped
    again = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [json.loads((cell / "result.json").read_text())["updates"] for cell in cells] == [60, 60]
    assert all("resuming from" in (cell / "train.log").read_text() for cell in cells)


@pytest.mark.slow
@pytest.mark.parametrize("how, code", [("SIGTERM", 75), ("Ctrl-C", 130)])
def test_a_study_stopped_by_a_signal_stops_every_cell_with_a_checkpoint(prepared, tmp_path, how, code):
    """SIGTERM to the launcher alone (a scheduler, `timeout`, a closed terminal), or Ctrl-C (SIGINT to the whole
    foreground group), while 2 of its 4 cells train: the running cells stop after their update with a checkpoint,
    the others do not start, the launcher waits for them and exits 75 (130) in one line, leaving no process; the
    same command continues every cell to its score."""
    command = study(prepared, tmp_path, "+ablation=absolute,relative", "train.seed=1,2", "train.max_steps=60",
                    "hydra.launcher.n_jobs=2")
    launcher = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, **INTERACTIVE)
    wait_for(lambda: updated(tmp_path, 4) == 2, seconds=300)
    if how == "SIGTERM":
        launcher.send_signal(signal.SIGTERM)
    else:
        os.killpg(launcher.pid, signal.SIGINT)
    _, err = launcher.communicate(timeout=300)
    assert launcher.returncode == code and "Traceback" not in err and "leaked" not in err, err[-3000:]
    assert f"stopped by {'SIGTERM' if code == 75 else 'SIGINT'}: every cell stopped after its update" in err
    wait_for(lambda: not subprocess.run(["pgrep", "-s", str(launcher.pid)], capture_output=True).stdout, 30)
    started = [p.parent for p in tmp_path.glob("*/checkpoint_last.pt")]  # no worker trains on for nobody
    assert len(started) == 2 and all(load_checkpoint(p / LAST, mmap=True)["step"] < 60 for p in started)
    assert not list(tmp_path.glob("*/result.json")) and not list(tmp_path.glob(".stopping-*"))
    again = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert [json.loads(p.read_text())["updates"] for p in tmp_path.glob("*/result.json")] == [60] * 4
