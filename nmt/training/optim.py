"""Adam and the learning-rate schedules (Vaswani et al. 2017, Eq. 3; the paper trains with the same)."""

from __future__ import annotations

import logging
import math

import torch

from nmt.config import OptimConfig
from nmt.errors import UserError
from nmt.modeling.positions import T5Bias
from nmt.modes import Schedule


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
    """The schedule's rate for update `step` (from 1), set on every parameter group (times its lr_multiplier)."""
    lr = learning_rate(step, d_model, optim, total)
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_multiplier", 1.0)
    return lr


FUSED_ADAM_DEVICES = ("cpu", "cuda")  # where torch.optim.Adam has one fused kernel for all parameters


def make_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.Adam:
    """Adam (beta1, beta2, eps from the config) over the model's parameters; the schedule sets the rate before every
    update. With optim.bias_lr_scale != 1, T5's bias tables are a second group whose rate is that multiple.

    Fused where PyTorch has it: one kernel over all parameters instead of a dozen operations per parameter (a
    `tiny` step on 2 CPU cores: 0.006 s against 0.016, benchmarks/train_parts.py). The trainer unscales and checks
    the gradients itself, so the fused step sees plain gradients, as the loop did."""
    parameters = list(model.parameters())
    fused = bool(parameters) and all(p.device.type in FUSED_ADAM_DEVICES for p in parameters)
    groups: list[dict] = [{"params": parameters}]
    if optim.bias_lr_scale != 1.0:
        tables = {id(p) for m in model.modules() if isinstance(m, T5Bias) for p in m.parameters()}
        groups = [{"params": [p for p in parameters if id(p) not in tables]},
                  {"params": [p for p in parameters if id(p) in tables], "lr_multiplier": optim.bias_lr_scale}]
    return torch.optim.Adam(groups, lr=0.0, betas=(optim.beta1, optim.beta2), eps=optim.eps, fused=fused)


def step_optimizer(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, step: bool) -> None:
    """Apply the accumulated (unscaled) gradients if `step` (the trainer's skip rule: finite loss and gradients),
    then clear them. The optimizer steps itself: GradScaler.step would read its overflow flag on the host (a sync)
    for what the trainer already read; with fp16 the scaler still updates its scale from that flag."""
    if step:
        optimizer.step()
    scaler.update()  # fp16: lowered after an overflow, raised after enough clean steps; a no-op otherwise
    optimizer.zero_grad(set_to_none=True)


log = logging.getLogger("nmt.train")

FP16_OVERFLOW = "fp16 gradient overflow"
MIN_LOSS_SCALE = 1e-4  # fairseq's --min-loss-scale: below it, fp16 "overflows" are a gradient that is never finite


def skip_cause(loss_sum: float, grad_norm: float, loss_scaling: bool) -> str | None:
    """Why an update must be skipped (None: it steps). The same rule in every precision, as fairseq's: a non-finite
    loss, or a non-finite gradient norm (an inf or NaN anywhere in the gradients); with fp16's loss scaling the
    latter is the scaler's overflow, which it answers by lowering its scale."""
    if not math.isfinite(loss_sum):
        return "non-finite loss"
    if not math.isfinite(grad_norm):
        return FP16_OVERFLOW if loss_scaling else "non-finite gradient (the loss was finite)"
    return None


class Diverged(UserError, FloatingPointError):
    """Training cannot go on: its updates stay non-finite; the message says what to change."""


class SkipGuard:
    """The trainer's rule for updates that must not step (skip_cause): each is logged with its cause; fp16
    overflows are the scaler's routine until its scale falls below MIN_LOSS_SCALE; other causes stop the run after
    max_in_a_row in a row (Diverged, with what to change)."""

    def __init__(self, max_in_a_row: int):
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0  # non-finite updates in a row (fp16 overflows not counted)
        self.skipped = 0  # in this process's run, for the log

    def record(self, cause: str | None, update: int, scaler: torch.amp.GradScaler) -> bool:
        """Whether update number `update` (from 1) was skipped; raises when skipping can no longer help."""
        if cause is None:
            self.in_a_row = 0
            return False
        self.skipped += 1
        if cause == FP16_OVERFLOW:  # the scaler's routine: it lowered its scale
            scale = scaler.get_scale()
            log.info("update %d skipped: %s; loss scale lowered to %g (%d updates skipped in this run)", update, cause,
                     scale, self.skipped)
            if scale < MIN_LOSS_SCALE:  # gradients that stay non-finite whatever the scale: not an overflow
                raise Diverged(f"the fp16 loss scale fell to {scale:g} at update {update}: the gradients "
                                         "are not finite at any scale; use train.precision=bf16 or fp32")
            return True
        self.in_a_row += 1
        log.warning("update %d skipped: %s (%d in a row, %d in this run); the parameters did not move", update, cause,
                    self.in_a_row, self.skipped)
        if self.in_a_row >= self.max_in_a_row:
            raise Diverged(f"{self.in_a_row} updates in a row skipped ({cause}) at update {update}; lower "
                                     "optim.lr_scale, raise optim.warmup, set optim.clip_norm, or use "
                                     "train.precision=fp32")
        return True
