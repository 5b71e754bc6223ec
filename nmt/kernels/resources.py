"""python -m nmt.kernels.resources [--arch 90 80] [--jobs 2] [--output FILE]: registers, spills and shared memory
of every configuration the dispatcher can send to the fused kernel, compiled for GPUs this machine need not have.

Each configuration goes through the kernels' real launch code (nmt.kernels.relative_attention.forward/backward)
with `kernel.warmup` in place of the launch and a stub driver that reports the target GPU, so Triton's nvidia
backend compiles exactly what a launch on that GPU would; `ptxas -v` (the one inside the triton wheel that
Triton itself picks) on the PTX gives registers and spills, `kernel.metadata.shared` the shared memory.
A configuration fails on any spilled byte or on shared memory over the target's per-block limit.
Exit code 1 if any configuration fails, 2 if this triton has no nvidia backend.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from nmt.outputs import write_json

# Largest shared memory one block may use (opt-in), by compute capability: H100/H200 227 KB, A100 163 KB.
SHARED_LIMIT = {90: 227 * 1024, 80: 163 * 1024}
KERNELS = ("forward", "backward_kv", "backward_q")


@dataclass(frozen=True)
class Config:
    """One compiled variant: what the dispatcher keys on that changes the code (nmt.kernels.dispatch.Case)."""

    dtype: str  # bfloat16 | float16
    head_dim: int
    buckets: int  # edge-window rows R (the register block is the next power of two >= 16)
    decoding: bool  # a single query per row block (beam search), forward only
    causal: bool = True
    padding: bool = True
    dropout: bool = True
    shared: bool = False

    def __str__(self) -> str:
        rows = "decode" if self.decoding else "train"
        return f"{self.dtype} D={self.head_dim} R={self.buckets} {rows}"


@dataclass
class Usage:
    arch: int
    config: str
    kernel: str
    block_m: int
    block_n: int
    num_warps: int
    registers: int
    spill_bytes: int  # stores + loads
    stack_bytes: int
    shared_bytes: int

    def problems(self) -> list[str]:
        found = []
        if self.spill_bytes:
            found.append(f"{self.spill_bytes} bytes of register spills")
        if self.shared_bytes > SHARED_LIMIT[self.arch]:
            found.append(f"{self.shared_bytes} bytes of shared memory (limit {SHARED_LIMIT[self.arch]})")
        return found


def dispatchable_configs() -> list[Config]:
    """Every dtype, head size and edge-window class the dispatcher accepts (nmt.kernels.dispatch.supported), with
    every optional feature on: each feature only adds tiles, so this is the most any variant of the class uses."""
    from nmt.kernels.dispatch import SUPPORTED_DTYPES, SUPPORTED_HEAD_DIMS
    from nmt.kernels.tiles import MAX_BUCKETS

    configs = []
    for dtype in SUPPORTED_DTYPES:
        for head_dim in SUPPORTED_HEAD_DIMS:
            for buckets in (15, 31, 63, 127):  # the largest odd window in each register block
                if buckets > MAX_BUCKETS:
                    continue
                for decoding in (False, True):
                    configs.append(Config(str(dtype).removeprefix("torch."), head_dim, buckets, decoding,
                                          padding=not decoding, dropout=not decoding))
    return configs


class _StubDriver:
    """What Triton asks of the active driver to compile (never to launch): a device, a stream, a target."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.arch, self.target = arch, GPUTarget("cuda", arch, 32)

    def get_current_device(self):
        return self.arch  # Triton keeps its compiled kernels per device: one "device" per target

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self.target

    def get_active_torch_device(self):
        return torch.device("cpu")


def _ptxas(arch: int) -> str:
    """The ptxas Triton itself would use for `arch`, across the versions' signatures: (path, version) in 3.3,
    one for every target in 3.4-3.5, a per-target object with .path from 3.6."""
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        found = get_ptxas(arch)
    except TypeError:
        found = get_ptxas()
    return found.path if hasattr(found, "path") else found[0]


def _ptxas_usage(ptx: str, arch: int) -> tuple[int, int, int]:
    """Registers, spilled bytes (stores + loads) and stack bytes per thread, from `ptxas -v`."""
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "kernel.ptx"
        src.write_text(ptx)
        log = subprocess.run([_ptxas(arch), "-v", f"--gpu-name={gpu}", str(src), "-o", str(Path(tmp) / "k")],
                             capture_output=True, text=True, check=True).stderr
    registers = max(int(n) for n in re.findall(r"Used (\d+) registers", log))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    stack = max([int(n) for n in re.findall(r"(\d+) bytes stack frame", log)] or [0])
    return registers, spills, stack


