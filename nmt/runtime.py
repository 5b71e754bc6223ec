"""Where a job runs, resolved once at its entry point: the process group (and the model's DDP and compile wrapping,
rank 0's work first), the device, the precision policy, the CPU allocator, RNG states and stop signals. Training,
decoding and the benchmarks all take these from here."""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from nmt.cluster import cpus_per_task, export_ranks, preemption_signal
from nmt.config import ConfigError, valid_device
from nmt.errors import EXIT_USER_ERROR, UserError
from nmt.machine import native_cpu_bf16
from nmt.modes import Precision


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """auto: this process's GPU if there is one, else the CPU; cuda: this process's GPU (cuda:LOCAL_RANK)."""
    if not valid_device(name):
        raise ConfigError(f"device={name} is invalid: it must be auto, cpu, cuda or cuda:N")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        return torch.device("cuda", local_rank)
    return torch.device(name)


@dataclass
class Env:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    launcher: dist.Store | None = None  # under torchrun: the launcher's store, shared by every restart attempt

    @property
    def main(self) -> bool:
        return self.rank == 0

    @contextlib.contextmanager
    def refusal_ends_the_launch(self):
        """Around a job: a UserError (bad config, data or state: a restart would meet it again) is remembered in the
        launcher's store, so that the attempts torchrun starts after it (--max-restarts: it restarts a worker that
        exits with any code) end at once, without a word (setup_env): the refusal is made and said once."""
        try:
            yield
        except UserError:
            if self.launcher is not None:
                self.launcher.set(REFUSED, "1")
            raise


