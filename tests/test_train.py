import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.average import main_flags
from nmt.checkpoints.averaging import average_checkpoints
from nmt.checkpoints.checkpoint import (
    LAST,
    PREVIOUS,
    CheckpointError,
    latest_usable,
    load_checkpoint,
    numbered_checkpoints,
    save_checkpoint,
)
from nmt.config import ModelConfig, OptimConfig
from nmt.data.batching import make_batches
from nmt.data.pipeline import prepared_dir
from nmt.data.shards import EncodedSplit
from nmt.modeling.transformer import Transformer
from nmt.train import run
from nmt.training import trainer as train_module
from nmt.training.loss import smoothed_loss
from nmt.training.optim import inverse_sqrt_lr, linear_decay_lr, make_optimizer, peak_lr, set_learning_rate
from tests.conftest import ROOT, data_overrides, micro_config, model_overrides
from tests.conftest import micro_job as job


def params(path) -> dict:
    return load_checkpoint(path)["model"]


def test_schedule_formula():
    d, w = 512, 4000
    assert inverse_sqrt_lr(1, d, w) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert inverse_sqrt_lr(4000, d, w) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak
    assert inverse_sqrt_lr(16384, d, w) == pytest.approx(512**-0.5 / 128)
    assert inverse_sqrt_lr(2000, d, w) == pytest.approx(inverse_sqrt_lr(4000, d, w) / 2)  # linear warmup
    assert inverse_sqrt_lr(100, d, w, scale=2.0) == pytest.approx(2 * inverse_sqrt_lr(100, d, w))


def test_linear_decay_schedule():
    """The demo's and the tables' schedule: the same warmup and peak as inverse_sqrt, then a straight line to 0."""
    d, w, total = 256, 100, 800
    assert linear_decay_lr(w, d, w, total) == pytest.approx(peak_lr(d, w)) == pytest.approx(inverse_sqrt_lr(w, d, w))
    assert linear_decay_lr(50, d, w, total) == pytest.approx(peak_lr(d, w) / 2)  # linear warmup
    assert linear_decay_lr(450, d, w, total) == pytest.approx(peak_lr(d, w) / 2)  # halfway down
    assert linear_decay_lr(total, d, w, total) == 0.0 and linear_decay_lr(total + 5, d, w, total) == 0.0
    assert linear_decay_lr(0, d, w, total) == linear_decay_lr(1, d, w, total) > 0  # step 0 counts as 1
    assert linear_decay_lr(300, d, w, total, scale=3.0) == pytest.approx(3 * linear_decay_lr(300, d, w, total))


