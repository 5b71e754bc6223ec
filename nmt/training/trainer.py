"""The Trainer: a run's state (model, optimizer, loss scaler, data position), one update (train_step) and the loop
around it (train: checkpoints, validation, signals, logging). Every rank builds one; nmt/train.py runs it."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from nmt.batch import effective_batch_line, effective_tokens, micro_batches
from nmt.checkpoints.averaging import averaging_note, checkpoints_to_average, write_average
from nmt.checkpoints.checkpoint import Checkpointer, global_data_position, numbered_checkpoints, rank_rng
from nmt.checkpoints.finetune import initial_weights
from nmt.checkpoints.folder_lock import announce_stopping
from nmt.checkpoints.resume import check_ranks_agree, check_same_run
from nmt.config import ModelConfig, TrainJob
from nmt.data.batching import Prefetcher, training_stream
from nmt.data.pipeline import open_prepared
from nmt.errors import EXIT_STOPPED
from nmt.kernels.dispatch import AttentionBackend
from nmt.modeling.transformer import Transformer, count_parameters, model_cases
from nmt.recorded_config import plain_job
from nmt.runtime.distributed import parallelize, sum_over_ranks
from nmt.runtime.precision import autocast_dtype
from nmt.runtime.process import Env
from nmt.runtime.rng import rng_state, set_rng_state
from nmt.runtime.signals import stop_signals
from nmt.training.best import BestCheckpoint
from nmt.training.loss import batch_loss
from nmt.training.metrics import Metrics, UpdateStats
from nmt.training.optim import SkipGuard, make_optimizer, set_learning_rate, skip_cause, step_optimizer
from nmt.training.validate import Validator

log = logging.getLogger("nmt.train")


class Trainer:
    """A run's state, one update (train_step) and the loop around it (train; see the module). Every rank builds one."""

    def __init__(self, job: TrainJob, env: Env):
        self.job, self.env, self.cfg, self.out = job, env, job.train, Path(job.train.output_dir)
        self.data = open_prepared(job.data)  # DataError when missing or damaged since prepare
        check_ranks_agree(env, self.data.directory, self.data.fingerprint())  # before any rank trains on it
        torch.manual_seed(self.cfg.seed)
        self.attention = AttentionBackend(self.cfg.attention, lazy=env.world_size == 1)  # DDP: checked at once, first
        self.model = Transformer(job.model, self.data.vocab_size, self.attention, self.cfg.checkpoint_activations)
        self.model.to(env.device)
        self.data_parallel, self.train_model = parallelize(self.model, env, self.cfg.compile)
        self.optimizer = make_optimizer(self.model, job.optim)
        self.amp_dtype = autocast_dtype(self.cfg.precision, env.device)
        self.scaler = torch.amp.GradScaler(env.device.type, enabled=self.amp_dtype == torch.float16)
        self.step, self.epoch, self.batch_index = 0, 0, 0  # updates done; the global data position after them
        self.update_freq = micro_batches(self.cfg, env.world_size)  # ConfigError: the recipe's batch is out of reach
        self.skips = SkipGuard(self.cfg.max_bad_updates)
        self.checkpoints = Checkpointer(env, self.out, self.cfg.keep_last)
        self.validate = Validator(self.data, job.data, self.cfg.max_tokens, self.cfg.valid_bleu_sentences,
                                  job.optim.label_smoothing, env, self.amp_dtype, self.cfg.loss_chunk_tokens)
        self.best = BestCheckpoint(env, self.out, self.cfg, partial(self.state_dict, saved_for="best"))
        self.metrics: Metrics | None = None  # opened by train(), at the update it starts from
        self.final_valid, self.final_started, self.stopped_by = None, 0.0, None  # final validation; stop signal
        self.start_time, self.earlier_seconds = time.monotonic(), 0.0  # this session, the sessions before it

    def state_dict(self, rng: list[dict] | None = None, saved_for: str = "cadence") -> dict:
        """The whole training state; rng: each rank's generator states (default: this one's); saved_for: "cadence",
        "end" (the last update), "best" or "signal" (a stop off the cadence, which nmt.average leaves out)."""
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "step": self.step, "epoch": self.epoch, "batch": self.batch_index,
            "rng": rng or [rng_state(self.env.device)], "world_size": self.env.world_size,
            "vocab": torch.frombuffer(bytearray(self.data.spm_model), dtype=torch.uint8),
            "data": self.data.identity, "best": self.best.state_dict(),
            "config": plain_job(self.job), "saved_for": saved_for, "train_seconds": self.train_seconds(),
        }

    def load_state_dict(self, state: dict) -> None:
        for part in ("model", "optimizer", "scaler"):
            getattr(self, part).load_state_dict(state[part])
        self.step, self.epoch, self.batch_index = state["step"], state["epoch"], global_data_position(state)
        self.earlier_seconds = state.get("train_seconds", 0.0)
        self.best.load_state_dict(state.get("best"))
        set_rng_state(rank_rng(state, self.env.rank, self.env.world_size), self.env.device)

    def train_seconds(self) -> float:
        """Wall-clock seconds of training so far, over every session of the run (resumes included)."""
        return self.earlier_seconds + time.monotonic() - self.start_time

    def next_micro_batches(self, stream) -> list:
        items = [next(stream) for _ in range(self.update_freq)]
        self.epoch, self.batch_index = items[-1][0], items[-1][1]
        return [batch for _, _, batch in items]

    def forward_loss(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Sums of the micro-batch's label-smoothed loss and NLL; model: self.model, or what training calls."""
        return batch_loss(model, self.model.output_weight, batch, self.job.optim.label_smoothing,
                          self.cfg.loss_chunk_tokens, self.env.device, self.amp_dtype)

    def train_step(self, batches: list, out_of_time: bool, signalled: bool = False,
                   save_due: bool = False) -> UpdateStats:
        """Accumulate over micro-batches (gradients normalized by all ranks' target tokens); one host read of the
        sums, gradient norm and stop flags; an update whose loss or gradient is not finite is skipped."""
        env = self.env
        local_tokens = sum(b.target_tokens for b in batches)  # counted on the host at collation
        # from pinned memory, asynchronously: a pageable copy would make the host wait for the device here
        tokens = torch.tensor(float(local_tokens), pin_memory=env.device.type == "cuda").to(env.device,
                                                                                             non_blocking=True)
        if env.world_size > 1:
            dist.all_reduce(tokens)  # stays on the device: only divides the loss
        batches = [b.to(env.device) for b in batches]
        lr = set_learning_rate(self.optimizer, self.step + 1, self.job.model.d_model, self.job.optim,
                               self.cfg.max_steps)
        self.model.train()
        loss_sum, nll_sum = torch.zeros((), device=env.device), torch.zeros((), device=env.device)
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or env.world_size == 1 else self.data_parallel.no_sync()
            with sync:
                loss, nll = self.forward_loss(self.train_model, batch)
                # DDP averages over ranks, so scale by world_size / global tokens for a per-token mean.
                self.scaler.scale(loss * (env.world_size / tokens)).backward()
            loss_sum += loss.detach()
            nll_sum += nll.detach()
        sums = sum_over_ranks(env, {"loss": loss_sum, "nll": nll_sum, "tokens": local_tokens,
                                    "out_of_time": out_of_time, "signalled": signalled, "save_due": save_due})
        self.scaler.unscale_(self.optimizer)
        clip = self.job.optim.clip_norm if self.job.optim.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        read = dict(zip([*sums, "grad_norm"], torch.stack([*sums.values(), grad_norm.float()]).tolist()))  # the sync
        stop = "signal" if read["signalled"] > 0 else "time" if read["out_of_time"] > 0 else None
        stats = UpdateStats(read["loss"] / read["tokens"], read["nll"] / read["tokens"], lr, read["grad_norm"],
                            int(read["tokens"]), stop, read["save_due"] > 0)
        cause = skip_cause(read["loss"], read["grad_norm"], self.scaler.is_enabled())
        step_optimizer(self.optimizer, self.scaler, cause is None)
        if self.skips.record(cause, self.step + 1, self.scaler):
            return replace(stats, skipped=True)
        self.step += 1
        return stats

    def train(self) -> str | None:
        """The updates, with checkpoints and validation; every rank takes part throughout. Returns what stopped the
        run early: "signal" (a complete checkpoint, every rank at one update), "time", "patience" or None."""
        cfg, env = self.cfg, self.env
        self.out.mkdir(parents=True, exist_ok=True)
        if (state := self.checkpoints.resume(cfg.save_every_steps)) is not None:
            batch = effective_tokens(env.world_size, cfg.max_tokens, self.update_freq)
            check_same_run(state, plain_job(self.job), self.data, batch, self.out)
            self.load_state_dict(state)
        elif cfg.init_from is not None:
            self.model.load_state_dict(initial_weights(cfg.init_from, plain_job(self.job)["model"], self.data))
        if env.main:  # after the check: a refused run leaves the folder's record of its own run alone
            (self.out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(self.job)))
        check_attention(self.attention, self.job.model, self.amp_dtype, env.device)
        self.metrics = Metrics(self.out, env.main, cfg.max_steps, self.step)
        log.info("%s", setup_line(env, self.amp_dtype, self.train_model is not self.data_parallel, self.model))
        log.info("%s", effective_batch_line(env.world_size, cfg.max_tokens, self.update_freq, cfg.tokens_per_update))
        stream = Prefetcher(training_stream(self.data.train, cfg.max_tokens, cfg.seed, env.rank, env.world_size,
                                            self.epoch, self.batch_index),
                            depth=2 * self.update_freq, pin_memory=env.device.type == "cuda")
        self.start_time = last_save = time.monotonic()
        with stop_signals(env.main, on_stop=announce_stopping) as signals, contextlib.closing(stream), \
                contextlib.closing(self.metrics):  # the bar closed however the loop ends (a second Ctrl-C too)
            stop = self.best.resumed(self.step, lambda: self.validate(self.model), self.metrics)
            while self.step < cfg.max_steps and stop is None:
                out_of_time = cfg.max_minutes > 0 and time.monotonic() - self.start_time > cfg.max_minutes * 60
                due = cfg.save_every_minutes > 0 and time.monotonic() - last_save > cfg.save_every_minutes * 60
                stats = self.train_step(self.next_micro_batches(stream), out_of_time, signals["received"] is not None,
                                        due)
                stop = stats.stop
                if stats.skipped:
                    continue
                self.metrics.update(self.step, stats.scalars(), self.step % cfg.log_every == 0 or self.step == 1)
                stop = stop or self.best.validation(self.step, lambda: self.validate(self.model), self.metrics)
                on_cadence = self.step % cfg.save_every_steps == 0 or stats.save_due
                if on_cadence or stop:
                    saved_for = "cadence" if on_cadence else "signal" if stop == "signal" else "end"
                    self.checkpoints.save(partial(self.state_dict, saved_for=saved_for), self.step,
                                          final=stop is not None)
                    last_save = time.monotonic()
        if self.checkpoints.saved_step != self.step:
            self.checkpoints.save(partial(self.state_dict, saved_for="end"), self.step, final=True)
        if stop != "signal" and self.best.validated != self.step:
            self.final_started = time.monotonic()
            log.info("final validation at update %d: loss on the validation set, then greedy BLEU on %d sentences",
                     self.step, cfg.valid_bleu_sentences)
            self.final_valid = self.validate.loss(self.model)
        self.stopped_by = signals["received"]
        log_stop(stop, self.stopped_by, self.step, self.out, cfg.max_minutes)
        return stop

    def finish(self) -> None:
        """Rank 0 alone, after the process group is gone: its BLEU and average cannot trip a collective timeout."""
        if self.final_valid is not None:
            self.metrics.log("valid", self.step, {**self.final_valid, **self.validate.bleu(self.model)})
            log.info("final validation took %.1f s", time.monotonic() - self.final_started)
        if self.cfg.average_last > 0 and numbered_checkpoints(self.out):  # none left: averaged.pt stays as it is
            average_last(self.out, self.cfg.average_last)
        log_done(self.step, self.train_seconds(), time.monotonic() - self.start_time, self.earlier_seconds > 0)


