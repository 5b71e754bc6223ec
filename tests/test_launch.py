"""The batch belongs to the recipe: every launch form trains the same batch (train.tokens_per_update)."""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nmt.batch import micro_batches
from nmt.checkpoints.checkpoint import LAST, load_checkpoint
from nmt.config import ConfigError, TrainConfig
from nmt.data.shards import EncodedSplit
from tests.conftest import ROOT, data_overrides, model_overrides, multi30k_lines


def test_accumulation_is_derived_from_the_recipe_batch():
    paper = TrainConfig(tokens_per_update=32768, max_tokens=4096)
    assert [micro_batches(paper, w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert micro_batches(TrainConfig(tokens_per_update=32768, max_tokens=32768), 1) == 1
    assert micro_batches(TrainConfig(tokens_per_update=32768, max_tokens=2731), 6) == 2  # 12 x 2,731: 0.01 % over
    assert micro_batches(TrainConfig(tokens_per_update=32768, max_tokens=4096, update_freq=4), 2) == 4
    assert micro_batches(TrainConfig(max_tokens=1000, update_freq=3), 5) == 3  # no stated batch: as given


@pytest.mark.parametrize("world_size, max_tokens, update_freq, message", [
    (3, 4096, None, "cannot be reached on 3 device"),  # 8 micro-batches do not share over 3 devices
    (16, 4096, None, "cannot be reached on 16 device"),  # fewer micro-batches than devices
    (1, 5000, None, "miss it by more than 5%"),  # 7 x 5,000 = 35,000
    (2, 4096, 2, "train.update_freq=2 contradicts train.tokens_per_update=32768"),
])
def test_a_batch_out_of_reach_is_refused(world_size, max_tokens, update_freq, message):
    config = TrainConfig(tokens_per_update=32768, max_tokens=max_tokens, update_freq=update_freq)
    with pytest.raises(ConfigError, match=re.escape(message)):
        micro_batches(config, world_size)


def test_the_trainer_refuses_an_unreachable_batch_in_one_line(prepared, tmp_path):
    result = subprocess.run([sys.executable, "-m", "nmt.train", *data_overrides(prepared), *model_overrides(),
                             "train.tokens_per_update=1000", "train.max_tokens=600", f"train.output_dir={tmp_path}/r"],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "train.tokens_per_update=1000 cannot be reached on 1 device" in lines[0]
    assert not (tmp_path / "r").exists()  # refused before anything was written


def multi_node_launches() -> list[tuple[str, int, list[str]]]:
    """(the line, its device count, its nmt.train overrides) for every multi-node launch the docs and the SLURM
    script show: torchrun's --nnodes x --nproc_per_node, sbatch's --nodes x the script's GPUs per node."""
    gpus = int(re.search(r"#SBATCH --gpus-per-node=(\d+)", (ROOT / "scripts/slurm_train.sh").read_text()).group(1))
    texts = [(ROOT / "README.md").read_text(), *(p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))),
             (ROOT / "scripts/slurm_train.sh").read_text()]
    found = []
    for line in (line for text in texts for line in re.findall(r"[^`\n]*--nnodes=\d[^`\n]*|sbatch --nodes=[^`\n]*",
                                                                   text)):
        line = line.lstrip("# ").strip()
        torchrun = re.search(r"--nnodes=(\d+) --nproc_per_node=(\d+)\S* .*-m nmt\.train (.*)", line)
        if torchrun:
            found.append((line, int(torchrun[1]) * int(torchrun[2]), torchrun[3].split()))
            continue
        sbatch = re.search(r"sbatch --nodes=(\d+) \S*slurm_train\.sh (\S+) (\S+) (\S+)(.*)", line)
        assert sbatch, f"a multi-node line this test cannot read: {line}"
        overrides = [f"+experiment={sbatch[2]}", f"model={sbatch[3]}", f"data={sbatch[4]}", *sbatch[5].split()]
        found.append((line, int(sbatch[1]) * gpus, overrides))
    return found


def test_every_multi_node_line_of_the_docs_reaches_its_recipe_batch():
    """The docs' multi-node commands and the SLURM launcher preset with the paper's recipes: the batch rule admits
    each on its device count (a refused line would exit 2 on the cluster, before training)."""
    from omegaconf import OmegaConf

    from nmt.compose import preset_job

    launches = multi_node_launches()
    assert {world for _, world, _ in launches} >= {16}, launches  # README's 2 x 8 and the script's 4 x 4
    for line, world, overrides in launches:
        job = preset_job(*[o for o in overrides if "=" in o])
        micro_batches(job.train, world)  # ConfigError: the line cannot reach its batch
    for preset in sorted((ROOT / "configs/hydra/launcher").glob("*.yaml")):
        launcher = OmegaConf.load(preset)
        for model in ("base", "big"):
            job = preset_job(f"model={model}", "data=wmt14_en_de", f"+experiment=paper_{model}")
            micro_batches(job.train, launcher.get("nodes", 1) * launcher.get("tasks_per_node", 1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_every_launch_form_takes_the_same_first_gradient(prepared, tmp_path):
    """One process with 4 micro-batches, torchrun on one node of 4, two torchrun agents ("nodes") of 2 meeting
    at a c10d rendezvous and a -m sweep's cell as Hydra's submitit launcher runs it (2 tasks): the same logged
    batch, and Adam's first moment after update 1 (the gradient itself, times 1 - beta1) equal to float tolerance. The weights after one Adam step could not show it (each moves by ~lr)."""
    budget = 300
    overrides = [*data_overrides(prepared), *model_overrides(dropout=0.0), "train.max_steps=1",
                 f"train.max_tokens={budget}", f"train.tokens_per_update={4 * budget}", "train.valid_every=0",
                 "train.valid_bleu_sentences=0", "train.seed=3", "train.threads=1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = [sys.executable, "-m", "nmt.train"]
    torchrun = [sys.executable, "-m", "torch.distributed.run"]

    def launch(name, *commands):
        sweep = commands[0][:4] == [*run, "-m"]  # a -m sweep: its cell's folder is the sweep's to name
        folder = f"hydra.sweep.dir={tmp_path}/{name}" if sweep else f"train.output_dir={tmp_path}/{name}"
        procs = [subprocess.Popen([*c, *overrides, folder], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True) for c in commands]
        for p in procs:
            out, _ = p.communicate(timeout=600)
            assert p.returncode == 0, out[-3000:]
        return next((tmp_path / name).glob(f"*/{LAST}")).parent if sweep else tmp_path / name

    port = free_port()
    node = [*torchrun, "--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d", "--rdzv_id=rehearsal",
            f"--rdzv_endpoint=127.0.0.1:{port}", "-m", "nmt.train"]
    # a cell of a -m sweep, as Hydra's submitit launcher starts it: one job of 2 tasks, no torchrun inside
    cell = [*run, "-m", "hydra/launcher=local_jobs", "hydra.launcher.tasks_per_node=2", "train.score_lines=2"]
    forms = {"one process": launch("single", run),
             "one node of 4": launch("node4", [*torchrun, "--standalone", "--nproc_per_node=4", "-m", "nmt.train"]),
             "two nodes of 2": launch("nodes2x2", node, node),
             "a sweep cell of 2 tasks": launch("cell", cell)}
    expected = {"one process": "1 devices x 300 tokens x 4 micro-batches = 1200 (recipe: 1200)",
                "one node of 4": "4 devices x 300 tokens x 1 micro-batches = 1200 (recipe: 1200)",
                "two nodes of 2": "4 devices x 300 tokens x 1 micro-batches = 1200 (recipe: 1200)",
                "a sweep cell of 2 tasks": "2 devices x 300 tokens x 2 micro-batches = 1200 (recipe: 1200)"}
    reference = load_checkpoint(forms["one process"] / LAST)["optimizer"]["state"]
    for form, folder in forms.items():
        assert f"effective batch: {expected[form]}" in (folder / "train.log").read_text(), form
        state = load_checkpoint(folder / LAST)["optimizer"]["state"]
        assert state.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(state[key]["exp_avg"], reference[key]["exp_avg"], rtol=1e-4, atol=1e-9,
                                       msg=lambda m: f"{form}, parameter {key}: {m}")
    assert any(s["exp_avg"].abs().sum() > 0 for s in reference.values())  # a real gradient, not zeros


SHIM = ROOT / "tests" / "slurm_shim"


@pytest.mark.slow
def test_slurm_script_requeues_on_its_signal_and_resumes_bit_identically(prepared, tmp_path):
    """scripts/slurm_train.sh under a shim of sbatch/srun/scontrol (2 "nodes" of 1 process on this machine, c10d):
    USR1 mid-run (SLURM's --signal=B:USR1@120) leaves a complete checkpoint and a requeue; the requeued job ends with
    the parameters of an uninterrupted job. Submitted from a fresh folder: its job log needs no folder made first."""
    recipe = [*data_overrides(prepared), *model_overrides(), "train.max_tokens=2048", "train.max_steps=30",
              "train.save_every_steps=5", "train.keep_last=0", "train.valid_every=0", "train.valid_bleu_sentences=0",
              "train.log_every=5", "train.device=cpu", "train.threads=1"]
    submit = tmp_path / "submit"
    submit.mkdir()

    def sbatch(job_id: str, output: Path) -> subprocess.Popen:
        env = {**os.environ, "PATH": f"{SHIM}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
               "PYTHON": sys.executable, "OUTPUT": str(output), "RDZV_PORT": str(free_port()),
               "SLURM_JOB_ID": job_id, "SHIM_REQUEUED": str(tmp_path / "requeued"),
               "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "60"}
        return subprocess.Popen(["sbatch", str(ROOT / "scripts" / "slurm_train.sh"), "table1", "tiny", "local",
                                 *recipe], cwd=submit, env=env)

    whole = sbatch("1", tmp_path / "whole")
    assert whole.wait(timeout=600) == 0, (submit / "relnmt-1.log").read_text()[-3000:]

    stopped = sbatch("2", tmp_path / "stopped")
    first = tmp_path / "stopped" / "checkpoint_0000005.pt"
    for _ in range(6000):
        if first.exists() or stopped.poll() is not None:
            break
        time.sleep(0.05)
    stopped.send_signal(signal.SIGUSR1)
    log = submit / "relnmt-2.log"
    assert stopped.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert "requeueing job 2" in log.read_text()
    assert (tmp_path / "requeued").read_text().split() == ["2"]
    state = load_checkpoint(tmp_path / "stopped" / LAST)
    assert 5 <= state["step"] < 30 and state["saved_for"] == "signal" and state["world_size"] == 2

    requeued = sbatch("2", tmp_path / "stopped")  # SLURM runs the same script again, under the same job id
    assert requeued.wait(timeout=600) == 0, log.read_text()[-3000:]
    assert (tmp_path / "requeued").read_text().split() == ["2"]  # finished: no second requeue
    assert "effective batch: 2 devices x 2048 tokens x 1 micro-batches = 4096 (recipe: 4096)" in log.read_text()
    a, b = load_checkpoint(tmp_path / "whole" / LAST), load_checkpoint(tmp_path / "stopped" / LAST)
    assert a["step"] == b["step"] == 30
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name


@pytest.mark.slow
def test_slurm_script_requeues_a_job_that_lost_a_node_and_names_its_folder_by_overrides(prepared, tmp_path):
    """scripts/slurm_train.sh on 2 shim "nodes", one lost mid-run (its torchrun agent and workers SIGKILLed): srun
    ends the step, the job requeues itself, and the requeued job resumes from the last checkpoint to the end. With no
    OUTPUT, the run trains in a folder named by the overrides that define it, not the main run's."""
    recipe = [*data_overrides(prepared), *model_overrides(clip=2), "train.max_tokens=2048", "train.max_steps=40",
              "train.save_every_steps=2", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.log_every=2",
              "train.device=cpu", "train.threads=1"]
    step_pids = tmp_path / "step_pids"
    env = {**os.environ, "PATH": f"{SHIM}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1",
           "PYTHON": sys.executable, "RDZV_PORT": str(free_port()), "SLURM_JOB_ID": "7",
           "SHIM_REQUEUED": str(tmp_path / "requeued"), "SHIM_STEP_PIDS": str(step_pids), "SHIM_KILL_WAIT": "20",
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "10"}
    job = subprocess.Popen(["sbatch", str(ROOT / "scripts" / "slurm_train.sh"), "table1", "tiny", "local", *recipe],
                           cwd=tmp_path, env=env)
    folders = lambda: [p for p in (tmp_path / "outputs").glob("tiny_local_*") if (p / LAST).exists()]  # noqa: E731
    deadline = time.monotonic() + 300
    while not folders() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert folders(), (tmp_path / "relnmt-7.log").read_text()[-3000:]
    lost = int(step_pids.read_text().split()[1])  # node 1's torchrun agent, with its workers: a node gone
    subprocess.run(["pkill", "-KILL", "-P", str(lost)])
    os.kill(lost, signal.SIGKILL)
    log = tmp_path / "relnmt-7.log"
    assert job.wait(timeout=300) == 0, log.read_text()[-3000:]
    assert "the job step failed" in log.read_text() and (tmp_path / "requeued").read_text().split() == ["7"]
    folder = folders()[0]
    assert folder.name.startswith("tiny_local_en_de.") and "+experiment-table1+model.clip-2+" in folder.name
    assert load_checkpoint(folder / LAST)["step"] < 40

    requeued = subprocess.run(["sbatch", str(ROOT / "scripts" / "slurm_train.sh"), "table1", "tiny", "local",
                               *recipe], cwd=tmp_path, env={**env, "SLURM_RESTART_COUNT": "1"}, timeout=600)
    assert requeued.returncode == 0, log.read_text()[-3000:]
    assert load_checkpoint(folder / LAST)["step"] == 40 and "resuming from" in (folder / "train.log").read_text()
    assert (tmp_path / "requeued").read_text().split() == ["7"]  # finished: no second requeue
    assert not (tmp_path / ".relnmt-7.failures").exists()  # its count of requeues ended with the job


@pytest.mark.slow
def test_make_ablations_end_in_their_tables_and_share_a_row(prepared, tmp_path):
    """make ablate-k, then make ablate-kv, at toy size (2 gloo processes, the test files scored): one Hydra sweep each
    into one sweep folder, every cell trained with the recipe's batch, scored, and collected into table2.md /
    table3.md; Table 3's a^K + a^V row is Table 2's k = 16 cell, scored once and not trained again."""
    extra = " ".join([*data_overrides(prepared), *(o for o in model_overrides() if not o.startswith("model.clip=")),
                      "train.max_steps=4", "train.save_every_steps=2", "train.valid_every=0",
                      "train.valid_bleu_sentences=0", "train.device=cpu", "train.threads=1", "train.score_lines=5"])

    def make(verb, rows):
        done = subprocess.run(["make", "--no-print-directory", verb, "MODEL=tiny", "DATA=local", "RECIPE=table1",
                               "NPROC=2", "MAX_TOKENS=2048", rows, f"SWEEP_DIR={tmp_path}", "SPLIT=test",
                               f"EXTRA={extra}"], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]

    make("ablate-k", "CLIPS=0 16")
    cells = {json.loads(p.read_text())["model"]["clip"]: p for p in tmp_path.glob("*/result.json")}
    shared = cells[16].stat().st_mtime_ns
    make("ablate-kv", "KV=k16 neither")
    assert cells[16].stat().st_mtime_ns == shared  # done: skipped, not trained or scored again
    results = {json.loads(p.read_text())["cell"]: json.loads(p.read_text()) for p in tmp_path.glob("*/result.json")}
    assert len(results) == 3 and all(r["updates"] == 4 and r["sentences"] == 5 for r in results.values())
    for table, rows in (("table2.md", {"ablation=k0": (0, True, True), "ablation=k16": (16, True, True)}),
                        ("table3.md", {"ablation=k16": (16, True, True), "ablation=neither": (16, False, False)})):
        text = (tmp_path / table).read_text()
        for row, (clip, key, value) in rows.items():
            cell = next(r for r in results.values() if f"+{row}" in r["overrides"])
            assert (cell["model"]["clip"], cell["model"]["rel_key"], cell["model"]["rel_value"]) == (clip, key, value)
            assert f"| {row} | 1 | {cell['bleu']:.2f} | {cell['chrf']:.2f} | {cell['compound_split_bleu']:.2f} |" \
                in text, text  # the page's table (nmt/lab/page.py), one seed: no test
            assert "effective batch: 2 devices x 2048 tokens x 1 micro-batches = 4096 (recipe: 4096)" in \
                (tmp_path / cell["cell"] / "train.log").read_text()
        assert "sacreBLEU signature: nrefs:1" in text


@pytest.mark.slow
@pytest.mark.parametrize("verb, nproc, update_freq", [("train-base", 8, 1), ("train-big", 2, 4)])
def test_make_train_then_average_decode_score(prepared, tmp_path, verb, nproc, update_freq):
    """The README's GPU path at toy size: make train-base with NPROC=8 (8 gloo processes standing in for 8 GPUs, the
    recipe's 32,768-token batch at 4,096 a device) or train-big on 2 (4 micro-batches each), then make average, make
    decode and make score on local files."""
    out = tmp_path / verb
    extra = " ".join([*data_overrides(prepared), *model_overrides(), "train.max_steps=2", "train.save_every_steps=1",
                      "train.valid_every=0", "train.valid_bleu_sentences=0", "train.device=cpu", "train.threads=1",
                      f"train.output_dir={out}"])
    test = Path(prepared.test)
    ckpt = out / "averaged.pt"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for step in ([verb, f"NPROC={nproc}", "DATA=local", f"EXTRA={extra}"], ["average", "LAST=2"],
                 ["decode", f"SRC={test}.en", "TESTSET=newstest2014"],
                 ["score", f"REF={test}.de", "TESTSET=newstest2014"]):
        done = subprocess.run(["make", "--no-print-directory", *step, f"CKPT={ckpt}"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert f"effective batch: {nproc} devices x 4096 tokens x {update_freq} micro-batches = 32768 (recipe: 32768)" \
        in (out / "train.log").read_text()
    assert load_checkpoint(out / LAST)["world_size"] == nproc
    record = json.loads((out / "newstest2014.en-de.json").read_text())
    assert record["sentences"] == 15 and record["signature"].startswith("nrefs:1")
    hyps = (out / "newstest2014.en-de.hyp").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 15


HUB_README = """---
configs:
- config_name: de-en
  data_files:
  - split: train
    path: de-en/train-*
  - split: validation
    path: de-en/validation-*
  - split: test
    path: de-en/test-*
---
"""


@pytest.mark.slow
def test_wmt14_prepares_offline_from_a_copy_of_the_hub_repository(tmp_path):
    """data=wmt14_en_de data.hub_name=DIR: a folder in the hub repository's layout (README configs, de-en/*.parquet,
    rows {"translation": {"de", "en"}}) prepares through the hub reader without network, as a cluster node does."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    hub = tmp_path / "wmt14"
    (hub / "de-en").mkdir(parents=True)
    (hub / "README.md").write_text(HUB_README)
    for split, source, n in [("train", "train", 1500), ("validation", "val", 20), ("test", "test_2016_flickr", 15)]:
        pairs = zip(multi30k_lines(source, "en", n), multi30k_lines(source, "de", n))
        rows = [{"de": de, "en": en} for en, de in pairs]
        pq.write_table(pa.table({"translation": rows}), hub / "de-en" / f"{split}-00000-of-00001.parquet")
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(["make", "--no-print-directory", "prepare-wmt14",
                           f"EXTRA=data.hub_name={hub} data.vocab_size=600 data.prepared_dir={tmp_path}/prepared"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = (tmp_path / "prepared" / "manifest.json").read_text()
    assert len(EncodedSplit(tmp_path / "prepared", "test", 600)) == 15
    # the same rows from another copy are the same inputs; a node that cannot reach the hub (the preset's
    # data.hub_name, as make train-base passes it) uses the folder as it is: prepared once
    shutil.copytree(hub, tmp_path / "copy")
    for extra in (f"data.hub_name={tmp_path / 'copy'} ", ""):
        again = subprocess.run(["make", "--no-print-directory", "prepare-wmt14",
                                f"EXTRA={extra}data.vocab_size=600 data.prepared_dir={tmp_path}/prepared"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        said = again.stdout + again.stderr
        assert again.returncode == 0, said[-3000:]
        assert "rebuilding" not in said and (tmp_path / "prepared" / "manifest.json").read_text() == manifest
    assert "using the prepared data as it is" in said
