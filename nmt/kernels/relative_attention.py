"""Relation-aware attention (Eq. 3-5) as one flash-style Triton pass: O(N) memory, no (N, N) tensor.

Each program owns a block of query rows of one (batch, head) and streams the key blocks through an online
softmax (FlashAttention). The two relative terms ride along:
- a^K (Eq. 4): the block's queries against the 2k+1 edge vectors once, (M, R), then gathered per pair by
  its distance bucket and added to the scores;
- a^V (Eq. 3): sum_j alpha_ij w^V_{clip(j-i)} = sum_r m_ir w^V_r, so each query row carries its R bucket
  masses m_ir, rescaled with the running maximum like the output accumulator. Inside the window a bucket
  holds exactly one key per row (j = i + r - k), so a key block's masses are a gather, not a scatter; the
  two edge buckets take the row sums of the keys beyond the window. The masses meet the table once, at the end.
Backward recomputes the probabilities from the saved log-sum-exp (two kernels: dK/dV per key block, dQ per
query block, which also sums the probabilities and the score gradients into buckets again); the tables'
gradients are small GEMMs over those bucket sums, outside the kernels. Only q, k, v, the output and the
log-sum-exp are kept for backward.
Dropout on the probabilities draws from Philox by (batch-head, i, j), so backward redraws the same mask.

Only the window of edge vectors that the lengths reach goes to the kernels (nmt/kernels/window.py), so the
paper's k = 256 costs no more than k = N. The whole thing is a torch custom op: torch.compile treats it as one
opaque node (no graph break) and autograd calls the backward op.
The device code is in nmt/kernels/relative_attention_triton.py; this file is the op around it. Tests run
the kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1).
"""

import math
import warnings
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.utils.flop_counter import register_flop_formula

from nmt.kernels import cases
from nmt.kernels import relative_attention_triton as triton_code
from nmt.kernels.cases import KernelFallbackWarning, case_of
from nmt.kernels.kernel_args import Meta, Sizes, Strides
from nmt.kernels.tiles import Tiles, buckets_block, choose_tiles, grid, head_block
from nmt.kernels.window import EdgeWindow


def _meta(q: Tensor, rel_k, rel_v, key_padding_mask, causal: bool, dropout_p: float, r: int,
          tiles: Tiles) -> Meta:
    return Meta(
        HAS_RK=rel_k is not None, HAS_RV=rel_v is not None, HAS_KPM=key_padding_mask is not None,
        CAUSAL=causal, DROPOUT=dropout_p > 0.0, ACC=tl.float64 if q.dtype == torch.float64 else tl.float32,
        BLOCK_M=tiles.block_m, BLOCK_N=tiles.block_n, BLOCK_D=head_block(q.shape[-1]), BLOCK_R=buckets_block(r),
        # fp32 runs here only when asked for by name or in the interpreter: auto sends it to the PyTorch path
        PREC="ieee" if q.dtype in (torch.float32, torch.float64) else "tf32",  # tf32: ignored for bf16/fp16
    )


def _table(table: Optional[Tensor], dtype) -> Tensor | None:
    """The table contiguous, in the compute dtype."""
    return None if table is None else table.to(dtype).contiguous()


def _key_padding(key_padding_mask: Optional[Tensor]) -> Tensor | None:
    return None if key_padding_mask is None else key_padding_mask.to(torch.int8).contiguous()


