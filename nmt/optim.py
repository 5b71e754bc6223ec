"""Adam and the learning-rate schedules (Vaswani et al. 2017, Eq. 3; the paper trains with the same)."""

from __future__ import annotations

import math

import torch

from nmt.config import OptimConfig, Schedule


def peak_lr(d_model: int, warmup: int, scale: float = 1.0) -> float:
    """The rate both schedules reach at the end of warmup: scale * d_model^-0.5 * warmup^-0.5."""
    return scale * d_model**-0.5 * warmup**-0.5


def inverse_sqrt_lr(step: int, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """Vaswani et al. 2017, Eq. 3: linear warmup to peak_lr, then decay with the inverse square root of the step."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def linear_decay_lr(step: int, d_model: int, warmup: int, total: int, scale: float = 1.0) -> float:
    """Linear warmup to peak_lr, then linear decay to 0 at `total`.

    For short, update-budgeted runs (the demo, the small-scale tables): the learning rate spends the
    budget instead of stopping mid-decay, which measured better on Multi30k's validation set.
    """
    step = max(step, 1)
    peak = peak_lr(d_model, warmup, scale)
    if step <= warmup:
        return peak * step / warmup
    return peak * max(0.0, (total - step) / max(total - warmup, 1))


def learning_rate(step: int, d_model: int, optim: OptimConfig, total: int) -> float:
    if optim.schedule == Schedule.linear:
        return linear_decay_lr(step, d_model, optim.warmup, total, optim.lr_scale)
    return inverse_sqrt_lr(step, d_model, optim.warmup, optim.lr_scale)


def set_learning_rate(optimizer: torch.optim.Optimizer, step: int, d_model: int, optim: OptimConfig,
                      total: int) -> float:
    """The schedule's rate for update `step` (from 1), set on every parameter group."""
    lr = learning_rate(step, d_model, optim, total)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def make_optimizer(parameters, optim: OptimConfig) -> torch.optim.Adam:
    """Adam (beta1, beta2, eps from the config); the schedule sets the rate before every update."""
    return torch.optim.Adam(parameters, lr=0.0, betas=(optim.beta1, optim.beta2), eps=optim.eps)


def step_optimizer(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, step: bool) -> None:
    """Apply the accumulated (unscaled) gradients if `step` (the trainer's skip rule: finite loss and gradients),
    then clear them. The optimizer steps itself: GradScaler.step would read its overflow flag on the host (a sync)
    for what the trainer already read; with fp16 the scaler still updates its scale from that flag."""
    if step:
        optimizer.step()
    scaler.update()  # fp16: lowered after an overflow, raised after enough clean steps; a no-op otherwise
    optimizer.zero_grad(set_to_none=True)


FP16_OVERFLOW = "fp16 gradient overflow"


def skip_cause(loss_sum: float, grad_norm: float, loss_scaling: bool) -> str | None:
    """Why an update must be skipped (None: it steps). The same rule in every precision, as fairseq's: a non-finite
    loss, or a non-finite gradient norm (an inf or NaN anywhere in the gradients); with fp16's loss scaling the
    latter is the scaler's overflow, which it answers by lowering its scale."""
    if not math.isfinite(loss_sum):
        return "non-finite loss"
    if not math.isfinite(grad_norm):
        return FP16_OVERFLOW if loss_scaling else "non-finite gradient (the loss was finite)"
    return None
