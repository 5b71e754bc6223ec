"""Which implementation computes relation-aware attention: the PyTorch path or the fused Triton kernel.

The backend is configuration, chosen once per job (`train.attention`, translate's `attention`: auto | torch |
triton; the RELNMT_ATTENTION environment variable maps onto auto) and held by the model's attention layers:
- torch: the PyTorch path everywhere (the reference; benchmarks compare against it);
- triton: the kernel wherever its shapes fit, unchecked and without fallback (on a CPU it needs
  TRITON_INTERPRET=1: the tests run whole models through the kernel that way);
- auto (default): the kernel serves a configuration (a Case: dtype, head size, edge-window class, causal,
  dropout, which tables, per-head or shared, padding, decoding tiles) on a device only after a self-test there
  passed: a small forward and backward against the PyTorch path (`self_test`). A failure, an exception or a
  mismatch, gives one warning naming the case and the cause, and the PyTorch path for that case only.
  The trainer checks its model's cases before torch.compile traces and, under DDP, all ranks adopt the same
  verdicts (one all-reduce); elsewhere an unchecked case is tested on its first eager use.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import warnings

import torch
from torch import Tensor

from nmt.config import ConfigError
from nmt.kernels import cases
from nmt.kernels.cases import Case, KernelFallbackWarning, case_of  # noqa: F401 (the API)
from nmt.kernels.tiles import MAX_BUCKETS, fits_grid, head_block
from nmt.kernels.window import EdgeWindow
from nmt.modes import Attention
from nmt.timing import time_interleaved

# What auto sends to the kernel, from the compiles for sm_90 and sm_80 (python -m nmt.kernels.resources): half
# precision with heads of 33 to 128 (every preset has 64). fp32 goes to the PyTorch path (its IEEE tl.dot
# spilled kilobytes per thread), and so do heads of 32 or less (their backward kernels spilled 8-40 bytes).
SUPPORTED_DTYPES = (torch.bfloat16, torch.float16)
SUPPORTED_HEAD_DIMS = (64, 128)  # register blocks: a head size compiles as the next power of two >= 16


def triton_usable() -> bool:
    """Triton installed, at version 3.4 or later, found without importing it (slow). On 3.3 the dropout mask
    kernel's Philox offsets (int32) and the main kernels' (int64) draw different streams, so every dropout case
    would fail its self-test; tl.gather first shipped in 3.3, so nothing older compiles at all."""
    if importlib.util.find_spec("triton") is None:
        return False
    try:
        major, minor = (int(part) for part in importlib.metadata.version("triton").split(".")[:2])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return True  # a build under another distribution name (pytorch-triton): the self-test judges it
    return (major, minor) >= (3, 4)


TRITON_INSTALLED = triton_usable()

# A case passes when, for the output and every gradient, the kernel's largest error against the PyTorch path in
# float64 is at most twice the PyTorch path's own error in the case's dtype plus this share of the largest value.
TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3, torch.float32: 1e-4, torch.float64: 1e-8}


def resolve(configured: Attention | str) -> Attention:
    """The configured backend; RELNMT_ATTENTION, if set, stands in for auto."""
    value = str(getattr(configured, "value", configured))
    if value == Attention.auto.value and os.environ.get("RELNMT_ATTENTION"):
        value = os.environ["RELNMT_ATTENTION"]
    try:
        return Attention(value)
    except ValueError:
        raise ConfigError(f"attention={value!r} (or RELNMT_ATTENTION) is invalid: it must be auto, torch or triton")


class AttentionBackend:
    """The choice of implementation for one job, and under auto the verdict of each case's self-test."""

    def __init__(self, mode: Attention | str = Attention.auto, devices: tuple[str, ...] = ("cuda",),
                 dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES, head_dims: tuple[int, ...] = SUPPORTED_HEAD_DIMS,
                 lazy: bool = True):
        self.mode = resolve(mode)
        # where auto may use the kernel (the tests add the CPU: the interpreter, in float64, with small heads)
        self.devices, self.dtypes, self.head_dims = devices, dtypes, head_dims
        self.verdicts: dict[Case, bool] = {}
        self.lazy = lazy  # test unchecked cases on first eager use (off under DDP: ranks must agree)
        self.wide_logged = False  # whether the fall-back of windows wider than the kernel holds was said

    def case(self, q: Tensor, rel_k, rel_v, buckets: int, key_padding_mask, causal: bool, dropout_p: float
             ) -> Case | None:
        """The call's case, or None where auto cannot use the kernel at all."""
        # said in eager code only: under torch.compile the window is the whole table and a warning breaks the graph
        if not torch.compiler.is_compiling() and buckets > MAX_BUCKETS and not self.wide_logged \
                and q.device.type in self.devices:
            self.wide_logged = True  # large k on long sentences (or edge buckets' expanded tables): said once
            warnings.warn(f"fused relative attention holds at most {MAX_BUCKETS} edge vectors per call; calls whose "
                          f"window is wider ({buckets} here) use the PyTorch path", KernelFallbackWarning, stacklevel=3)
        if buckets > MAX_BUCKETS or not fits_grid(q.shape[0], q.shape[1], max(q.shape[2], 1)):
            return None
        case = case_of(q, rel_k, rel_v, buckets, key_padding_mask is not None, causal, dropout_p)
        return case if self.serves(case) else None

    def serves(self, case: Case) -> bool:
        """Whether auto can send this case to the kernel at all; only such cases are ever self-tested."""
        return (TRITON_INSTALLED and case.device in self.devices and case.dtype in self.dtypes
                and head_block(case.head_dim) in self.head_dims and case.buckets_block <= MAX_BUCKETS)

    def use_kernel(self, q: Tensor, rel_k, rel_v, buckets: int, key_padding_mask, causal: bool,
                   dropout_p: float) -> bool:
        if self.mode is not Attention.auto:
            return self.mode is Attention.triton
        case = self.case(q, rel_k, rel_v, buckets, key_padding_mask, causal, dropout_p)
        if case is None or case in cases.BACKWARD_FAILED:
            return False
        verdict = self.verdicts.get(case)
        if verdict is None:
            if torch.compiler.is_compiling() or not self.lazy:
                return False  # never tested here: the PyTorch path, the same on every rank
            verdict = self.check([case], q.device)[case]
        return verdict

    def check(self, cases: list[Case], device: torch.device, group=None) -> dict[Case, bool]:
        """Self-test each case not yet judged on `device`; under torch.distributed every rank must pass the same
        cases in the same order, and all adopt a case only if it passed on every rank."""
        todo = [case for case in dict.fromkeys(cases) if case not in self.verdicts and self.serves(case)]
        if self.mode is Attention.auto and todo:
            causes = [self_test(case, device) or (slower_than_torch(case, device) if device.type == "cuda" else None)
                      for case in todo]
            passed = torch.tensor([cause is None for cause in causes], dtype=torch.int32, device=device)
            if torch.distributed.is_initialized() and torch.distributed.get_world_size(group) > 1:
                torch.distributed.all_reduce(passed, torch.distributed.ReduceOp.MIN, group=group)
            for case, cause, ok in zip(todo, causes, passed.tolist()):
                self.verdicts[case] = bool(ok)
                if not ok:
                    self.fall_back(case, cause or "failed on another rank")
        return {case: self.verdicts.get(case, self.mode is Attention.triton) for case in cases}

    def fall_back(self, case: Case, cause: str) -> None:
        self.verdicts[case] = False
        warnings.warn(f"fused relative attention off for {case}: {cause}; using the PyTorch path for it",
                      KernelFallbackWarning, stacklevel=3)


