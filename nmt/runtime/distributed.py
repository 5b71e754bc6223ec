"""Work across the ranks of a job: the model's DDP and compile wrapping, rank 0's work first, and the collectives
(sums of named values, gathers, rank 0's flag)."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from nmt.runtime.process import Env


def parallelize(model: torch.nn.Module, env: Env, compile_model: bool | None) -> tuple[torch.nn.Module, ...]:
    """(the model under DistributedDataParallel when there are several ranks, what training calls: that, compiled
    when asked for, on CUDA by default). Only training runs compiled, so checkpoints come from the plain model
    (no "_orig_mod." keys); batch shapes change every step, so the graph is traced once with dynamic shapes."""
    data_parallel = DistributedDataParallel(model) if env.world_size > 1 else model
    if compile_model is None:
        compile_model = env.device.type == "cuda"
    return data_parallel, torch.compile(data_parallel, dynamic=True) if compile_model else data_parallel


def rank0_first(env: Env, work) -> None:
    """work() on rank 0 while the other ranks wait for it without timing out (a first WMT14 prepare takes hours):
    they wait in a gloo group of their own with a one-day timeout."""
    patient = dist.new_group(backend="gloo", timeout=datetime.timedelta(days=1)) if env.world_size > 1 else None
    if env.main:
        work()
    if patient is not None:
        dist.barrier(group=patient)


def sum_over_ranks(env: Env, values: dict) -> dict[str, torch.Tensor]:
    """Each named value (a device scalar, a number or a flag) summed over the ranks in one all-reduce, by name (as
    fairseq's all_reduce_dict), still on the device: nothing here makes the host wait."""
    packed = torch.zeros(len(values), device=env.device)
    for i, value in enumerate(values.values()):
        packed[i] = value  # a number is written by a kernel launch, not copied from the host
    if env.world_size > 1:
        dist.all_reduce(packed)
    return dict(zip(values, packed.unbind()))


def all_gather(env: Env, value) -> list:
    """Every rank's `value` (picklable), by rank."""
    if env.world_size == 1:
        return [value]
    gathered = [None] * env.world_size
    dist.all_gather_object(gathered, value)
    return gathered


def broadcast_flag(env: Env, flag: bool) -> bool:
    """Rank 0's flag on every rank."""
    tensor = torch.tensor([int(flag)], device=env.device)
    dist.broadcast(tensor, 0)
    return bool(tensor.item())
