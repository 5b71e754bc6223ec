"""Dropout (Srivastava et al. 2014) whose CPU mask costs 16 random bits per element.

PyTorch's CPU dropout draws one float per element (`bernoulli_`, one Mersenne-Twister call each, on one thread):
the dropout sites of a `tiny` fp32 update took 0.263 s of 1.080 on 2 cores, these masks 0.107 s
(benchmarks/train_parts.py, docs/benchmarks.md). Here a CPU mask is cut from 64-bit words, four 16-bit lanes each.
An element is kept when its lane is at or above round(p * 2^16) of the 2^16 values, so the kept fraction is
exactly 1 - round(p * 2^16) / 2^16 (p = 0.1: 0.899994) and the kept values are scaled by its inverse: the
expectation is x, as with F.dropout.
On other devices F.dropout (one fused kernel) and torch.rand masks are already cheap and stay, and so do they under
torch.compile, which fuses them into its own kernels (and cannot trace the in-place draw: a graph break per site).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

LANES = 2**16  # values of one 16-bit lane


def keep_mask(shape: tuple[int, ...], p: float, device: torch.device) -> tuple[Tensor, float]:
    """A boolean mask of `shape` keeping each element with probability ~1 - p (exactly, on a CPU: see above), and
    the scale that makes the kept elements' expectation x. Drawn from the device's default generator."""
    if device.type != "cpu" or torch.compiler.is_compiling():
        return torch.rand(shape, device=device) >= p, 1.0 / (1.0 - p)
    dropped = round(p * LANES)
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # all 64 bits uniform
    lanes = words.view(torch.int16)[:count].view(shape)
    return lanes >= dropped - LANES // 2, LANES / (LANES - dropped)


class _Scaled(torch.autograd.Function):
    """x * mask forward, grad * mask backward, for a mask already scaled and in x's dtype: two multiplications
    of floats, where multiplying by the boolean mask and then by the scale took four passes (2x slower)."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor) -> Tensor:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """F.dropout, with the CPU mask above."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        return F.dropout(x, p, training=True)
    keep, scale = keep_mask(tuple(x.shape), p, x.device)
    return _Scaled.apply(x, keep.to(x.dtype).mul_(scale))


class Dropout(nn.Dropout):
    """nn.Dropout (same arguments, no state) through `dropout` above."""

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)