def self_test(case: Case, device: torch.device) -> str | None:
    """Forward and backward of a small problem of this case through the kernel and through the PyTorch path;
    None if the kernel agrees (within TOLERANCE), else what went wrong."""
    from nmt.kernels import relative_attention as kernel
    from nmt.kernels.torch_attention import reference_attention

    g = torch.Generator().manual_seed(0)
    clip = (case.buckets_block - 1) // 2  # every bucket of the register block in use
    nk = clip + 18  # more than 16 queries: the training tiles
    nq = 1 if case.decoding else nk
    b, h, d = 2, 3, case.head_dim
    q_offset = nk - nq if case.decoding else 0
    table_shape = (2 * clip + 1, d) if case.shared else (h, 2 * clip + 1, d)
    inputs = [torch.randn(*shape, generator=g, dtype=torch.float64)
              for shape in ((b, h, nq, d), (b, h, nk, d), (b, h, nk, d), table_shape, table_shape)]
    inputs[3] = inputs[3] if case.key_table else None
    inputs[4] = inputs[4] if case.value_table else None
    pad = None
    if case.padding:
        pad = torch.zeros(b, nk, dtype=torch.bool, device=device)
        pad[1, nk - 5:] = True
    dropout_p = 0.25 if case.dropout else 0.0
    window = EdgeWindow(clip, 0, 2 * clip)  # the whole table: R = 2k+1 rows in the case's register block
    weight = torch.randn(b, h, nq, d, generator=g, dtype=torch.float64).to(device)

    def run(fn, dtype):
        # in the case's own dtype, whatever the caller's mode (decoding runs under no_grad and autocast)
        with torch.enable_grad(), torch.autocast(device.type, enabled=False):
            # copies: on a CPU in float64, .to() would hand back the inputs themselves, and every run would then
            # share (and accumulate into) the same gradient tensors
            leaves = [None if t is None else t.to(device, dtype, copy=True).requires_grad_(True) for t in inputs]
            out = fn(*leaves)
            (out.double() * weight).sum().backward()
        return [out.detach().double()] + [t.grad.double() for t in leaves if t is not None]

    try:
        seed = torch.tensor([12345], device=device) if case.dropout else None
        keep = kernel.dropout_keep_mask(seed, b, h, nq, nk, dropout_p) if case.dropout else None
        got = run(lambda q, k, v, rk, rv: kernel.relative_attention(
            q, k, v, rk, rv, window, pad, case.causal, q_offset, dropout_p, seed, fallback=False), case.dtype)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # a compile or launch this device cannot do
        return f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"

    def reference(q, k, v, rk, rv):
        return reference_attention(q, k, v, rk, rv, window, pad, case.causal, q_offset, keep, dropout_p)

    want, baseline = run(reference, torch.float64), run(reference, case.dtype)
    names = ["output"] + [f"grad {n}" for n, t in zip(("q", "k", "v", "a^K", "a^V"), inputs) if t is not None]
    for name, x, ref, base in zip(names, got, want, baseline):
        scale = ref.abs().max().clamp_min(1e-30)
        error, allowed = (x - ref).abs().max() / scale, 2 * (base - ref).abs().max() / scale + TOLERANCE[case.dtype]
        if not bool(error <= allowed):  # also catches NaN
            return f"{name} off by {float(error):.3g} of its largest value (allowed {float(allowed):.3g})"
    return None


