"""Sweeps are Hydra sweeps: a cell's folder is named by the overrides that define its run, a resumed folder is the
same run, a cell ends in its score, and Hydra's submitit launcher runs the cells as jobs (rehearsed locally)."""

import dataclasses
import json
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.checkpoints.checkpoint import LAST, CheckpointError, load_checkpoint
from nmt.checkpoints.resume import check_same_config
from nmt.overrides import sweep_checks
from nmt.config import OptimConfig
from nmt.compose import register_schemas
from nmt.run_names import CELL_NAME_MAX, capped
from nmt.compose import cell_name_for
from tests.conftest import ROOT, data_overrides, micro_config, model_overrides, one_error_line

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_a_cell_is_named_by_what_defines_its_run():
    register_schemas()
    paper = ["model=base", "data=wmt14_en_de", "+experiment=paper_base", "model.clip=4"]
    assert cell_name_for(paper) == "base_wmt14_en_de+experiment-paper_base+model.clip-4+train.seed-1"
    # extending or observing the run, placing it or its data, or spelling it another way: the same cell
    same = [*paper, "train.max_steps=200000", "train.save_every_steps=500", "train.device=cuda", "train.threads=4",
            "data.prepared_dir=/scratch/wmt14", "hydra/launcher=slurm", "hydra.launcher.nodes=2"]
    assert cell_name_for(same) == cell_name_for(paper)
    assert cell_name_for([*paper[:3], "+ablation=k4"]) == cell_name_for(paper)
    assert cell_name_for([*paper[:3], "+ablation=k16"]) == cell_name_for([*paper[:3], "+ablation=relative"]) \
        == cell_name_for(paper[:3])  # k = 16 is the preset's own
    # another recipe (below), rate, seed, batch, vocabulary, model or data preset, scored split or lines: another cell
    assert cell_name_for(["+experiment=table1", *paper[:2], "model.clip=4"]) != cell_name_for(paper)
    for other in ("optim.lr_scale=2", "train.seed=2", "train.max_tokens=2048",
                  "data.vocab_size=16000", "model.share_heads=true", "model=big", "data=wmt14_en_fr",
                  "train.score_split=test", "train.score_lines=9"):
        assert cell_name_for([*paper, other]) != cell_name_for(paper), other
    assert len(capped("x" * 300, "+h")) == CELL_NAME_MAX and capped("x" * 300, "+h") != capped("x" * 299 + "y", "+h")


def test_a_cell_folder_passes_back_as_an_override_value():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    register_schemas()
    name = cell_name_for(["data=local", "data.src=en", "data.tgt=fr", "data.train=corpus/my train", "model.position=t5"])
    assert OverridesParser.create().parse_override(f"directory=multirun/x/{name}").value() == f"multirun/x/{name}"


def test_every_value_of_a_sweep_is_checked_once():
    cells = sweep_checks(["-m", "model.clip=0,1,2", "model.rel_key=true,false", "+experiment=table1"])
    assert [c[:2] for c in cells] == [["model.clip=0", "model.rel_key=True"], ["model.clip=1", "model.rel_key=True"],
                                      ["model.clip=2", "model.rel_key=True"], ["model.clip=0", "model.rel_key=False"]]


def saved_state(**train) -> dict:
    model = {k: getattr(v, "value", v) for k, v in dataclasses.asdict(micro_config()).items()}
    config = {"model": model, "optim": dataclasses.asdict(OptimConfig()) | {"schedule": "inverse_sqrt"},
              "train": {"max_tokens": 300, "tokens_per_update": 1200, "seed": 1, **train}}
    return {"config": config, "model": {"embed.weight": torch.zeros(40, 32)}, "world_size": 4}


def test_a_resumed_run_may_extend_but_not_change_its_definition(tmp_path):
    state = saved_state()
    job = {section: dict(values) for section, values in state["config"].items()}
    longer = {**job, "train": {**job["train"], "max_steps": 10**6, "save_every_steps": 7, "device": "cuda",
                               "update_freq": 4}}
    check_same_config(state, longer, 40, 1200, tmp_path)  # on one device with 4 micro-batches: the same batch
    changed = {**job, "optim": {**job["optim"], "lr_scale": 2.0, "warmup": 10},
               "train": {**job["train"], "seed": 3}}
    with pytest.raises(CheckpointError) as refused:
        check_same_config(state, changed, 40, 2400, tmp_path)
    message = str(refused.value)
    for part in ("optim.lr_scale=2.0 (the folder's run: 1.0)", "optim.warmup=10 (the folder's run: 4000)",
                 "train.seed=3 (the folder's run: 1)", "an effective batch of 2400 tokens (the folder's run: 1200)"):
        assert part in message
    assert "\n" not in message and "max_steps" not in message


