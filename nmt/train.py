"""python -m nmt.train model=<preset> data=<preset> [...]: the training loop.

Runs as one process, or under torchrun as DDP (NCCL on CUDA, gloo on CPU). Re-running the same
command resumes from output_dir/checkpoint_last.pt exactly where it stopped.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

import hydra
import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from sacrebleu.metrics import BLEU
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from nmt.checkpoint import CheckpointError, latest_usable, numbered_checkpoints, save_numbered, write_average
from nmt.config import ConfigError, OptimConfig, Precision, Schedule, TrainConfig, TrainJob, register_schemas
from nmt.data.batching import Prefetcher, epoch_batches
from nmt.data.pipeline import load_manifest, open_split, prepare, prepared_dir
from nmt.data.readers import DataError, read_lines
from nmt.data.vocab import Vocab
from nmt.kernels.dispatch import AttentionBackend, model_cases
from nmt.model import PAD, Transformer, count_parameters
from nmt.translate import translate_lines

log = logging.getLogger("nmt.train")


def inverse_sqrt_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Vaswani et al. 2017, Eq. 3: linear warmup, then decay with the inverse square root of the step."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def linear_decay_lr(step: int, d_model: int, warmup: int, total: int, scale: float = 1.0) -> float:
    """Linear warmup to the peak inverse_sqrt_lr reaches at `warmup`, then linear decay to 0 at `total`.

    For short, update-budgeted runs (the demo, the small-scale tables): the learning rate spends the
    budget instead of stopping mid-decay, which measured better on Multi30k's validation set.
    """
    step = max(step, 1)
    peak = scale * d_model**-0.5 * warmup**-0.5
    if step <= warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(total - warmup, 1))


def learning_rate(step: int, d_model: int, optim: OptimConfig, total: int) -> float:
    if optim.schedule == Schedule.linear:
        return linear_decay_lr(step, d_model, optim.warmup, total, optim.lr_scale)
    return inverse_sqrt_lr(step, d_model, optim.warmup, optim.lr_scale)


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over non-pad tokens of the label-smoothed loss and of the plain NLL (in float32)."""
    log_probs = logits.float().log_softmax(-1)
    keep = target.ne(PAD)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    uniform = -log_probs.mean(-1)  # epsilon spread evenly over the vocabulary, as F.cross_entropy
    loss = (1.0 - epsilon) * nll + epsilon * uniform
    return loss[keep].sum(), nll[keep].sum()