def _rows(t: Tensor) -> Tensor:
    """The tensor with unit stride along the head dimension (what the kernels' loads assume)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_dtypes(*tensors: Tensor) -> None:
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        raise TypeError(f"relative_attention: q, k, v (and the output gradient) must share one dtype, got {dtypes}")


def launch(kernel, launch_grid, *args, **constexprs):
    """Every kernel launch goes through here; nmt.kernels.resources swaps in `kernel.warmup` to compile the
    real argument lists for a GPU it does not have."""
    return kernel[launch_grid](*args, **constexprs)


@dataclass
class _Launch:
    """What the forward and both backward kernels share: inputs in kernel layout, tables, sizes, lengths, Meta."""

    q: Tensor
    k: Tensor
    v: Tensor
    rk: Tensor | None
    rv: Tensor | None
    kpm: Tensor | None
    r: int
    tiles: Tiles
    sizes: Sizes
    lengths: tuple  # NQ, NK, R, LO, Q_OFFSET: separate parameters (never specialized)
    meta: Meta

    @classmethod
    def build(cls, q, k, v, rel_k, rel_v, key_padding_mask, clip, lo, causal, q_offset, dropout_p, compiled=None):
        _check_dtypes(q, k, v)
        _, h, nq, d = q.shape
        rk, rv = _table(rel_k, q.dtype), _table(rel_v, q.dtype)
        r = (rk if rk is not None else rv).shape[-2]
        compiled = q.is_cuda if compiled is None else compiled
        tiles = choose_tiles(nq, head_block(d), buckets_block(r), compiled)
        return cls(_rows(q), _rows(k), _rows(v), rk, rv, _key_padding(key_padding_mask), r, tiles,
                   Sizes(h, d, clip, 1.0 / math.sqrt(d), dropout_p), (nq, k.shape[2], r, lo, q_offset),
                   _meta(q, rel_k, rel_v, key_padding_mask, causal, dropout_p, r, tiles))

    def grid(self, n: int, block: int) -> tuple[int, int]:
        return grid(self.q.shape[0], self.q.shape[1], n, block)

    def inputs(self, seed: Tensor | None) -> tuple:
        """The tensors every kernel starts with: q, k, v, the tables, the key padding mask, the dropout seed."""
        return self.q, self.k, self.v, self.rk, self.rv, self.kpm, seed

    def strides(self, rows: Tensor) -> Strides:
        """The kernels' strides, with `rows` the output (forward) or its gradient (backward)."""
        return Strides(*(t.stride()[:3] for t in (self.q, self.k, self.v, rows)),
                                   *(0 if t is None or t.dim() == 2 else t.stride(0) for t in (self.rk, self.rv)))

    def launch(self, kernel, n: int, block: int, *tensors: Tensor | None, rows: Tensor) -> None:
        """Launch `kernel` over n rows in blocks of `block`: `tensors`, then the arguments every kernel shares."""
        launch(kernel, self.grid(n, block), *tensors, self.strides(rows), self.sizes, *self.lengths,
               **self.meta._asdict(), num_warps=self.tiles.num_warps)


def forward(q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p,
            compiled=None) -> tuple[Tensor, Tensor]:
    """Output (B, H, Nq, D), laid out (B, N, H, D) in memory, and the rows' log-sum-exp (B, H, Nq)."""
    args = _Launch.build(q, k, v, rel_k, rel_v, key_padding_mask, clip, lo, causal, q_offset, dropout_p, compiled)
    b, h, nq, d = q.shape
    # (B, N, H, D) in memory: the layer's merge of the heads is then a view, and one copy less is kept for backward
    out = torch.empty(b, nq, h, d, dtype=q.dtype, device=q.device).transpose(1, 2)
    lse = torch.empty(b, h, nq, dtype=torch.float32 if q.dtype != torch.float64 else q.dtype, device=q.device)
    args.launch(triton_code.forward_kernel, nq, args.tiles.block_m, *args.inputs(seed), out, lse, rows=out)
    return out, lse


