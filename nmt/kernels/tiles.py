"""The fused kernel's launch geometry: tile shapes, register blocks and the grid, in plain Python (no Triton),
so the dispatcher can judge a call on any machine."""

from __future__ import annotations

from dataclasses import dataclass

# Widest window of edge vectors (R = 2k+1, or the part of it the lengths reach) kept in registers per row:
# the dQ kernel spilled at 128 with every tile tried (python -m nmt.kernels.resources).
MAX_BUCKETS = 64
# CUDA's grid limits: axis 0 (B * H here) up to 2**31 - 1, axis 1 (row or key blocks) up to 65,535.
GRID_LIMITS = (2**31 - 1, 65_535)


@dataclass(frozen=True)
class Tiles:
    """Block shapes and warps of one launch, chosen from compiles for sm_90 and sm_80 without spills
    (python -m nmt.kernels.resources; docs/gpu.md's table): 64 x 64 tiles spilled up to 3.5 KB per thread."""

    block_m: int  # query rows per program
    block_n: int  # keys per inner step (and per program in the dK/dV kernel)
    num_warps: int


def choose_tiles(nq: int, head_block: int, buckets_block: int, compiled: bool) -> Tiles:
    """Tiles for a launch. 32 x 32 spill-free up to head size 64 with 32 edge vectors (big: k = 8); 16-row
    blocks for wider heads or windows (base: k = 16, 33 vectors) and for decoding's single query. The
    interpreter (tests on a CPU) is quickest with the smallest tile tl.dot takes."""
    if not compiled:
        return Tiles(16, 16, 4)
    small = nq <= 16 or head_block > 64 or buckets_block > 32
    return Tiles(16 if small else 32, 32, 4)


def grid(b: int, h: int, n: int, block: int) -> tuple[int, int]:
    """One program per (batch-head, block of n): B * H on axis 0, whose limit no batch reaches."""
    return b * h, -(-n // block)


def fits_grid(b: int, h: int, n: int, block: int = 16) -> bool:
    return all(size <= limit for size, limit in zip(grid(b, h, n, block), GRID_LIMITS))


def head_block(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())


def buckets_block(r: int) -> int:
    return max(16, 1 << (r - 1).bit_length())