@dataclass
class Env:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def retain_freed_memory() -> None:
    """Keep freed CPU tensors in the heap instead of returning them to the OS at every step.

    glibc hands blocks over its mmap threshold back with munmap, so every step's activations are
    page-faulted in and zeroed anew: on the 2-core machine a third of the time went to the kernel and
    a tiny update took 1.1 s instead of 0.73 s (same losses). No-op off glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: blocks up to 1 GiB come from the heap
        libc.mallopt(-1, (1 << 31) - 1)  # M_TRIM_THRESHOLD: never shrink the heap mid-run
    except (OSError, AttributeError):
        pass


def setup_env(cfg: TrainConfig) -> Env:
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    want_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda", local_rank) if want_cuda else torch.device("cpu")
    if want_cuda:
        torch.cuda.set_device(device)
    else:
        retain_freed_memory()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(cfg.threads or max(1, (os.cpu_count() or 1) // local))
    if world_size > 1:
        dist.init_process_group("nccl" if want_cuda else "gloo", device_id=device if want_cuda else None)
    return Env(rank, world_size, device)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision around forward and loss (a no-op context for fp32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def autocast_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    if precision == Precision.fp32 or (precision == Precision.auto and device.type == "cpu"):
        return None
    if precision == Precision.fp16 or (precision == Precision.auto and not torch.cuda.is_bf16_supported()):
        return torch.float16
    return torch.bfloat16


@dataclass
class UpdateStats:
    """What one update reports, read from the device once (per-token means over all ranks)."""

    loss: float
    nll: float
    lr: float
    grad_norm: float
    tokens: int
    stop: str | None  # "signal": some rank got SIGTERM/SIGUSR1; "time": some rank ran out of train.max_minutes
    skipped: bool = False  # non-finite loss, or an fp16 overflow: the step counter did not move

    def scalars(self) -> dict:
        return {"loss": self.loss, "nll": self.nll, "ppl": math.exp(min(self.nll, 50)), "lr": self.lr,
                "grad_norm": self.grad_norm, "tokens": self.tokens}


class Trainer:
    def __init__(self, job: TrainJob, env: Env):
        self.job, self.env, self.cfg = job, env, job.train
        self.out = Path(self.cfg.output_dir)
        data_dir = prepared_dir(job.data)
        manifest = load_manifest(data_dir)
        if manifest is None:
            raise DataError(f"{data_dir} is not prepared: run python -m nmt.prepare data=<preset> first")
        self.vocab_size = manifest["vocab_size"]
        self.data_dir = data_dir  # validation BLEU reads its raw sentences
        self.spm_model = (data_dir / "spm.model").read_bytes()  # checkpoints carry their vocabulary
        self.train_data = open_split(data_dir, manifest, "train")  # DataError if damaged since prepare
        self.valid_data = open_split(data_dir, manifest, "valid")
        torch.manual_seed(self.cfg.seed)
        self.attention = AttentionBackend(self.cfg.attention)
        self.attention.lazy = env.world_size == 1  # under DDP only the cases checked together below
        self.model = Transformer(job.model, self.vocab_size, self.attention).to(env.device)
        self.data_parallel = DistributedDataParallel(self.model) if env.world_size > 1 else self.model
        # Compiled for training only (checkpoints come from self.model: plain keys, no "_orig_mod."); batch
        # shapes change every step, so the graph is traced with dynamic shapes once, not once per shape.
        compile_model = self.cfg.compile if self.cfg.compile is not None else env.device.type == "cuda"
        self.train_model = torch.compile(self.data_parallel, dynamic=True) if compile_model else self.data_parallel
        o: OptimConfig = job.optim
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=0.0, betas=(o.beta1, o.beta2), eps=o.eps)
        self.amp_dtype = autocast_dtype(self.cfg.precision, env.device)
        self.scaler = torch.amp.GradScaler(env.device.type, enabled=self.amp_dtype == torch.float16)
        self.step, self.epoch, self.batch_index = 0, 0, 0
        self.bad_updates = 0
        self.saved_step = -1
        self.writer = None
        self.final_valid: dict | None = None  # the last validation loss, logged with its BLEU by finish()
        self.start_time = time.monotonic()

    # -- state ---------------------------------------------------------------------------------
    def rng_state(self) -> dict:
        rng = {"torch": torch.get_rng_state()}
        if self.env.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.env.device)
        return rng

    def state_dict(self, rng: list[dict] | None = None) -> dict:
        """The whole training state; rng: every rank's generator states, by rank (default: this process's)."""
        return {
            "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(), "step": self.step, "epoch": self.epoch, "batch": self.batch_index,
            "rng": rng or [self.rng_state()], "world_size": self.env.world_size,
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
        rng = state["rng"]
        if isinstance(rng, list):  # one entry per rank: each rank continues its own dropout streams
            rng = rng[self.env.rank] if len(rng) == self.env.world_size else rng[0]
        torch.set_rng_state(rng["torch"])
        if "cuda" in rng and self.env.device.type == "cuda":
            torch.cuda.set_rng_state(rng["cuda"], self.env.device)

    def resume(self) -> None:
        found = latest_usable(self.out)
        if found is None:
            return
        path, state = found
        self.load_state_dict(state)
        self.saved_step = self.step
        log.info("resumed from %s at update %d (epoch %d, batch %d)", path, self.step, self.epoch, self.batch_index)

    def save(self, final: bool = False) -> None:
        """Every rank takes part (its generator states go into the checkpoint); rank 0 writes. A failed write
        (a full disk) leaves every earlier checkpoint as it was: one error line, and training goes on to the next
        save; the final save raises instead."""
        rng = [self.rng_state()]
        if self.env.world_size > 1:
            rng = [None] * self.env.world_size
            dist.all_gather_object(rng, self.rng_state())
        resumable = self.saved_step
        self.saved_step = self.step  # on every rank alike, whatever the write does: the ranks' paths never part
        if self.env.main:
            try:
                path = save_numbered(self.state_dict(rng), self.out, self.step, self.cfg.keep_last)
            except OSError as err:
                message = (f"could not save update {self.step} in {self.out} ({err.strerror or err}); the earlier "
                           f"checkpoints are intact (resumable from update {max(resumable, 0)})")
                if final:
                    raise CheckpointError(message) from None
                log.error("%s; training goes on and tries again at the next save", message)
                return
            log.info("saved %s", path)

    def check_attention(self) -> None:
        """Self-test the fused kernel on every case this model can meet, before torch.compile traces: it then
        serves only the cases that passed on every rank (nmt/kernels/dispatch.py)."""
        cases = model_cases(self.job.model, self.amp_dtype or torch.float32, self.env.device, training=True)
        self.attention.check(cases, self.env.device)

    # -- data ----------------------------------------------------------------------------------
    def micro_batches(self):
        """Endless stream of (epoch, position after it, batch) for this rank, from the saved data position.

        It runs ahead in a background thread, so the trainer sets its data position (self.epoch,
        self.batch_index) from the items it has consumed, never from how far the stream has read."""
        epoch, start = self.epoch, self.batch_index
        while True:
            batches = epoch_batches(self.train_data, self.cfg.max_tokens, self.cfg.seed, epoch,
                                    self.env.rank, self.env.world_size, start=start)
            for position, batch in batches:
                yield epoch, position + 1, batch
            epoch, start = epoch + 1, 0

    def next_micro_batches(self, stream) -> list:
        items = [next(stream) for _ in range(self.cfg.update_freq)]
        self.epoch, self.batch_index = items[-1][0], items[-1][1]
        return [batch for _, _, batch in items]

    # -- one update ----------------------------------------------------------------------------
    def autocast(self):
        return autocast(self.env.device, self.amp_dtype)

    def forward_loss(self, model, batch) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            logits = model(batch.src, batch.tgt_in)
        return smoothed_loss(logits, batch.tgt_out, self.job.optim.label_smoothing)

    def update(self, batches: list, out_of_time: bool, signalled: bool = False) -> UpdateStats:
        """Accumulate over micro-batches; gradients end up normalized by the target tokens of all ranks.

        The host waits for the device once: the loss sums, the gradient norm and the stop flag come back
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
        sums = torch.zeros(5, device=env.device)  # loss, nll, local tokens, out of time, signalled
        for i, batch in enumerate(batches):
            last = i == len(batches) - 1
            sync = contextlib.nullcontext() if last or env.world_size == 1 else self.data_parallel.no_sync()
            with sync:
                loss, nll = self.forward_loss(self.train_model, batch)
                # DDP averages over ranks, so scale by world_size / global tokens for a per-token mean.
                self.scaler.scale(loss * (env.world_size / tokens)).backward()
            sums[0] += loss.detach()
            sums[1] += nll.detach()
        sums[2], sums[3], sums[4] = local_tokens, float(out_of_time), float(signalled)
        if env.world_size > 1:
            dist.all_reduce(sums)
        self.scaler.unscale_(self.optimizer)
        clip = self.job.optim.clip_norm if self.job.optim.clip_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        loss_sum, nll_sum, all_tokens, late, signal, grad_norm = torch.cat([sums, grad_norm.float()[None]]).tolist()
        stop = "signal" if signal > 0 else "time" if late > 0 else None
        stats = UpdateStats(loss_sum / all_tokens, nll_sum / all_tokens, lr, grad_norm, int(all_tokens), stop)
        overflow = self.scaler.is_enabled() and not math.isfinite(grad_norm)
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
        self.scaler.step(self.optimizer)  # with fp16, skipped when a gradient overflowed
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if overflow:
            log.info("fp16 gradient overflow at update %d: loss scale lowered to %g; its micro-batches were "
                     "dropped (the update is not counted)", self.step + 1, self.scaler.get_scale())
            return replace(stats, skipped=True)
        self.step += 1
        return stats

    # -- validation ----------------------------------------------------------------------------
    def validate(self) -> dict:
        """Validation loss (every rank) and greedy BLEU (rank 0, while the others wait at the next collective:
        a few seconds for valid_bleu_sentences, with the decoding bounded per line)."""
        stats = self.validation_loss()
        if self.env.main and self.cfg.valid_bleu_sentences > 0:
            stats["bleu_greedy"] = self.valid_bleu(self.cfg.valid_bleu_sentences)
        return stats

    @torch.no_grad()
    def validation_loss(self) -> dict:
        self.model.eval()
        sums = torch.zeros(3, dtype=torch.float64, device=self.env.device)  # loss, nll, tokens
        for _, batch in epoch_batches(self.valid_data, self.cfg.max_tokens, 0, 0, self.env.rank, self.env.world_size):
            loss, nll = self.forward_loss(self.model, batch.to(self.env.device))
            sums += torch.stack([loss.double(), nll.double(), loss.new_tensor(batch.target_tokens, dtype=torch.float64)])
        if self.env.world_size > 1:
            dist.all_reduce(sums)
        loss_sum, nll_sum, tokens = sums.tolist()
        return {"loss": loss_sum / tokens, "nll": nll_sum / tokens, "ppl": math.exp(min(nll_sum / tokens, 50))}

    def valid_bleu(self, sentences: int) -> float:
        """sacreBLEU of greedy translations of the first validation sentences (a progress signal only)."""
        data = self.job.data
        sources = list(read_lines(self.data_dir / f"valid.{data.src}"))[:sentences]
        refs = list(read_lines(self.data_dir / f"valid.{data.tgt}"))[:sentences]
        vocab = Vocab(model_proto=self.spm_model)
        with self.autocast():
            hyps = translate_lines(self.model, vocab, sources, beam=1, device=self.env.device)
        return BLEU().corpus_score(hyps, [refs]).score

    # -- the loop ------------------------------------------------------------------------------
    def train(self) -> str:
        """The updates, with checkpoints and validation on the way; every rank takes part throughout. Returns
        "done", or "signal" when SIGTERM/SIGUSR1 stopped it (after a complete checkpoint, on every rank at the
        same update). What only rank 0 does at the end (averaging) is left to finish(), outside the group."""
        self.out.mkdir(parents=True, exist_ok=True)
        if self.env.main:
            (self.out / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.structured(self.job)))
        self.resume()
        cfg, env = self.cfg, self.env
        self.check_attention()
        if env.main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.out / "tensorboard"))
        log.info("world size %d on %s, %s precision%s; %s parameters; effective batch <= %d tokens per update",
                 env.world_size, env.device, self.amp_dtype or "fp32",
                 ", torch.compile" if self.train_model is not self.data_parallel else "",
                 f"{count_parameters(self.model):,}", cfg.max_tokens * cfg.update_freq * env.world_size)
        stream = Prefetcher(self.micro_batches(), depth=2 * cfg.update_freq, pin_memory=env.device.type == "cuda")
        self.start_time = time.monotonic()
        try:
            with stop_signals() as signals:
                stopped, validated = self.run_updates(stream, signals)
        finally:
            stream.close()
        if self.saved_step != self.step:
            self.save(final=True)
        if stopped == "signal":
            return "signal"
        if validated != self.step:
            self.final_valid = self.validation_loss()
        return "done"

    def finish(self) -> None:
        """Rank 0 alone, after the process group is gone: the last validation BLEU and the checkpoint average
        (20 big checkpoints on a slow file system) cannot trip a collective timeout on the other ranks."""
        cfg = self.cfg
        if self.final_valid is not None:
            if cfg.valid_bleu_sentences > 0:
                self.final_valid["bleu_greedy"] = self.valid_bleu(cfg.valid_bleu_sentences)
            self.log_scalars("valid", self.final_valid)
        if cfg.average_last > 0:
            paths = numbered_checkpoints(self.out)[-cfg.average_last:]
            log.info("averaged %d checkpoints into %s", len(paths), write_average(paths, self.out / "averaged.pt"))
        log.info("done: %d updates in %.1f minutes", self.step, (time.monotonic() - self.start_time) / 60)

    def run_updates(self, stream, signals: dict) -> tuple[str | None, int]:
        """Updates until train.max_steps, train.max_minutes or a stop signal; logs, validates and saves on the way.
        Returns why it stopped early (None, "time" or "signal") and the update at which validation last ran."""
        cfg = self.cfg
        start = last_save = last_log = time.monotonic()
        tokens_since_log, validated = 0, -1
        bar = tqdm(total=cfg.max_steps, initial=self.step, unit="upd", disable=not self.env.main, dynamic_ncols=True,
                   mininterval=0.5 if sys.stderr.isatty() else 60)
        stats = None
        while self.step < cfg.max_steps:
            out_of_time = cfg.max_minutes > 0 and time.monotonic() - start > cfg.max_minutes * 60
            stats = self.update(self.next_micro_batches(stream), out_of_time, signals["received"] is not None)
            if stats.skipped:
                if stats.stop:
                    break
                continue
            bar.update(1)
            tokens_since_log += stats.tokens
            if self.step % cfg.log_every == 0 or self.step == 1:
                now = time.monotonic()
                scalars = {**stats.scalars(), "tokens_per_s": tokens_since_log / max(now - last_log, 1e-9)}
                last_log, tokens_since_log = now, 0
                self.log_scalars("train", scalars)
                bar.set_postfix(loss=f"{stats.loss:.3f}", ppl=f"{scalars['ppl']:.1f}",
                                tok_s=f"{scalars['tokens_per_s']:.0f}", lr=f"{stats.lr:.2e}")
            if cfg.valid_every and self.step % cfg.valid_every == 0 and not stats.stop:
                self.log_scalars("valid", self.validate())
                validated = self.step
            due_by_time = cfg.save_every_minutes > 0 and time.monotonic() - last_save > cfg.save_every_minutes * 60
            if self.step % cfg.save_every_steps == 0 or due_by_time or stats.stop:
                self.save(final=stats.stop is not None)
                last_save = time.monotonic()
            if stats.stop:
                break
        bar.close()
        stop = stats.stop if stats is not None else None
        if stop == "time":
            log.info("train.max_minutes=%g reached at update %d", cfg.max_minutes, self.step)
        elif stop == "signal":
            log.warning("stopped by %s at update %d with a complete checkpoint in %s: run the same command again to "
                        "continue (exit code %d)", signals["received"] or "a signal on another rank", self.step,
                        self.out, EXIT_STOPPED)
        return stop, validated

    def log_scalars(self, prefix: str, stats: dict) -> None:
        if not self.env.main:
            return
        shown = {k: v for k, v in stats.items() if isinstance(v, float) or k == "tokens"}
        for key, value in shown.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, self.step)
        self.writer.flush()
        log.info("%s update %d: %s", prefix, self.step, " ".join(f"{k} {v:.4g}" for k, v in shown.items()))


