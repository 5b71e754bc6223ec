"""The recipe owns its batch: train.tokens_per_update padded tokens per update, reached on any number of devices by
deriving the micro-batches per device (gradient accumulation), or refused in one line when it cannot be reached.
The update's micro-batches are then the same set of the one global sequence (nmt/data/batching.py) on 1 device or
64, for a given max_tokens."""

from __future__ import annotations

from nmt.config import ConfigError, TrainConfig

# How far the effective batch may miss the recipe's tokens_per_update when max_tokens does not divide it.
BATCH_TOLERANCE = 0.05


def micro_batches(cfg: TrainConfig, world_size: int) -> int:
    """Micro-batches per device per update that reach train.tokens_per_update on `world_size` devices.

    The batch is exact or refused: world_size x max_tokens x F must equal the recipe's tokens, within
    BATCH_TOLERANCE of it for a max_tokens that does not divide it."""
    if cfg.tokens_per_update == 0:
        return cfg.update_freq or 1
    per_update = max(1, round(cfg.tokens_per_update / cfg.max_tokens))  # global micro-batches per update
    reached = per_update * cfg.max_tokens
    if per_update % world_size or abs(reached - cfg.tokens_per_update) > BATCH_TOLERANCE * cfg.tokens_per_update:
        fits = sorted({cfg.tokens_per_update // (world_size * f) for f in (1, 2, 4, 8)
                       if cfg.tokens_per_update // (world_size * f) >= 1})
        raise ConfigError(
            f"train.tokens_per_update={cfg.tokens_per_update} cannot be reached on {world_size} device(s) with "
            f"train.max_tokens={cfg.max_tokens} (it gives {per_update} micro-batches of {cfg.max_tokens}, "
            f"which {world_size} device(s) cannot share evenly or which miss it by more than "
            f"{BATCH_TOLERANCE:.0%}): set train.max_tokens to one of {', '.join(map(str, reversed(fits)))}")
    derived = per_update // world_size
    if cfg.update_freq is not None and cfg.update_freq != derived:
        raise ConfigError(
            f"train.update_freq={cfg.update_freq} contradicts train.tokens_per_update={cfg.tokens_per_update}: "
            f"{world_size} device(s) x {cfg.max_tokens} tokens need {derived} micro-batches; leave "
            f"train.update_freq out (it is derived) or set train.tokens_per_update=0")
    return derived


def effective_tokens(world_size: int, max_tokens: int, update_freq: int) -> int:
    """The effective batch: padded tokens per update, over every device and micro-batch."""
    return world_size * max_tokens * update_freq


def effective_batch_line(world_size: int, max_tokens: int, update_freq: int, tokens_per_update: int) -> str:
    """The batch the job trains, as every launch form logs it (at most these padded tokens per update)."""
    recipe = f"recipe: {tokens_per_update}" if tokens_per_update else "recipe: not stated, train.tokens_per_update=0"
    return (f"effective batch: {world_size} devices x {max_tokens} tokens x {update_freq} micro-batches = "
            f"{effective_tokens(world_size, max_tokens, update_freq)} ({recipe})")