def backward(grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse, clip, lo, causal, q_offset,
             dropout_p, compiled=None) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dQ, dK, dV and per-row bucket sums of the score gradients and of the probabilities (for the gradients
    of the a^K and a^V tables)."""
    args = _Launch.build(q, k, v, rel_k, rel_v, key_padding_mask, clip, lo, causal, q_offset, dropout_p, compiled)
    grad_out = _rows(grad_out.to(q.dtype))
    b, h, nq, _ = q.shape
    delta = (grad_out.to(lse.dtype) * out.to(lse.dtype)).sum(-1).contiguous()  # dO_i . out_i
    # written in (B, H, N, D) order whatever the inputs' strides (heads are usually a transposed view)
    grad_q, grad_k, grad_v = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    ds_mass = torch.zeros(b, h, nq, args.r if args.rk is not None else 0, dtype=lse.dtype, device=q.device)
    p_mass = torch.zeros(b, h, nq, args.r if args.rv is not None else 0, dtype=lse.dtype, device=q.device)
    inputs = (*args.inputs(seed), grad_out, lse, delta)
    args.launch(triton_code.backward_kv_kernel, k.shape[2], args.tiles.block_n, *inputs, grad_k, grad_v, rows=grad_out)
    args.launch(triton_code.backward_q_kernel, nq, args.tiles.block_m, *inputs, grad_q,
                ds_mass if args.rk is not None else None, p_mass if args.rv is not None else None, rows=grad_out)
    return grad_q, grad_k, grad_v, ds_mass, p_mass


@torch.library.custom_op("relnmt::relative_attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, rel_k: Optional[Tensor], rel_v: Optional[Tensor],
                  key_padding_mask: Optional[Tensor], seed: Optional[Tensor], clip: int, lo: int, causal: bool,
                  q_offset: int, dropout_p: float, fallback: bool) -> tuple[Tensor, Tensor]:
    """fallback: if the backward kernel raises (eager), take the gradients from the PyTorch path."""
    return forward(q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p)


@_attention_op.register_fake
def _(q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p, fallback):
    b, h, nq, _ = q.shape
    out = q.new_empty((b, nq, h, q.shape[-1])).transpose(1, 2)
    return out, q.new_empty((b, h, nq), dtype=torch.float32 if q.dtype != torch.float64 else q.dtype)


@torch.library.custom_op("relnmt::relative_attention_backward", mutates_args=())
def _backward_op(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, rel_k: Optional[Tensor], rel_v: Optional[Tensor],
                 key_padding_mask: Optional[Tensor], seed: Optional[Tensor], out: Tensor, lse: Tensor, clip: int,
                 lo: int, causal: bool, q_offset: int, dropout_p: float
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return backward(grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse, clip, lo, causal, q_offset,
                    dropout_p)


@_backward_op.register_fake
def _(grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse, clip, lo, causal, q_offset, dropout_p):
    b, h, nq, _ = q.shape
    r = (rel_k if rel_k is not None else rel_v).shape[-2]
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((b, h, nq, r if rel_k is not None else 0), dtype=lse.dtype),
            q.new_empty((b, h, nq, r if rel_v is not None else 0), dtype=lse.dtype))


def _setup_context(ctx, inputs, output):
    q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset, dropout_p, fallback = inputs
    out, lse = output  # O(N): no (N, N) tensor and no bucket masses are kept
    ctx.save_for_backward(q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse)
    ctx.args = (clip, lo, causal, q_offset, dropout_p)
    ctx.fallback = fallback


def _edge_table_grad(weights: Tensor, x: Tensor, table: Tensor) -> Tensor:
    """sum over (b, i) of bucket weights (B, H, Nq, R) times rows x (B, H, Nq, D): (H, R, D), or (R, D) shared."""
    grad = torch.einsum("bhir,bhid->hrd", weights, x.to(weights.dtype))
    return (grad.sum(0) if table.dim() == 2 else grad).to(table.dtype)


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse = ctx.saved_tensors
    try:
        grad_q, grad_k, grad_v, ds_mass, p_mass = _backward_op(
            grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, out, lse, *ctx.args)
    except torch.OutOfMemoryError:
        raise
    except Exception as err:  # eager only: a compiled graph launches the op itself (the self-test guards it)
        if not ctx.fallback:
            raise
        return (*_pytorch_path_grads(grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, *ctx.args, err),
                *[None] * 8)
    scale = 1.0 / math.sqrt(q.shape[-1])
    grad_rel_k = None if rel_k is None else _edge_table_grad(ds_mass, q, rel_k) * scale
    grad_rel_v = None if rel_v is None else _edge_table_grad(p_mass, grad_out, rel_v)
    return grad_q, grad_k, grad_v, grad_rel_k, grad_rel_v, None, None, None, None, None, None, None, None


def _pytorch_path_grads(grad_out, q, k, v, rel_k, rel_v, key_padding_mask, seed, clip, lo, causal, q_offset,
                        dropout_p, err) -> list:
    """Gradients of q, k, v and the tables from the PyTorch path (with the kernel's dropout mask), after the
    backward kernel raised; the case is then kept off the kernel, with one warning."""
    from nmt.kernels.torch_attention import reference_attention

    case = case_of(q, rel_k, rel_v, (rel_k if rel_k is not None else rel_v).shape[-2], key_padding_mask is not None,
                   causal, dropout_p)
    if case not in cases.BACKWARD_FAILED:
        cases.BACKWARD_FAILED.add(case)
        warnings.warn(f"fused relative attention backward failed for {case} ({type(err).__name__}: {err}); "
                      "gradients from the PyTorch path, which serves this case from now on",
                      KernelFallbackWarning, stacklevel=2)
    b, h, nq, _ = q.shape
    keep = None if seed is None else dropout_keep_mask(seed, b, h, nq, k.shape[2], dropout_p)
    # the tables in q's dtype, as the forward op used them; their gradients go back in the tables' own dtype
    leaves = [None if t is None else t.detach().to(q.dtype).requires_grad_(True) for t in (q, k, v, rel_k, rel_v)]
    with torch.enable_grad(), torch.autocast(q.device.type, enabled=False):
        window = EdgeWindow(clip, lo, lo + (rel_k if rel_k is not None else rel_v).shape[-2] - 1)
        out = reference_attention(*leaves, window, key_padding_mask, causal, q_offset, keep, dropout_p)
        grads = torch.autograd.grad(out, [t for t in leaves if t is not None], grad_out.to(out.dtype))
    grads = iter(grads)
    return [None if t is None else next(grads).to(t.dtype) for t in (q, k, v, rel_k, rel_v)]


_attention_op.register_autograd(_backward, setup_context=_setup_context)


def relative_attention(q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None,
                       window: EdgeWindow, key_padding_mask: Tensor | None = None, causal: bool = False,
                       q_offset: int = 0, dropout_p: float = 0.0, seed: Tensor | None = None,
                       fallback: bool = True) -> Tensor:
    """Eq. 3-5 like nmt.modeling.attention.relation_aware_attention, over the window's edge vectors of the (2k+1)-row
    tables. At least one table must be given.
    seed: the dropout draw's (1,) int64 seed; by default drawn on the device (no host sync), and only when there
    is dropout (decoding and eval launch nothing for it)."""
    if seed is None and dropout_p > 0.0:
        seed = torch.randint(0, 2**31 - 1, (1,), device=q.device)
    out, _ = _attention_op(q, k, v, window.cut(rel_k), window.cut(rel_v), key_padding_mask, seed, window.clip,
                           window.lo, causal, q_offset, dropout_p, fallback)
    return out


def dropout_keep_mask(seed: Tensor, b: int, h: int, nq: int, nk: int, dropout_p: float) -> Tensor:
    """The (B, H, Nq, Nk) keep mask the kernels draw for `seed` (for tests against a reference)."""
    keep = torch.empty(b * h, nq, nk, dtype=torch.int8, device=seed.device)
    triton_code.draw_keep_kernel[(b * h, nq)](seed, keep, nq, nk, dropout_p,
                                              BLOCK_N=max(16, triton.next_power_of_2(nk)))
    return keep.view(b, h, nq, nk).bool()


# FLOPs for torch.utils.flop_counter (the benchmarks' MFU), counted as its SDPA formulas count them, so relative
# and absolute models are measured alike: forward QK^T and PV; backward the scores recomputed, dP, dV, dQ, dK
# (the kernel recomputes the scores once more in its dQ pass: work, not useful FLOPs). Each table adds one
# (Nq x R x D) product each way: q against a^K and the bucket masses against a^V forward, their gradients'
# counterparts backward; the tables' own gradients are einsums outside the op, which the counter sees itself.
# FlopCounterMode copies the registry when it is made: import this module first.
def _flops(q_shape, k_shape, rel_k_shape, rel_v_shape, products: int, table_products: int) -> int:
    b, h, nq, d = q_shape
    pairs = products * 2 * b * h * nq * k_shape[2] * d
    tables = sum(table_products * 2 * b * h * nq * shape[-2] * d for shape in (rel_k_shape, rel_v_shape) if shape)
    return pairs + tables


@register_flop_formula(torch.ops.relnmt.relative_attention)
def _forward_flops(q_shape, k_shape, v_shape, rel_k_shape, rel_v_shape, *args, out_shape=None, **kwargs) -> int:
    return _flops(q_shape, k_shape, rel_k_shape, rel_v_shape, products=2, table_products=1)


@register_flop_formula(torch.ops.relnmt.relative_attention_backward)
def _backward_flops(grad_out_shape, q_shape, k_shape, v_shape, rel_k_shape, rel_v_shape, *args, out_shape=None,
                    **kwargs) -> int:
    return _flops(q_shape, k_shape, rel_k_shape, rel_v_shape, products=5, table_products=1)

