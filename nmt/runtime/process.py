"""Where a job runs, resolved once at its entry point: this process's rank and device under torchrun, a submitit
job or alone, its threads, the process group, and its log."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from nmt.cluster import cpus_per_task, export_ranks
from nmt.config import ConfigError, valid_device
from nmt.errors import EXIT_USER_ERROR, UserError
from nmt.runtime.memory import retain_freed_memory


def resolve_device(name: str, local_rank: int = 0, field: str = "device") -> torch.device:
    """auto: this process's GPU if there is one, else the CPU; cuda: this process's GPU (cuda:LOCAL_RANK). A GPU that
    is not there is a ConfigError naming `field`, not PyTorch's traceback when the first tensor moves."""
    if not valid_device(name):
        raise ConfigError(f"{field}={name} is invalid: it must be auto, cpu, cuda or cuda:N")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)
    if device.type == "cuda" and device.index >= visible_gpus():
        missing = ConfigError(f"{field}={name}: {device} is not here ({gpus_here()}): use {field}=auto (a GPU where "
                              f"there is one, else the CPU) or {field}=cpu")
        # torchrun with more ranks than GPUs: rank 0 has its GPU, and the ranks without one must say it themselves
        missing.every_rank_alike = visible_gpus() == 0
        raise missing
    return device


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_here() -> str:
    """What this process can use: its GPUs, or why none (a CPU-only build of PyTorch, no GPU visible)."""
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    count = visible_gpus()
    return f"{count} GPU{'s' * (count != 1)} visible" + (f": cuda:0 to cuda:{count - 1}" if count > 1 else
                                                        ": cuda:0" if count else "")


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
    device = resolve_device(device_name, local_rank, "train.device")
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