def test_adam_is_fused_on_a_cpu_and_steps_as_its_loop_does():
    torch.manual_seed(0)
    module = torch.nn.Linear(32, 64)
    weights = [p.detach().clone() for p in module.parameters()]
    fused_params, loop_params = list(module.parameters()), [w.clone().requires_grad_() for w in weights]
    optim = OptimConfig()
    fused = make_optimizer(module, optim)
    loop = torch.optim.Adam(loop_params, lr=0.0, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=False)
    assert fused.param_groups[0]["fused"]
    for step in range(1, 6):
        grads = [torch.randn_like(w) for w in weights]
        for optimizer, params in ((fused, fused_params), (loop, loop_params)):
            set_learning_rate(optimizer, step, 256, optim, 10)
            for p, g in zip(params, grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b, w in zip(fused_params, loop_params, weights):
        assert not torch.equal(a, w)
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_t5_bias_tables_get_their_own_rate():
    model = Transformer(ModelConfig(position="t5", encoder_layers=1, decoder_layers=1, d_model=16, heads=2,
                                    ffn_dim=32), 50)
    optimizer = make_optimizer(model, OptimConfig(bias_lr_scale=10.0))
    tables = {id(model.encoder_self_positions.table), id(model.decoder_self_positions.table)}
    rest, biases = optimizer.param_groups
    assert {id(p) for p in biases["params"]} == tables and len(rest["params"]) + 2 == len(list(model.parameters()))
    lr = set_learning_rate(optimizer, 50, 16, OptimConfig(bias_lr_scale=10.0), 100)
    assert rest["lr"] == lr > 0 and biases["lr"] == pytest.approx(10 * lr)
    assert len(make_optimizer(model, OptimConfig()).param_groups) == 1  # the default: one group, as checkpoints hold


@pytest.mark.parametrize("model", [{}, {"edge_buckets": 8, "clip": 12}])
def test_exact_resume(prepared, tmp_path, model):
    def job_of(out, steps):
        return replace(job(prepared, out, max_steps=steps), model=micro_config(**model))

    run(job_of(tmp_path / "straight", 6))
    run(job_of(tmp_path / "resumed", 3))
    run(job_of(tmp_path / "resumed", 6))  # the same command, extended: resumes at 3
    a, b = params(tmp_path / "straight" / LAST), params(tmp_path / "resumed" / LAST)
    assert load_checkpoint(tmp_path / "resumed" / LAST)["step"] == 6
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert not torch.equal(a["embed.weight"], params(tmp_path / "resumed" / "checkpoint_0000002.pt")["embed.weight"])


def test_checkpoint_activations_trains_the_same_updates_and_may_change_on_resume(prepared, tmp_path, monkeypatch):
    """train.checkpoint_activations=true recomputes the layers in the backward (the trainer sets it on the model) and
    takes the same updates, bit for bit, with dropout on; a resume may turn it off (the run's identity leaves it
    out)."""
    from nmt.modeling import transformer

    recomputed = []
    checkpoint = transformer.checkpoint
    monkeypatch.setattr(transformer, "checkpoint", lambda *a, **k: recomputed.append(1) or checkpoint(*a, **k))
    run(job(prepared, tmp_path / "straight", max_steps=4))
    assert not recomputed
    run(job(prepared, tmp_path / "recomputed", max_steps=2, checkpoint_activations=True))
    assert recomputed  # every layer of every micro-batch, in training
    run(job(prepared, tmp_path / "recomputed", max_steps=4))  # resumed at 2 without it
    assert load_checkpoint(tmp_path / "recomputed" / LAST)["step"] == 4
    a, b = params(tmp_path / "straight" / LAST), params(tmp_path / "recomputed" / LAST)
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_checkpoint_contents_and_retention(prepared, tmp_path):
    run(job(prepared, tmp_path, max_steps=8, keep_last=2, average_last=2))
    assert [p.name for p in numbered_checkpoints(tmp_path)] == ["checkpoint_0000006.pt", "checkpoint_0000008.pt"]
    state = load_checkpoint(tmp_path / LAST)
    assert {"model", "optimizer", "scaler", "step", "epoch", "batch", "rng", "config"} <= set(state)
    assert state["config"]["model"]["d_model"] == 32 and state["config"]["train"]["max_steps"] == 8
    averaged = load_checkpoint(tmp_path / "averaged.pt")
    assert averaged["averaged_from"] == ["checkpoint_0000006.pt", "checkpoint_0000008.pt"]


def test_average_equals_parameter_mean(prepared, tmp_path):
    run(job(prepared, tmp_path, max_steps=6))
    out = tmp_path / "avg.pt"
    main_flags([str(tmp_path), "--last", "3", "--output", str(out)])
    states = [params(tmp_path / f"checkpoint_{s:07d}.pt") for s in (2, 4, 6)]
    averaged = params(out)
    for name, tensor in averaged.items():
        want = sum(s[name].double() for s in states) / 3
        torch.testing.assert_close(tensor.double(), want, rtol=1e-6, atol=1e-7)
    assert not torch.equal(averaged["embed.weight"], states[-1]["embed.weight"])
    with pytest.raises(SystemExit) as refused:
        main_flags([str(tmp_path), "--last", "9", "--output", str(out)])
    assert refused.value.code == 2


def test_average_reads_one_checkpoint_at_a_time(tmp_path, monkeypatch):
    """Averaging N checkpoints keeps the running sum and at most one loaded checkpoint alive."""
    import gc
    import weakref

    from nmt.checkpoints import averaging as average_module

    paths = []
    for step in range(1, 6):
        paths.append(tmp_path / f"checkpoint_{step:07d}.pt")
        save_checkpoint({"model": {"w": torch.full((64,), float(step)), "n": torch.tensor(step)},
                         "optimizer": {"m": torch.zeros(64)}, "step": step}, paths[-1])
    alive: list[weakref.ref] = []
    most_alive = 0
    real_load = average_module.load_checkpoint

    def counting_load(path, *args, **kwargs):
        nonlocal most_alive
        gc.collect()
        most_alive = max(most_alive, sum(ref() is not None for ref in alive) + 1)
        state = real_load(path, *args, **kwargs)
        alive.append(weakref.ref(state["model"]["w"]))
        return state

    monkeypatch.setattr(average_module, "load_checkpoint", counting_load)
    average_module.write_average(paths, tmp_path / "avg.pt")
    assert len(alive) == len(paths)  # each checkpoint read once (the last one is not read again)
    assert most_alive == 1  # no earlier checkpoint alive while one is read: with the running sum, two state dicts
    averaged = real_load(tmp_path / "avg.pt")
    torch.testing.assert_close(averaged["model"]["w"], torch.full((64,), 3.0))
    assert averaged["model"]["n"].item() == 5 and averaged["step"] == 5 and "optimizer" not in averaged


def test_average_refuses_mismatched_keys(tmp_path):
    save_checkpoint({"model": {"a": torch.ones(2)}}, tmp_path / "checkpoint_0000001.pt")
    save_checkpoint({"model": {"b": torch.ones(2)}}, tmp_path / "checkpoint_0000002.pt")
    with pytest.raises(CheckpointError, match="parameters differ"):
        average_checkpoints(numbered_checkpoints(tmp_path))


def test_integer_buffers_are_taken_not_averaged(tmp_path):
    save_checkpoint({"model": {"w": torch.zeros(2), "n": torch.tensor(3)}}, tmp_path / "a.pt")
    save_checkpoint({"model": {"w": torch.ones(2), "n": torch.tensor(7)}}, tmp_path / "b.pt")
    avg = average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    assert avg["n"].item() == 7 and avg["n"].dtype == torch.int64
    assert avg["w"].tolist() == [0.5, 0.5]


def test_truncated_checkpoint_is_reported_and_resume_falls_back(prepared, tmp_path):
    run(job(prepared, tmp_path, max_steps=4))
    last = tmp_path / LAST
    newest = numbered_checkpoints(tmp_path)[-1]
    data = newest.read_bytes()
    last.unlink()
    last.write_bytes(data[: len(data) // 2])  # a crash mid-copy
    newest.unlink()
    newest.write_bytes(data[: len(data) // 3])
    with pytest.raises(CheckpointError, match=f"{LAST}: not a usable checkpoint"):
        load_checkpoint(last)
    path, state = latest_usable(tmp_path)
    assert path.name == PREVIOUS and state["step"] == 2  # the whole state of the save before
    assert (tmp_path / f"{LAST}.damaged").is_file()  # set aside: the next save cannot rotate it over the good one
    run(job(prepared, tmp_path, max_steps=4))  # auto-resume from update 2 and finish
    assert load_checkpoint(tmp_path / LAST)["step"] == 4


def test_pickled_code_is_refused(tmp_path):
    torch.save({"model": {}, "payload": Path("/tmp")}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="pickled Python objects"):
        load_checkpoint(tmp_path / "evil.pt")


def test_nonfinite_loss_skips_the_update_then_stops(prepared, tmp_path, monkeypatch):
    real = train_module.batch_loss
    calls = {"n": 0}

    def sometimes_nan(*args):
        calls["n"] += 1
        loss, nll = real(*args)
        return (loss * float("nan"), nll) if calls["n"] == 3 else (loss, nll)

    monkeypatch.setattr(train_module, "batch_loss", sometimes_nan)
    run(job(prepared, tmp_path / "one", max_steps=4))
    assert load_checkpoint(tmp_path / "one" / LAST)["step"] == 4  # the NaN update was skipped, not counted
    assert math.isfinite(sum(t.sum().item() for t in params(tmp_path / "one" / LAST).values()))

    monkeypatch.setattr(train_module, "batch_loss",
                        lambda model, weight, *_: (weight.sum() * float("nan"), weight.sum().detach()))
    with pytest.raises(FloatingPointError, match=r"3 updates in a row skipped \(non-finite loss\)"):
        run(job(prepared, tmp_path / "all", max_steps=4, max_bad_updates=3))


def nan_gradients_at(call: int, real):
    """The trainer's loss (batch_loss) whose call-th backward gives NaN gradients with a finite loss:
    d/dx sqrt(|x - x|) at 0 is inf * 0."""
    calls = {"n": 0}

    def loss(model, weight, *args):
        calls["n"] += 1
        value, nll = real(model, weight, *args)
        if calls["n"] == call:
            x = weight.float()
            value = value + 0.0 * (x - x.detach()).abs().sqrt().sum()
        return value, nll

    return loss, calls


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_nonfinite_gradient_is_skipped_in_every_precision(prepared, tmp_path, monkeypatch, precision):
    """No GradScaler guards bf16 or fp32: the update whose gradients are NaN (finite loss) must still be skipped,
    and no checkpoint after it may hold a non-finite parameter."""
    loss, calls = nan_gradients_at(3, train_module.batch_loss)
    monkeypatch.setattr(train_module, "batch_loss", loss)
    run(job(prepared, tmp_path, max_steps=5, precision=precision, save_every_steps=1, keep_last=10))
    assert "update 3 skipped: non-finite gradient (the loss was finite)" in (tmp_path / "train.log").read_text()
    assert calls["n"] == 6 and load_checkpoint(tmp_path / LAST)["step"] == 5  # the run went on to its end
    for path in [*numbered_checkpoints(tmp_path), tmp_path / LAST]:
        assert all(torch.isfinite(t).all() for t in load_checkpoint(path)["model"].values()), path


def test_fp16_overflow_lowers_the_scale_and_drops_the_update(prepared, tmp_path, monkeypatch):
    """A finite loss whose gradients are not (an fp16 overflow): the scaler halves, the update does not count."""
    loss, calls = nan_gradients_at(3, train_module.batch_loss)
    monkeypatch.setattr(train_module, "batch_loss", loss)
    run(job(prepared, tmp_path, max_steps=4, precision="fp16", save_every_steps=4))
    state = load_checkpoint(tmp_path / LAST)
    assert state["step"] == 4  # the dropped update was not counted: four more followed
    assert state["scaler"]["scale"] == 2.0**15  # lowered once from 2^16
    assert calls["n"] == 5  # five micro-batches for four counted updates
    assert all(torch.isfinite(t).all() for t in state["model"].values())


@pytest.mark.slow  # a minute or two of torch.compile on a CPU
def test_compiled_training_survives_changing_shapes_and_saves_plain_keys(prepared, tmp_path):
    """train.compile=true on a CPU: one dynamic-shape graph for every batch shape, the same gradients as
    eager, and checkpoints an uncompiled model loads."""
    import torch._dynamo

    from nmt.data.batching import collate
    from nmt.modeling.transformer import Transformer

    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # reset() keeps the counters
    torch.manual_seed(0)
    model = Transformer(micro_config(dropout=0.0), 600)
    compiled = torch.compile(model, dynamic=True)
    shard = EncodedSplit(prepared_dir(prepared), "train", 600)
    for indices in ([0, 1, 2], [5, 9], [100, 3, 44, 71, 12], [7]):  # four different (B, N) shapes
        batch = collate(shard, np.array(indices))
        for net in (compiled, model):
            net.zero_grad()
            smoothed_loss(net(batch.src, batch.tgt_in), batch.tgt_out, 0.1)[0].backward()
            grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
            if net is compiled:
                compiled_grads = grads
        for got, want in zip(compiled_grads, grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs_before <= 2  # not one per shape

    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    run(job(prepared, tmp_path, max_steps=4, compile=True))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before  # the trainer compiled
    state = load_checkpoint(tmp_path / LAST)["model"]
    assert not any("_orig_mod" in key for key in state)
    Transformer(micro_config(), 600).load_state_dict(state)


def test_ddp_two_processes_equal_one_process_with_accumulation(prepared, tmp_path):
    """torchrun --nproc_per_node=2 (gloo) takes the same updates as 1 process with update_freq=2."""
    shard = EncodedSplit(prepared_dir(prepared), "train", 600)
    lengths = (shard.src_lengths + 1, shard.tgt_lengths + 1)
    budget = next(m for m in range(600, 700, 10) if len(make_batches(*lengths, m, 3, 0, 1)) % 2 == 0)
    overrides = [
        *data_overrides(prepared), *model_overrides(dropout=0.0), "optim.warmup=4", "optim.lr_scale=2.0",
        "train.max_steps=3", f"train.max_tokens={budget}", "train.valid_every=0", "train.seed=3", "train.threads=1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    ddp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "nmt.train", *overrides, f"train.output_dir={tmp_path}/ddp"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    assert load_checkpoint(tmp_path / "ddp" / LAST)["world_size"] == 2
    single = subprocess.run([sys.executable, "-m", "nmt.train", *overrides, "train.update_freq=2",
                             f"train.output_dir={tmp_path}/single"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    a, b = params(tmp_path / "ddp" / LAST), params(tmp_path / "single" / LAST)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-6)


def test_hydra_sweep_gives_each_job_its_own_folder(prepared, tmp_path):
    """python -m nmt.train -m model.clip=0,2 (the README's Table 2 sweep) runs one job per value, in a folder named
    by its overrides; config.yaml says which, and result.json holds its score."""
    result = subprocess.run(
        [sys.executable, "-m", "nmt.train", "-m", *data_overrides(prepared), *model_overrides(clip="0,2"),
         "train.max_steps=2", "train.score_lines=3",
         "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1", f"hydra.sweep.dir={tmp_path}"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    tables = {}
    for job_dir in sorted(p.parent for p in tmp_path.glob("*/result.json")):
        assert f"model.clip-{load_checkpoint(job_dir / LAST)['config']['model']['clip']}" in job_dir.name
        clip = load_checkpoint(job_dir / LAST)["config"]["model"]["clip"]
        assert f"clip: {clip}" in (job_dir / "config.yaml").read_text()
        tables[clip] = params(job_dir / LAST)["encoder.0.self_attn.rel_k"].shape[-2]
    assert tables == {0: 1, 2: 5}


def test_non_finite_weights_are_never_saved(tmp_path, caplog):
    from nmt.checkpoints.checkpoint import save_training_state

    state = {"model": {"w": torch.ones(3), "steps": torch.tensor([2])}, "step": 7}
    assert save_training_state(state, tmp_path, keep_last=2, resumable=5)
    state = {"model": {"w": torch.tensor([1.0, float("nan")]), "steps": torch.tensor([2])}, "step": 8}
    assert not save_training_state(state, tmp_path, keep_last=2, resumable=7)
    assert load_checkpoint(tmp_path / LAST)["step"] == 7 and "update 8 not saved" in caplog.text


@pytest.mark.parametrize("position", ["t5", "alibi", "rope"])
def test_each_descendant_trains_validates_resumes_averages_and_translates(prepared, tmp_path, position):
    from nmt.config import SearchConfig
    from nmt.decoding.decode import load_translator, translate_lines
    from nmt.modes import Position

    def mode_job(out, steps):
        j = job(prepared, out, max_steps=steps, valid_every=2, valid_bleu_sentences=4, average_last=2)
        j.model = micro_config(position=Position(position), t5_buckets=8, t5_max_distance=16)
        return j

    run(mode_job(tmp_path / "straight", 4))
    run(mode_job(tmp_path / "resumed", 2))
    run(mode_job(tmp_path / "resumed", 4))
    a, b = params(tmp_path / "straight" / LAST), params(tmp_path / "resumed" / LAST)
    assert a.keys() == b.keys() and all(torch.equal(a[name], b[name]) for name in a)
    if position == "t5":
        assert not torch.equal(a["encoder_self_positions.table"], torch.zeros(2, 8))  # the bias learns
    model, vocab = load_translator(tmp_path / "straight" / "averaged.pt", torch.device("cpu"))
    assert model.cfg.position == Position(position)
    lines = ["A man rides a bike.", "", "Two dogs play in the snow."]
    out = translate_lines(model, vocab, lines, SearchConfig(beam=2, max_extra=5))
    assert len(out) == 3 and out[1] == ""


def test_deterministic_runs_with_torch_deterministic_algorithms_and_the_cublas_workspace(prepared, tmp_path):
    """train.deterministic=true turns on what CUDA needs for the same bits (here on a CPU: the switch, the log line
    and a run that completes under it; on a GPU an op without a deterministic kernel would be an error naming it)."""
    probe = ("import os, sys, torch; from nmt.runtime.process import setup_env; setup_env('cpu', 1, deterministic=True); "
             "print(torch.are_deterministic_algorithms_enabled(), os.environ['CUBLAS_WORKSPACE_CONFIG'])")
    switched = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert switched.stdout.split() == ["True", ":4096:8"], switched.stderr[-2000:]
    done = subprocess.run([sys.executable, "-m", "nmt.train", *data_overrides(prepared), *model_overrides(),
                           "train.max_steps=2", "train.max_tokens=800", "train.valid_every=0", "train.threads=1",
                           "train.deterministic=true", f"train.output_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "fp32 precision, deterministic algorithms;" in done.stderr, done.stderr[-3000:]


def test_the_dry_runs_estimate_before_a_run_changes_nothing_the_run_trains(prepared, tmp_path):
    """What `make demo` says first (nmt.train.estimated_seconds): a few updates timed on a Trainer of their own; the
    run after it trains the same weights as one never estimated, and the estimate writes no run folder."""
    from nmt.train import estimated_seconds

    run(job(prepared, tmp_path / "alone", max_steps=3))
    estimated = job(prepared, tmp_path / "estimated", max_steps=3)
    assert estimated_seconds(estimated) > 0 and not (tmp_path / "estimated").exists()
    run(estimated)
    alone, after = (load_checkpoint(tmp_path / name / LAST)["model"] for name in ("alone", "estimated"))
    assert alone.keys() == after.keys() and all(torch.equal(alone[k], after[k]) for k in alone)