def check_attention(attention: AttentionBackend, model: ModelConfig, amp_dtype: torch.dtype | None,
                    device: torch.device) -> None:
    """The fused kernel's self-test on every case the model can meet in training, before torch.compile
    (nmt/kernels/dispatch.py): a case that fails runs the PyTorch path."""
    attention.check(model_cases(model, amp_dtype or torch.float32, device, training=True), device)


def setup_line(env: Env, amp_dtype: torch.dtype | None, compiled: bool, model: torch.nn.Module) -> str:
    return (f"world size {env.world_size} on {env.device}, {amp_dtype or 'fp32'} precision"
            f"{', torch.compile' if compiled else ''}"
            f"{', deterministic algorithms' if torch.are_deterministic_algorithms_enabled() else ''}; "
            f"{count_parameters(model):,} parameters")


def log_stop(stop: str | None, received: str | None, step: int, out: Path, max_minutes: float) -> None:
    """What ended the run early, if anything, and what to do next."""
    if stop == "signal":
        log.warning("stopped by %s at update %d with a complete checkpoint in %s: run the same command again to "
                    "continue (exit code %d)", received or "a signal on another rank", step, out, EXIT_STOPPED)
    elif stop == "time":
        log.info("train.max_minutes=%g reached at update %d", max_minutes, step)


def average_last(out: Path, last: int) -> None:
    """train.average_last: the newest `last` regular checkpoints of `out` into out/averaged.pt."""
    paths, left_out = checkpoints_to_average(out, last)
    log.info("%s", averaging_note(paths, left_out, write_average(paths, out / "averaged.pt")))


def log_done(step: int, train_seconds: float, session_seconds: float, resumed: bool) -> None:
    log.info("done: %d updates in %.1f minutes of training%s", step, train_seconds / 60,
             f" ({session_seconds / 60:.1f} in this session)" if resumed else "")
