"""The one timing loop of the project: medians of interleaved repeats, the device synchronized around each call.

Interleaving (A B A B ..., not A A .. B B ..) puts every variant under the same drift of a noisy machine (clock
boost, a neighbour's load), and the median drops the outliers; the auto attention backend decides with it
(nmt.kernels.dispatch.slower_than_torch), as do the benchmarks (python -m benchmarks.NAME).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work, so that a clock read after it counts that work (CUDA runs asynchronously)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved_samples(steps: dict[str, Callable[[], object]], repeats: int, device: torch.device | str,
                        warmup: int = 2) -> dict[str, list[float]]:
    """Seconds of each call of each step over `repeats` interleaved rounds, after `warmup` untimed calls of each."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            synchronize(device)
            start = time.perf_counter()
            step()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return times


def time_interleaved(steps: dict[str, Callable[[], object]], repeats: int, device: torch.device | str,
                     warmup: int = 2) -> dict[str, float]:
    """The median seconds of each step (see interleaved_samples)."""
    return {name: statistics.median(t) for name, t in interleaved_samples(steps, repeats, device, warmup).items()}
