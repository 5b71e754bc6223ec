"""The resource check (nmt/kernels/resources.py): the fused kernel compiled for sm_90 and sm_80 without a GPU,
through its real launch code, has no register spills and fits shared memory. Needs triton's nvidia backend
(the Linux x86-64 wheel ships ptxas); the interpreter must be off, so it runs in a subprocess."""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("triton")
from nmt.kernels.resources import nvidia_backend_available  # noqa: E402

pytestmark = pytest.mark.skipif(not nvidia_backend_available(), reason="triton without its nvidia backend")


def compile_check(*args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "-m", "nmt.kernels.resources", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**env, "TRITON_DEFAULT_FP_FUSION": "1"}, timeout=600)


def test_the_shipped_models_configurations_compile_within_budget_for_sm90_and_sm80():
    """base (k = 16: 33 edge vectors) and big (k = 8: 17), head size 64, bf16: training and decoding tiles."""
    result = compile_check("--arch", "90", "80", "--only", "bfloat16 D=64 R=", "--jobs", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all within budget" in result.stdout
    rows = [line for line in result.stdout.splitlines() if line.startswith("| sm_")]
    assert len(rows) == 2 * 3 * 2  # targets x edge-window classes x (training, decoding)
    assert all(row.split("|")[5].strip() == "0" for row in rows)  # no spilled byte anywhere


def test_one_compile_serves_every_length():
    """The lengths, the window start and the decoding step are not specialized: n = 40 after n = 48 reuses the
    kernels (Triton would otherwise specialize 48 as divisible by 16 and compile all three again)."""
    code = """
import torch
from nmt.kernels import relative_attention as op, resources
from triton.runtime.driver import driver
driver.set_active(resources._StubDriver(90))
compiled = []
op.launch = lambda kernel, grid, *args, **meta: compiled.append(kernel.warmup(*args, grid=grid, **meta))
for n in (48, 40, 33, 17):
    q = torch.zeros(2, n, 8, 64, dtype=torch.bfloat16).transpose(1, 2)
    table = torch.zeros(8, 33, 64, dtype=torch.bfloat16)
    pad = torch.zeros(2, n, dtype=torch.bool)
    out, lse = op.forward(q, q, q, table, table, pad, None, 16, 0, False, 0, 0.0, compiled=True)
    op.backward(out, q, q, q, table, table, pad, None, out, lse, 16, 0, False, 0, 0.0, compiled=True)
print(len({id(kernel) for kernel in compiled}), len(compiled))
"""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                            env={**env, "TRITON_DEFAULT_FP_FUSION": "1"}, timeout=600)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "12"]  # three kernels, compiled once each for four lengths