def setup_logging(out: Path, main: bool) -> None:
    handlers = [logging.StreamHandler(sys.stderr)]
    if main:
        out.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(out / "train.log"))
    logging.basicConfig(level=logging.INFO if main else logging.WARNING, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)  # e.g. the fused kernel's fallback warnings, into train.log too


class TrainingStopped(Exception):
    """SIGTERM or SIGUSR1 ended the run after a complete checkpoint; the same command continues it."""


# What nmt.train exits with: 0 done; 2 bad input, config or checkpoint (one line, no traceback); EXIT_STOPPED
# stopped by SIGTERM/SIGUSR1 with a complete checkpoint saved (EX_TEMPFAIL: run the same command again).
EXIT_STOPPED = 75


@contextlib.contextmanager
def stop_signals():
    """SIGTERM (SLURM before a time limit or preemption; torchrun passes it on) and SIGUSR1 (`#SBATCH
    --signal=USR1@120`) only raise a flag: the run ends after the current update, on every rank at the same one."""
    state = {"received": None}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, _frame):
        state["received"] = signal.Signals(signum).name

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(job: TrainJob) -> Path:
    """Prepare (rank 0), train (every rank), then average (rank 0, after the process group is gone).
    Raises TrainingStopped when a signal ended the run early."""
    job.check()
    env = setup_env(job.train)
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
