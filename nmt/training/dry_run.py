"""train.dry_run=true: what a run would be, before it is: the composed job, the effective batch, the parameters and
the time its updates would take on this launch, from a few timed updates on the run's first batches. Trains nothing
that is kept and writes no run folder (the data is prepared, as any run prepares it first)."""

from __future__ import annotations

import time

from omegaconf import OmegaConf

from nmt.batch import effective_batch_line
from nmt.data.batching import training_stream
from nmt.modeling.transformer import count_parameters
from nmt.runtime.process import Env
from nmt.training.trainer import Trainer, check_attention

TIMED_UPDATES = 3  # after one that warms up (allocations, torch.compile, the kernel's self-test)


def seconds_per_update(trainer: Trainer, updates: int = TIMED_UPDATES) -> float:
    """The median wall time of `updates` updates on the run's first batches, after one that warms up. Changes the
    trainer's model: a Trainer built for this alone."""
    check_attention(trainer.attention, trainer.job.model, trainer.amp_dtype, trainer.env.device)
    cfg, env = trainer.cfg, trainer.env
    stream = training_stream(trainer.data.train, cfg.max_tokens, cfg.seed, env.rank, env.world_size, 0, 0)
    times = []
    for _ in range(updates + 1):
        started = time.monotonic()
        trainer.train_step(trainer.next_micro_batches(stream), out_of_time=False)
        times.append(time.monotonic() - started)
    return sorted(times[1:])[len(times[1:]) // 2]


def dry_run_report(trainer: Trainer, env: Env, seconds: float) -> str:
    """The composed job, then the batch, the size and the estimate."""
    cfg = trainer.cfg
    hours = seconds * cfg.max_steps / 3600
    return "\n".join([
        OmegaConf.to_yaml(OmegaConf.structured(trainer.job)).rstrip(), "",
        effective_batch_line(env.world_size, cfg.max_tokens, trainer.update_freq, cfg.tokens_per_update),
        f"{count_parameters(trainer.model):,} parameters; {cfg.max_steps:,} updates",
        f"estimate: {seconds:.3f} s an update (median of {TIMED_UPDATES} on the first batches, after one to warm up) "
        f"x {cfg.max_steps:,} updates = {hours:.2f} hours on this launch ({env.world_size} x {env.device.type}), "
        "validation and saves not counted",
        f"dry run: nothing trained, {cfg.output_dir} not written"])