def slower_than_torch(case: Case, device: torch.device, repeats: int = 5, shape=(48, 8, 64)) -> str | None:
    """After a passed self-test: forward + backward of the kernel and of the PyTorch path on a typical shape of the
    case (a 25k-token batch of 64-token rows, 8 heads; one query per row over a 64-token prefix for the decoding
    tiles), interleaved medians of `repeats` after two warm-ups (nmt.timing). None if the kernel is at least as fast,
    else both times: auto keeps the faster path per case, as cuDNN's benchmark mode does, so it is never slower than
    attention=torch."""
    from nmt.kernels import relative_attention as kernel
    from nmt.kernels import torch_attention

    (b, h, nk), d = shape, case.head_dim
    nq = 1 if case.decoding else nk
    clip = (case.buckets_block - 1) // 2
    g = torch.Generator(device=device).manual_seed(0)
    table = (2 * clip + 1, d) if case.shared else (h, 2 * clip + 1, d)
    shapes = [(b, h, nq, d), (b, h, nk, d), (b, h, nk, d), table, table]
    q, k, v, rel_k, rel_v = [torch.randn(*s, generator=g, device=device).to(case.dtype).requires_grad_(True)
                             for s in shapes]
    pad = torch.zeros(b, nk, dtype=torch.bool, device=device) if case.padding else None
    tables = (rel_k if case.key_table else None, rel_v if case.value_table else None)
    window = EdgeWindow(clip, 0, 2 * clip)  # the whole table: the case's own register block, as in self_test

    def forward_backward(implementation) -> None:
        with torch.enable_grad(), torch.autocast(device.type, enabled=False):
            out = implementation(q, k, v, *tables, window, pad, case.causal, nk - nq, 0.1 if case.dropout else 0.0)
            out.sum().backward()

    seconds = time_interleaved({"triton": lambda: forward_backward(kernel.relative_attention),
                                "torch": lambda: forward_backward(torch_attention.relative_attention)}, repeats, device)
    if seconds["triton"] <= seconds["torch"]:
        return None
    return (f"slower than the PyTorch path ({seconds['triton'] * 1e3:.2f} ms against {seconds['torch'] * 1e3:.2f} ms "
            f"forward + backward at {b}x{h}x{nq}x{nk})")
