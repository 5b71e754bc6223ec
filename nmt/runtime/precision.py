"""The precision policy, one for every job. auto: bf16 autocast on a GPU that has it; without bf16, fp16 for training
(with its GradScaler) and fp32 for decoding (no loss scaling to protect it); fp32 on a CPU. The demo and the sweeps
ask for bf16 by name on a CPU that computes it natively (native_cpu_bf16: 1.6x faster there)."""

from __future__ import annotations

import torch

from nmt.machine import native_cpu_bf16
from nmt.modes import Precision


def autocast_dtype(precision: Precision, device: torch.device, training: bool = True) -> torch.dtype | None:
    """The autocast dtype, None for fp32."""
    if precision == Precision.fp32 or (precision == Precision.auto and device.type == "cpu"):
        return None
    if precision == Precision.fp16:
        return torch.float16
    # including_emulation=False: sm_70/75 (V100, T4) emulate bf16 slowly; there auto takes fp16 and its GradScaler
    if precision == Precision.auto and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16 if training else None
    return torch.bfloat16


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed precision around forward and loss (a no-op context for fp32)."""
    return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)


def experiment_cpu_precision() -> Precision:
    """What the demo and the sweeps ask for by name on a CPU: bf16 where it is native, else fp32."""
    return Precision.bf16 if native_cpu_bf16() else Precision.fp32