def compile_config(arch: int, config: Config) -> list[Usage]:
    """Compile the config's kernels for `arch` through the real launch code; one Usage per kernel."""
    from triton.runtime.driver import driver

    from nmt.kernels import relative_attention as op

    driver.set_active(_StubDriver(arch))
    compiled = []

    def warmup(kernel, launch_grid, *args, **constexprs):
        compiled.append((kernel.warmup(*args, grid=launch_grid, **constexprs), constexprs))

    dtype = getattr(torch, config.dtype)
    b, h, d, clip = 2, 1 if config.shared else 4, config.head_dim, (config.buckets - 1) // 2
    n = 1 if config.decoding else config.buckets + 9  # every edge vector reached
    nk = config.buckets + 9
    q = torch.zeros(b, n, h, d, dtype=dtype).transpose(1, 2)  # heads as the model makes them: transposed views
    k, v = (torch.zeros(b, nk, h, d, dtype=dtype).transpose(1, 2) for _ in range(2))
    table = torch.zeros(*(() if config.shared else (h,)), config.buckets, d, dtype=dtype)
    pad = torch.zeros(b, nk, dtype=torch.bool) if config.padding else None
    seed = torch.zeros(1, dtype=torch.int64) if config.dropout else None
    p = 0.1 if config.dropout else 0.0
    q_offset = nk - 1 if config.decoding else 0
    saved_launch = op.launch
    op.launch = warmup
    try:
        out, lse = op.forward(q, k, v, table, table, pad, seed, clip, 0, config.causal, q_offset, p, compiled=True)
        if not config.decoding:
            op.backward(out, q, k, v, table, table, pad, seed, out, lse, clip, 0, config.causal, q_offset, p,
                        compiled=True)
    finally:
        op.launch = saved_launch
    usages = []
    for name, (kernel, constexprs) in zip(KERNELS, compiled):
        registers, spills, stack = _ptxas_usage(kernel.asm["ptx"], arch)
        usages.append(Usage(arch, str(config), name, constexprs["BLOCK_M"], constexprs["BLOCK_N"],
                            constexprs["num_warps"], registers, spills, stack, kernel.metadata.shared))
    return usages


def nvidia_backend_available() -> bool:
    try:
        return Path(_ptxas(90)).is_file() and Path(_ptxas(80)).is_file()
    except Exception:  # no triton, or a build without the nvidia backend
        return False


def check(archs, configs, jobs: int = 1) -> list[Usage]:
    tasks = [(arch, config) for arch in archs for config in configs]
    if jobs <= 1:
        results = [compile_config(*task) for task in tasks]
    else:
        import multiprocessing

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(compile_config, *zip(*tasks)))
    return [usage for usages in results for usage in usages]


def table(usages: list[Usage]) -> str:
    """Markdown: one row per (target, configuration), the three kernels side by side."""
    lines = ["| target | configuration | tiles (M×N, warps) | registers fwd / bwd dK,dV / bwd dQ | spilled bytes "
             "| shared KB fwd / bwd dK,dV / bwd dQ |", "|---|---|---|---|---|---|"]
    rows: dict = {}
    for u in usages:
        rows.setdefault((u.arch, u.config), []).append(u)
    for (arch, config), group in rows.items():
        first = group[0]
        lines.append(f"| sm_{arch} | {config} | {first.block_m}×{first.block_n}, {first.num_warps} "
                     f"| {' / '.join(str(u.registers) for u in group)} | {sum(u.spill_bytes for u in group)} "
                     f"| {' / '.join(f'{u.shared_bytes / 1024:.0f}' for u in group)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=[90, 80], choices=sorted(SHARED_LIMIT))
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--only", help="configurations whose description contains this text (e.g. 'D=64')")
    parser.add_argument("--output", help="write the figures as JSON here")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") not in (None, "", "0"):
        print("error: TRITON_INTERPRET is set: the interpreter compiles nothing; unset it", file=sys.stderr)
        return 2
    if not nvidia_backend_available():
        print("error: this triton has no nvidia backend with ptxas (pip install triton on Linux x86-64)",
              file=sys.stderr)
        return 2
    configs = [c for c in dispatchable_configs() if args.only is None or args.only in str(c)]
    usages = check(args.arch, configs, args.jobs)
    print(table(usages))
    if args.output:
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        write_json(Path(args.output), [asdict(u) for u in usages], indent=1)
    failures = [(u, problem) for u in usages for problem in u.problems()]
    for u, problem in failures:
        print(f"FAIL sm_{u.arch} {u.config} {u.kernel}: {problem}", file=sys.stderr)
    print(f"{len(usages)} kernels compiled for {', '.join(f'sm_{a}' for a in args.arch)}: "
          f"{'all within budget' if not failures else f'{len(failures)} over budget'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