def sweep_command(prepared, sweep_dir, *extra, tasks=2):
    """A -m sweep as Hydra's submitit launcher runs it on a cluster, here with its local executor: one job per cell,
    `tasks` gloo processes per job."""
    settings = ["train.max_tokens=300", "train.tokens_per_update=600", "train.valid_every=0",
                "train.valid_bleu_sentences=0", "train.threads=1", "train.log_every=1", "train.save_every_steps=2",
                "train.keep_last=0", "train.device=cpu", "train.score_lines=3", "model.dropout=0.0"]
    return [sys.executable, "-m", "nmt.train", "-m", "hydra/launcher=local_jobs",
            f"hydra.launcher.tasks_per_node={tasks}", f"hydra.sweep.dir={sweep_dir}", *data_overrides(prepared),
            *(o for o in model_overrides() if not o.startswith("model.clip=")), *settings, *extra]


def cells(sweep_dir) -> dict:
    """{k: the cell's folder} of the scored cells of a sweep."""
    return {json.loads(p.read_text())["model"]["clip"]: p.parent for p in sweep_dir.glob("*/result.json")}


@pytest.mark.slow
def test_the_submitit_rehearsal_trains_scores_tables_and_continues(prepared, tmp_path):
    """Two cells of 2 tasks each, trained, scored and tabled; a sweep killed from outside (SIGKILL to its process
    group) while a cell trains, run again: the finished cell is not trained again, the killed one continues from its
    checkpoint and ends with the parameters of an uninterrupted run; a sweep of another recipe gets folders of its
    own, and a run of another definition in a cell's folder is refused in one line."""
    whole = tmp_path / "whole"
    done = subprocess.run(sweep_command(prepared, whole, "train.max_steps=6", "model.clip=0,2"), cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    reference = cells(whole)
    assert sorted(reference) == [0, 2]
    for folder in reference.values():
        result = json.loads((folder / "result.json").read_text())
        assert result["updates"] == 6 and result["sentences"] == 3 and result["split"] == "valid"
        assert "effective batch: 2 devices x 300 tokens x 1 micro-batches = 600 (recipe: 600)" in \
            (folder / "train.log").read_text()
    table = subprocess.run([sys.executable, "-m", "nmt.table", str(whole), "--rows", "model.clip=0", "model.clip=2"],
                           cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "| model.clip=0 | 1 |" in table.stdout and "| model.clip=2 | 1 |" in table.stdout

    resumed = tmp_path / "resumed"
    first = subprocess.run(sweep_command(prepared, resumed, "train.max_steps=6", "model.clip=0"), cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-4000:]
    finished = cells(resumed)[0] / "result.json"
    finished_at = finished.stat().st_mtime_ns
    killed = subprocess.Popen(sweep_command(prepared, resumed, "train.max_steps=6", "model.clip=0,2"), cwd=ROOT,
                              env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not any(resumed.glob("*model.clip-2*/checkpoint_last.pt")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    partial = next(resumed.glob("*model.clip-2*"))
    assert not (partial / "result.json").exists()
    again = subprocess.run(sweep_command(prepared, resumed, "train.max_steps=6", "model.clip=0,2"), cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert finished.stat().st_mtime_ns == finished_at  # done: not trained or scored again
    assert "resuming from" in (partial / "train.log").read_text()
    a, b = load_checkpoint(reference[2] / LAST), load_checkpoint(partial / LAST)
    assert a["step"] == b["step"] == 6
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name

    other = subprocess.run(sweep_command(prepared, resumed, "train.max_steps=2", "model.clip=0",
                                         "optim.lr_scale=2"), cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=600)
    assert other.returncode == 0, other.stderr[-4000:]
    assert len(list(resumed.glob("*/result.json"))) == 3 and finished.stat().st_mtime_ns == finished_at
    refused = subprocess.run([sys.executable, "-m", "nmt.train", *data_overrides(prepared),
                              *model_overrides(clip=0, dropout=0.0),
                              "train.max_tokens=300", "train.tokens_per_update=600", "train.max_steps=8",
                              "train.seed=5", "train.device=cpu", f"train.output_dir={finished.parent}"],
                             cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    error = [line for line in refused.stderr.splitlines() if "ERROR" in line]
    assert len(error) == 1 and "train.seed=5 (the folder's run: 1)" in error[0], refused.stderr


@pytest.mark.parametrize("typo, named", [("model.cliip=3", "model.cliip"), ("model.position=relative,relativ",
                                                                            "relativ")])
def test_a_typo_in_a_sweep_is_one_line_before_any_cell_runs(tmp_path, typo, named):
    done = subprocess.run([sys.executable, "-m", "nmt.train", "-m", "model.clip=0,2", typo,
                           f"hydra.sweep.dir={tmp_path}/sweep"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], done.stderr
    assert not (tmp_path / "sweep").exists()


@pytest.mark.slow
def test_a_recipe_that_averages_runs_as_a_cell_of_two_tasks_scored_once(prepared, tmp_path):
    """Every task of a submitit job knows its rank before the cell reads it: rank 0 alone averages, decodes and
    scores; the other task waits for its score (it once took itself for rank 0 and looked for averaged.pt)."""
    done = subprocess.run(sweep_command(prepared, tmp_path / "sweep", "train.max_steps=4", "train.average_last=2",
                                        "model.clip=2"), cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    cell = cells(tmp_path / "sweep")[2]
    result = json.loads((cell / "result.json").read_text())
    assert result["checkpoint"] == "averaged.pt" and len(result["averaged_from"]) == 2
    logs = [path.read_text() for path in (tmp_path / "sweep" / ".submitit").rglob("*_log.err")]
    assert len(logs) == 2 and sum("sacreBLEU" in log for log in logs) == 1, logs


@pytest.mark.slow
def test_a_preempted_submitit_job_saves_requeues_and_continues_bit_exact(prepared, tmp_path):
    """submitit's preemption signal (USR2) to both tasks of a cell's job: every rank stops after the same update with
    a complete checkpoint, submitit's own handler requeues the job (its local executor restarts the tasks), and the
    requeued job resumes and ends with the parameters of an uninterrupted cell."""
    whole = subprocess.run(sweep_command(prepared, tmp_path / "whole", "train.max_steps=30", "model.clip=2"),
                           cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert whole.returncode == 0, whole.stderr[-4000:]
    sweep = subprocess.Popen(sweep_command(prepared, tmp_path / "preempted", "train.max_steps=30", "model.clip=2"),
                             cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not any((tmp_path / "preempted").glob(f"*/{LAST}")) and time.monotonic() < deadline:
        time.sleep(0.05)
    tasks = subprocess.run(["pgrep", "-f", f"submitit.core._submit {tmp_path / 'preempted'}"], capture_output=True,
                           text=True).stdout.split()
    assert len(tasks) == 2, tasks
    for pid in tasks:
        os.kill(int(pid), signal.SIGUSR2)
    out, _ = sweep.communicate(timeout=600)
    assert sweep.returncode == 0, out[-4000:]
    cell = next((tmp_path / "preempted").glob(f"*/{LAST}")).parent
    log = (cell / "train.log").read_text()
    assert "stopped by SIGUSR2" in log and "resuming from" in log
    a, b = cells(tmp_path / "whole")[2], cells(tmp_path / "preempted")[2]
    assert load_checkpoint(b / LAST)["step"] == 30
    for name, tensor in load_checkpoint(a / LAST)["model"].items():
        assert torch.equal(tensor, load_checkpoint(b / LAST)["model"][name]), name


def test_a_cell_its_tasks_cannot_train_is_refused_before_any_job(prepared, tmp_path):
    """4 tasks a cell cannot deal a 2-micro-batch recipe: one line and exit 2 before anything is submitted (once
    refused only inside the job)."""
    done = subprocess.run(sweep_command(prepared, tmp_path / "sweep", "train.max_steps=2", "model.clip=2", tasks=4),
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    one_error_line(done, "the sweep was not submitted", "cannot be reached on 4 device(s)")
    assert not (tmp_path / "sweep" / ".submitit").exists()


def test_the_other_ranks_wait_for_rank_0s_score_and_stop_when_it_failed(tmp_path):
    from nmt.lab.run import wait_for_score
    from nmt.errors import UserError

    result, failed = tmp_path / "result.json", tmp_path / ".score_failed"
    result.write_text("{}")
    wait_for_score(result, failed, poll_s=0.01)  # scored: returns at once
    result.unlink()
    failed.touch()
    started = time.monotonic()
    with pytest.raises(UserError, match="rank 0 did not score the cell"):
        wait_for_score(result, failed, poll_s=0.01)
    assert time.monotonic() - started < 5


CRASH = """import os
if os.environ.get("CRASH_CELL"):  # a crash that is not the project's own error, inside the cell's job
    from nmt.training.trainer import Trainer
    train = Trainer.train
    def crashing(self):
        if os.environ["CRASH_CELL"] in self.out.name:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (the test's)")
        return train(self)
    Trainer.train = crashing
"""


@pytest.mark.slow
def test_a_crashed_cell_fails_its_job_is_named_at_once_and_re_runs_alone(prepared, tmp_path):
    """A RuntimeError inside one cell's job (as CUDA's out of memory): the job fails (not "Job completed
    successfully"), the traceback is in the cell's train.log and the job's .err, the submitting command names the
    cell's folder in one line while the other cell still trains, waits for it, and ends naming the failed cell; run
    again with hydra.launcher.cells=failed, only that cell is submitted, and the sweep ends scored."""
    (tmp_path / "sitecustomize.py").write_text(CRASH)
    sweep = tmp_path / "sweep"
    command = sweep_command(prepared, sweep, "train.max_steps=6", "model.clip=0,2")
    done = subprocess.run(command, cwd=ROOT, env={**ENV, "CRASH_CELL": "clip-0",
                                                  "PYTHONPATH": f"{tmp_path}:{ROOT}"},
                          capture_output=True, text=True, timeout=600)
    lines = done.stderr.strip().splitlines()
    failed = [line for line in lines if line.startswith("a cell of the sweep failed")]
    crashed = next(sweep.glob("*clip-0*"))
    assert done.returncode == 1 and len(failed) == 1, done.stderr[-4000:]
    assert f"{crashed}: task 0: RuntimeError: CUDA out of memory" in failed[0] and "waiting for 1 other" in failed[0]
    assert lines[-1].startswith("1 of 2 cells failed") and str(crashed) in lines[-1] and "cells=failed" in lines[-1]
    assert sorted(cells(sweep)) == [2]  # the other cell was waited for: trained and scored
    assert "Traceback" in (crashed / "train.log").read_text() and "CUDA out of memory" in (crashed / "train.log").read_text()
    err = re.search(r"\.submitit/\S+_log\.err", failed[0])[0]
    logs = "".join(path.read_text() for path in (sweep / Path(err).parent).glob("*_log.*"))
    assert "Job completed successfully" not in logs and "RuntimeError: CUDA out of memory" in logs
    assert "CUDA out of memory" in (crashed / "failed").read_text()
    scored = next(iter(cells(sweep).values())) / "result.json"
    scored_at = scored.stat().st_mtime_ns

    again = subprocess.run([*command, "hydra.launcher.cells=failed"], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "1 of 2 cells are scored; submitting 1 (hydra.launcher.cells=failed)" in again.stderr
    assert sorted(cells(sweep)) == [0, 2] and scored.stat().st_mtime_ns == scored_at
    assert not (crashed / "failed").exists()
    idle = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert idle.returncode == 0 and "2 of 2 cells are scored; submitting 0" in idle.stderr, idle.stderr[-4000:]
    assert len([job for job in (sweep / ".submitit").iterdir() if job.name.isdigit()]) == 3  # none for a scored cell


@pytest.mark.slow
def test_a_task_killed_by_a_signal_is_named_as_such(prepared, tmp_path):
    """SIGKILL to one task of a cell's job (as the OOM killer sends): the submitting command says which task ended
    without a word, not submitit's "Error stream produced:" header."""
    sweep = tmp_path / "sweep"
    running = subprocess.Popen(sweep_command(prepared, sweep, "train.max_steps=400", "model.clip=2"), cwd=ROOT,
                               env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not any(sweep.glob(f"*/{LAST}")) and time.monotonic() < deadline:
        time.sleep(0.05)
    tasks = subprocess.run(["pgrep", "-f", f"submitit.core._submit {sweep}"], capture_output=True,
                           text=True).stdout.split()
    assert len(tasks) == 2, tasks
    os.kill(int(max(tasks, key=int)), signal.SIGKILL)
    _, err = running.communicate(timeout=600)
    failed = [line for line in err.splitlines() if line.startswith("a cell of the sweep failed")]
    assert running.returncode == 1 and len(failed) == 1, err[-4000:]
    assert "ended without a result or an error line" in failed[0] and "killed by a signal" in failed[0]
    assert "Error stream produced" not in err
