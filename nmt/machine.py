"""Which machine a record was made on, in the terms that decide its numbers: the CPU's vendor, family, model and
stepping and the instruction sets that pick PyTorch's kernels (AVX2, AVX-512, AVX512-BF16, AMX), the cores, and
the GPU where there is one. Cloud CPUs share one model string ("Intel(R) Xeon(R) Processor") across generations:
the family/model/stepping and the flags tell them apart, and identical hypotheses are promised only for the same
ones (with the same threads, precision and code)."""

from __future__ import annotations

import functools
import os
import platform

import torch

# The flags whose presence changes which kernels run (oneDNN / MKL dispatch on them), in /proc/cpuinfo's spelling.
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8")


def cpuinfo(field: str) -> list[str]:
    """The values of `field` in /proc/cpuinfo, one per logical CPU; [] where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            return [line.split(":", 1)[1].strip() for line in f if line.split(":", 1)[0].strip() == field]
    except OSError:
        return []


@functools.cache
def first_cpu() -> dict[str, str]:
    """The first logical CPU's /proc/cpuinfo fields, read once per process ({} where there is none)."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def native_cpu_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 / AMX)."""
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def host() -> dict:
    """This machine's CPU as a record's field: what decides the bits and the speed of a CPU run."""
    cpu = first_cpu()
    flags = set(cpu.get("flags", "").split())
    return {"cpu": cpu.get("model name") or platform.processor() or platform.machine(), "vendor": cpu.get("vendor_id"),
            "family": cpu.get("cpu family"), "model": cpu.get("model"), "stepping": cpu.get("stepping"),
            "arch": platform.machine(), "kernel_flags": [flag for flag in KERNEL_FLAGS if flag in flags],
            "native_bf16": native_cpu_bf16(), "cores": os.cpu_count()}


def cpu_model() -> str:
    """The CPU in one phrase: its model name, architecture, family/model/stepping and kernel flags."""
    cpu = host()
    ident = (f"; family {cpu['family']} model {cpu['model']} stepping {cpu['stepping']}"
             if cpu["family"] is not None else "")
    flags = f"; {' '.join(cpu['kernel_flags'])}" if cpu["kernel_flags"] else ""
    return f"{cpu['cpu']} ({cpu['arch']}{ident}{flags})"


def machine(device: torch.device) -> str:
    """The device in words, for result records."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    bf16 = "native bf16" if native_cpu_bf16() else "no native bf16"
    return f"CPU {cpu_model()}, {os.cpu_count()} cores, {bf16}"
