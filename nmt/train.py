"""python -m nmt.train model=<preset> data=<preset> [...]: the training loop.

Runs as one process, or under torchrun as DDP (NCCL on CUDA, gloo on CPU). Re-running the same
command resumes from output_dir/checkpoint_last.pt exactly where it stopped; SIGTERM or SIGUSR1 stop it
cleanly (exit code 75) with a complete checkpoint.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import math
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch.nn.parallel import DistributedDataParallel

from nmt.checkpoint import (CheckpointError, latest_usable, numbered_checkpoints, rank_rng, save_training_state,
                            write_average)
from nmt.config import ConfigError, TrainJob, register_schemas
from nmt.data.batching import Prefetcher, training_stream
from nmt.data.pipeline import load_manifest, open_split, prepare, prepared_dir
from nmt.data.readers import DataError
from nmt.kernels.dispatch import AttentionBackend, model_cases
from nmt.loss import smoothed_loss
from nmt.metrics import Metrics
from nmt.model import Transformer, count_parameters
from nmt.optim import learning_rate, make_optimizer
from nmt.runtime import (Env, all_gather, autocast, autocast_dtype, broadcast_flag, rng_state, set_rng_state,
                         setup_env, setup_logging, stop_signals)
from nmt.validate import Validator

log = logging.getLogger("nmt.train")


@dataclass
class UpdateStats:
    """What one update reports, read from the device once (per-token means over all ranks)."""

    loss: float
    nll: float
    lr: float
    grad_norm: float
    tokens: int
    stop: str | None  # "signal": some rank got SIGTERM/SIGUSR1; "time": some rank ran out of train.max_minutes
    save_due: bool = False  # some rank's train.save_every_minutes ran out (every rank saves together)
    skipped: bool = False  # non-finite loss, or an fp16 overflow: the step counter did not move

    def scalars(self) -> dict:
        return {"loss": self.loss, "nll": self.nll, "ppl": math.exp(min(self.nll, 50)), "lr": self.lr,
                "grad_norm": self.grad_norm, "tokens": self.tokens}


class Trainer:
    def __init__(self, job: TrainJob, env: Env):
        self.job, self.env, self.cfg = job, env, job.train
        self.out = Path(self.cfg.output_dir)
        self.data_dir = data_dir = prepared_dir(job.data)
        manifest = load_manifest(data_dir)
        if manifest is None:
            raise DataError(f"{data_dir} is not prepared: run python -m nmt.prepare data=<preset> first")
        self.train_data = open_split(data_dir, manifest, "train")  # DataError if damaged since prepare
        self.valid_data = open_split(data_dir, manifest, "valid")
        if not (data_dir / "spm.model").is_file():
            raise DataError(f"{data_dir / 'spm.model'} is missing: rebuild with python -m nmt.prepare ... force=true")
        self.spm_model = (data_dir / "spm.model").read_bytes()  # checkpoints carry their vocabulary
        torch.manual_seed(self.cfg.seed)
        self.attention = AttentionBackend(self.cfg.attention)
        self.attention.lazy = env.world_size == 1  # under DDP only the cases checked together, before training
        self.model = Transformer(job.model, manifest["vocab_size"], self.attention).to(env.device)
        self.data_parallel = DistributedDataParallel(self.model) if env.world_size > 1 else self.model
        # Compiled for training only (checkpoints come from self.model: plain keys, no "_orig_mod."); batch
        # shapes change every step, so the graph is traced with dynamic shapes once, not once per shape.
        compile_model = self.cfg.compile if self.cfg.compile is not None else env.device.type == "cuda"
        self.train_model = torch.compile(self.data_parallel, dynamic=True) if compile_model else self.data_parallel
        self.optimizer = make_optimizer(self.model.parameters(), job.optim)
        self.amp_dtype = autocast_dtype(self.cfg.precision, env.device)
        self.scaler = torch.amp.GradScaler(env.device.type, enabled=self.amp_dtype == torch.float16)
        self.step, self.epoch, self.batch_index = 0, 0, 0  # updates done; the data position after them
        self.bad_updates, self.saved_step = 0, -1
        self.validate = Validator(self.valid_data, data_dir, job.data, self.spm_model, self.cfg.max_tokens,
                                  self.cfg.valid_bleu_sentences, job.optim.label_smoothing, env, self.amp_dtype)
        self.final_valid: dict | None = None  # the last validation loss, logged with its BLEU by finish()

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self, rng: list[dict] | None = None) -> dict:
        """The whole training state; rng: every rank's generator states, by rank (default: this process's)."""
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "step": self.step, "epoch": self.epoch, "batch": self.batch_index,
            "rng": rng or [rng_state(self.env.device)], "world_size": self.env.world_size,
            "vocab": torch.frombuffer(bytearray(self.spm_model), dtype=torch.uint8),
            "config": OmegaConf.to_container(OmegaConf.structured(self.job), resolve=True, enum_to_str=True),
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], state["batch"]
        if state["world_size"] != self.env.world_size:
            log.warning("resuming a %d-process run on %d processes: the data order changes from here",
                        state["world_size"], self.env.world_size)
        set_rng_state(rank_rng(state, self.env.rank, self.env.world_size), self.env.device)

    def resume(self) -> None:
        found = latest_usable(self.out)
        if found is not None:
            self.load_state_dict(found[1])
            self.saved_step = self.step
            log.info("resumed from %s at update %d (epoch %d, batch %d)", found[0], self.step, self.epoch,
                     self.batch_index)

    def save(self, final: bool = False) -> None:
        """Every rank takes part (its generator states go into the checkpoint); rank 0 writes, and every rank
        learns whether it could: a failed write is retried at the next save (at the end at the latest), and a
        failed final one ends every rank with CheckpointError."""
        rng = all_gather(self.env, rng_state(self.env.device))
        written = True
        if self.env.main:
            written = save_training_state(self.state_dict(rng), self.out, self.cfg.keep_last, self.saved_step)
        if self.env.world_size > 1:
            written = bool(broadcast_flag(self.env, written))
        if written:
            self.saved_step = self.step
        elif final:
            raise CheckpointError(f"could not save update {self.step} in {self.out}; the earlier checkpoints are "
                                  f"intact (resumable from update {max(self.saved_step, 0)})")

    def check_attention(self) -> None:
        """Self-test the fused kernel on every case this model can meet, before torch.compile traces: it then
        serves only the cases that passed on every rank (nmt/kernels/dispatch.py)."""
        cases = model_cases(self.job.model, self.amp_dtype or torch.float32, self.env.device, training=True)
        self.attention.check(cases, self.env.device)

    # -- one update ----------------------------------------------------------------------------
    def next_micro_batches(self, stream) -> list:
        items = [next(stream) for _ in range(self.cfg.update_freq)]
        self.epoch, self.batch_index = items[-1][0], items[-1][1]
        return [batch for _, _, batch in items]

    def forward_loss(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.env.device, self.amp_dtype):
            logits = model(batch.src, batch.tgt_in)
        return smoothed_loss(logits, batch.tgt_out, self.job.optim.label_smoothing)

    def train_step(self, batches: list, out_of_time: bool, signalled: bool = False,
                   save_due: bool = False) -> UpdateStats:
        """Accumulate over micro-batches; gradients end up normalized by the target tokens of all ranks.

        The host waits for the device once: the loss sums, the gradient norm and the stop flags come back
        in one read after the backward passes, and decide whether the optimizer steps.
        """
        env = self.env
        local_tokens = sum(b.target_tokens for b in batches)  # counted on the host at collation
        tokens = torch.tensor(float(local_tokens), device=env.device)
        if env.world_size > 1:
            dist.all_reduce(tokens)  # stays on the device: only divides the loss
        batches = [b.to(env.device) for b in batches]
        lr = learning_rate(self.step + 1, self.job.model.d_model, self.job.optim, self.cfg.max_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.train()
        sums = torch.zeros(6, device=env.device)  # loss, nll, local tokens, out of time, signalled, save due
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or env.world_size == 1 else self.data_parallel.no_sync()
            with sync:
                loss, nll = self.forward_loss(self.train_model, batch)
                # DDP averages over ranks, so scale by world_size / global tokens for a per-token mean.
                self.scaler.scale(loss * (env.world_size / tokens)).backward()
            sums[0] += loss.detach()
            sums[1] += nll.detach()
        sums[2], sums[3], sums[4], sums[5] = local_tokens, float(out_of_time), float(signalled), float(save_due)
        if env.world_size > 1:
            dist.all_reduce(sums)
        self.scaler.unscale_(self.optimizer)
        clip = self.job.optim.clip_norm if self.job.optim.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        read = torch.cat([sums, grad_norm.float()[None]]).tolist()  # the one host sync of the update
        loss_sum, nll_sum, all_tokens, late, signal, due, grad_norm = read
        stop = "signal" if signal > 0 else "time" if late > 0 else None
        stats = UpdateStats(loss_sum / all_tokens, nll_sum / all_tokens, lr, grad_norm, int(all_tokens), stop, due > 0)
        if not math.isfinite(loss_sum):
            self.bad_updates += 1
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()
            log.warning("non-finite loss at update %d: update skipped (%d in a row)", self.step + 1, self.bad_updates)
            if self.bad_updates >= self.cfg.max_bad_updates:
                raise FloatingPointError(f"{self.bad_updates} non-finite losses in a row at update {self.step + 1}; "
                                         f"lower optim.lr_scale, raise optim.warmup, or use train.precision=fp32")
            return replace(stats, skipped=True)
        self.bad_updates = 0
        overflow = self.scaler.is_enabled() and not math.isfinite(grad_norm)
        self.scaler.step(self.optimizer)  # with fp16, skipped when a gradient overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if overflow:
            log.info("fp16 gradient overflow at update %d: loss scale lowered to %g; its micro-batches were "
                     "dropped (the update is not counted)", self.step + 1, self.scaler.get_scale())
            return replace(stats, skipped=True)
        self.step += 1
        return stats

    # -- the loop ------------------------------------------------------------------------------
    def train(self) -> str:
        """The updates, with checkpoints and validation on the way; every rank takes part throughout. Returns
        "done", or "signal" when SIGTERM/SIGUSR1 stopped it (after a complete checkpoint, on every rank at the
        same update). What only rank 0 does at the end (averaging) is left to finish(), outside the group."""
        cfg, env = self.cfg, self.env
        self.out.mkdir(parents=True, exist_ok=True)
        if env.main:
            (self.out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(self.job)))
        self.resume()
        self.check_attention()
        self.metrics = Metrics(self.out, env.main, cfg.max_steps, self.step)
        log.info("world size %d on %s, %s precision%s; %s parameters; effective batch <= %d tokens per update",
                 env.world_size, env.device, self.amp_dtype or "fp32",
                 ", torch.compile" if self.train_model is not self.data_parallel else "",
                 f"{count_parameters(self.model):,}", cfg.max_tokens * cfg.update_freq * env.world_size)
        stream = Prefetcher(training_stream(self.train_data, cfg.max_tokens, cfg.seed, env.rank, env.world_size,
                                            self.epoch, self.batch_index),
                            depth=2 * cfg.update_freq, pin_memory=env.device.type == "cuda")
        self.start_time = last_save = time.monotonic()
        validated, stats = -1, None
        with stop_signals() as signals, contextlib.closing(stream):
            while self.step < cfg.max_steps:
                out_of_time = cfg.max_minutes > 0 and time.monotonic() - self.start_time > cfg.max_minutes * 60
                due = cfg.save_every_minutes > 0 and time.monotonic() - last_save > cfg.save_every_minutes * 60
                stats = self.train_step(self.next_micro_batches(stream), out_of_time, signals["received"] is not None,
                                        due)
                if stats.skipped:
                    if stats.stop:
                        break
                    continue
                self.metrics.update(self.step, stats.scalars(), self.step % cfg.log_every == 0 or self.step == 1)
                if cfg.valid_every and self.step % cfg.valid_every == 0 and not stats.stop:
                    self.metrics.log("valid", self.step, self.validate(self.model))
                    validated = self.step
                if self.step % cfg.save_every_steps == 0 or stats.save_due or stats.stop:
                    self.save(final=stats.stop is not None)
                    last_save = time.monotonic()
                if stats.stop:
                    break
        self.metrics.close()
        stop = stats.stop if stats is not None else None
        if self.saved_step != self.step:
            self.save(final=True)
        if stop == "signal":
            log.warning("stopped by %s at update %d with a complete checkpoint in %s: run the same command again to "
                        "continue (exit code %d)", signals["received"] or "a signal on another rank", self.step,
                        self.out, EXIT_STOPPED)
            return "signal"
        if stop == "time":
            log.info("train.max_minutes=%g reached at update %d", cfg.max_minutes, self.step)
        if validated != self.step:
            self.final_valid = self.validate.loss(self.model)
        return "done"

    def finish(self) -> None:
        """Rank 0 alone, after the process group is gone: the last validation BLEU and the checkpoint average
        (20 big checkpoints on a slow file system) cannot trip a collective timeout on the other ranks."""
        if self.final_valid is not None:
            self.metrics.log("valid", self.step, {**self.final_valid, **self.validate.bleu(self.model)})
        if self.cfg.average_last > 0:
            paths = numbered_checkpoints(self.out)[-self.cfg.average_last:]
            log.info("averaged %d checkpoints into %s", len(paths), write_average(paths, self.out / "averaged.pt"))
        log.info("done: %d updates in %.1f minutes", self.step, (time.monotonic() - self.start_time) / 60)


class TrainingStopped(Exception):
    """SIGTERM or SIGUSR1 ended the run after a complete checkpoint; the same command continues it."""


# What nmt.train exits with: 0 done; 2 bad input, config or checkpoint (one line, no traceback); EXIT_STOPPED
# stopped by SIGTERM/SIGUSR1 with a complete checkpoint saved (EX_TEMPFAIL: run the same command again).
EXIT_STOPPED = 75


def run(job: TrainJob) -> Path:
    """Prepare (rank 0), train (every rank), then average (rank 0, after the process group is gone).
    Raises TrainingStopped when a signal ended the run early."""
    job.check()
    env = setup_env(job.train.device, job.train.threads)
    setup_logging(Path(job.train.output_dir), env.main)
    try:
        if env.world_size > 1:  # the others wait for rank 0's prepare (hours on a first WMT14 run) without timing out
            patient = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1))
        if env.main:
            prepare(job.data)  # a no-op when the prepared data is up to date
        if env.world_size > 1:
            dist.barrier(group=patient)
        trainer = Trainer(job, env)
        status = trainer.train()
    finally:
        if env.world_size > 1:
            dist.destroy_process_group()
    if status == "signal":
        raise TrainingStopped(f"stopped at update {trainer.step}")
    if env.main:
        trainer.finish()
    return Path(job.train.output_dir)


register_schemas()


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg) -> None:
    job: TrainJob = OmegaConf.to_object(cfg)
    try:
        job.check()
    except ConfigError as err:  # before logging is set up: straight to stderr
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        run(job)
    except TrainingStopped:
        sys.exit(EXIT_STOPPED)
    except (ConfigError, DataError, CheckpointError, FloatingPointError) as err:
        log.error("%s", err)
        sys.exit(2)


if __name__ == "__main__":
    main()