def use_deterministic_algorithms() -> None:
    """train.deterministic: PyTorch's deterministic algorithms (an op without one is an error that names it) and
    cuBLAS's fixed workspace, which it reads when its handle is created, so before any CUDA work. On a CPU the
    trainer's results are reproducible without it (tests/test_train.py); the cost on a GPU is unmeasured."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False


def setup_env(device_name: str, threads: int = 0, deterministic: bool = False) -> Env:
    """This process's rank and device under torchrun, as a task of a submitit job (nmt/cluster.py) or alone, its
    threads or GPU, and the process group (NCCL on CUDA, gloo on the CPU)."""
    if deterministic:
        use_deterministic_algorithms()
    export_ranks()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if world_size > 1 and device.type == "cuda" and device.index != local_rank:
        raise ConfigError(f"train.device={device_name} is invalid under torchrun: each rank uses cuda:LOCAL_RANK "
                          "(train.device=cuda)")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        retain_freed_memory()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        torch.set_num_threads(threads or cpus_per_task() or max(1, (os.cpu_count() or 1) // local))
    launcher = None
    if world_size > 1:
        launcher, attempt = launcher_store()
        if attempt > 0 and launcher.check([REFUSED]):  # an earlier attempt was refused and said why, once:
            sys.exit(EXIT_USER_ERROR)  # this one ends at once, without a word (Env.refusal_ends_the_launch)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                store=dist.PrefixStore(f"relnmt/attempt{attempt}", launcher), rank=rank,
                                world_size=world_size, device_id=device if device.type == "cuda" else None)
    return Env(rank, world_size, device, launcher)


REFUSED = "relnmt/refused"  # in the launcher's store: a UserError ended an attempt of this launch


def launcher_store() -> tuple[dist.Store, int]:
    """(The launcher's store (env://: MASTER_ADDR, MASTER_PORT), this restart attempt), the attempt the prefix that
    keeps each attempt's keys apart.
    torchrun shares its rendezvous store with the workers, so after a restart (--max-restarts) the new group
    would otherwise read the dead attempt's addresses from it: gloo then hung in connectFullMesh
    (pytorch/pytorch#135712). With the attempt in the prefix no launcher needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE.

    The attempt is counted in the store itself, by the workers that joined it: TORCHELASTIC_RESTART_COUNT is not
    the same on every node (torchrun's healthy nodes restart as a membership change, uncounted). Every worker of a
    dead attempt had joined (it died later, mid-run), so the n-th worker to join belongs to attempt
    (n - 1) // world_size. A fixed world size is assumed (no elastic --nnodes=MIN:MAX)."""
    store, _, world_size = next(dist.rendezvous("env://"))
    return store, (store.add("relnmt/workers_joined", 1) - 1) // world_size


def setup_logging(out: Path | None, main: bool) -> None:
    """Rank 0 logs to stderr and out/train.log (none without `out`) at INFO, the other ranks warnings only;
    Python warnings included (e.g. the fused kernel's fallback warnings)."""
    handlers = [logging.StreamHandler(sys.stderr)]
    if main and out is not None:
        out.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(out / "train.log"))
    logging.basicConfig(level=logging.INFO if main else logging.WARNING, handlers=handlers, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)


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


def rng_state(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def retain_freed_memory(retain: bool = True) -> None:
    """Keep freed CPU tensors in the heap instead of returning them to the OS at every step.

    glibc hands blocks over its mmap threshold back with munmap, so every step's activations are
    page-faulted in and zeroed anew: on the 2-core machine a third of the time went to the kernel and
    a tiny update took 1.1 s instead of 0.73 s (same losses). No-op off glibc. retain=False puts back glibc's
    starting thresholds (128 KiB each; a process that ran a job in-process, a test session, gives the heap back).
    """
    global heap_retained
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 30 if retain else 128 * 1024)  # M_MMAP_THRESHOLD: blocks up to 1 GiB from the heap
        libc.mallopt(-1, (1 << 31) - 1 if retain else 128 * 1024)  # M_TRIM_THRESHOLD: never shrink the heap mid-run
        heap_retained = retain
    except (OSError, AttributeError):
        pass


heap_retained = False  # whether retain_freed_memory() holds this process's freed memory


# The precision policy, one for every job. auto: bf16 autocast on a GPU that has it; without bf16, fp16 for
# training (with its GradScaler) and fp32 for decoding (no loss scaling to protect it); fp32 on a CPU. The demo
# and the sweeps ask for bf16 by name on a CPU that computes it natively (native_cpu_bf16: 1.6x faster there).
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


# A second Ctrl-C counts as "again" only this long after the first: torchrun passes the terminal's Ctrl-C on to its
# workers, which the terminal already reached, within milliseconds.
AGAIN_AFTER_S = 1.0


@contextlib.contextmanager
def stop_signals(announce: bool = True, on_stop=None):
    """SIGTERM (SLURM before a time limit or preemption; torchrun passes it on), SIGUSR1 (`#SBATCH
    --signal=USR1@120`), a submitit job's preemption signal (nmt/cluster.py) and a first SIGINT (Ctrl-C at a terminal) only raise a flag: the run ends after the current
    update, on every rank at the same one, with a complete checkpoint. Ctrl-C again raises KeyboardInterrupt: the
    run ends at once, keeping only what was saved. announce: say so on stderr at the first Ctrl-C (rank 0);
    on_stop: called once, in the handler, at the first stop signal (the folder lock says its job is stopping)."""
    state = {"received": None, "at": 0.0}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, _frame):
        now = time.monotonic()
        if signum == signal.SIGINT and state["received"] is not None and now - state["at"] >= AGAIN_AFTER_S:
            raise KeyboardInterrupt
        if state["received"] is None:
            state["received"], state["at"] = signal.Signals(signum).name, now
            if on_stop is not None:
                on_stop()
            if signum == signal.SIGINT and announce:  # os.write: logging is not safe inside a signal handler
                os.write(2, b"\nCtrl-C: stopping after this update, with a complete checkpoint "
                            b"(Ctrl-C again to stop at once, without saving)\n")

    stops = {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, preemption_signal()} - {None}  # + a submitit job's
    previous = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
