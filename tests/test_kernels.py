"""The fused Triton kernel (nmt/kernels/relative_attention.py) against the literal Eq. 3-4 and the CPU path.

Without a GPU the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py before
anything imports triton); with one, the same tests run the compiled kernels on CUDA.
"""

import warnings

import pytest
import torch

pytest.importorskip("triton")
ON_GPU = torch.cuda.is_available()

from nmt.attention import relation_aware_attention  # noqa: E402
from nmt.config import ConfigError  # noqa: E402
from nmt.kernels import dispatch  # noqa: E402
from nmt.kernels import relative_attention as kernel  # noqa: E402
from nmt.kernels import tiles  # noqa: E402
from nmt.kernels.window import EdgeWindow  # noqa: E402
from nmt.kernels.dispatch import AttentionBackend, KernelFallbackWarning  # noqa: E402
from tests.test_attention import literal_attention, make_inputs  # noqa: E402

DEVICE = "cuda" if ON_GPU else "cpu"
# The interpreter computes in float64 like the literal reference; a GPU's tl.dot takes float32 at best.
DTYPE = torch.float32 if ON_GPU else torch.float64
TOL = dict(rtol=2e-4, atol=2e-4) if ON_GPU else dict(rtol=1e-10, atol=1e-10)


def fused(q, k, v, rk, rv, clip, pad=None, causal=False, q_offset=0, dropout_p=0.0):
    window = EdgeWindow.of(q.shape[2], k.shape[2], clip, q_offset)
    return kernel.relative_attention(q, k, v, rk, rv, window, pad, causal, q_offset, dropout_p)


def inputs(b=2, h=2, nq=5, nk=5, clip=2, shared=False, terms="both", seed=0):
    q, k, v, rk, rv = make_inputs(B=b, H=h, Nq=nq, Nk=nk, D=16, clip=clip, shared=shared, seed=seed)
    rk = rk if terms in ("both", "key") else None
    rv = rv if terms in ("both", "value") else None
    return q, k, v, rk, rv


def on_device(*tensors):
    return [None if t is None else t.to(DEVICE, DTYPE) for t in tensors]


# Shapes that cross block edges (16 x 16 tiles in the interpreter), k = 0, a window narrower than 2k+1,
# decoding's single query at an offset, and more queries than keys.
CASES = [  # nq, nk, clip, causal, q_offset
    (5, 5, 2, False, 0),
    (20, 20, 3, True, 0),
    (18, 33, 0, False, 0),
    (35, 21, 4, False, 0),
    (3, 40, 100, True, 37),
    (1, 9, 2, True, 8),
]


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("terms", ["both", "key", "value"])
@pytest.mark.parametrize("case", CASES)
def test_forward_matches_literal_equations(case, terms, shared):
    nq, nk, clip, causal, q_offset = case
    q, k, v, rk, rv = inputs(nq=nq, nk=nk, clip=clip, shared=shared, terms=terms)
    pad = torch.zeros(2, nk, dtype=torch.bool)
    pad[1, nk - 3 :] = True  # right padding in one row
    if not causal:
        pad[0, :2] = True  # left padding in the other
    want = literal_attention(q, k, v, rk, rv, clip, key_padding_mask=pad, causal=causal, q_offset=q_offset)
    got = fused(*on_device(q, k, v, rk, rv), clip, pad.to(DEVICE), causal, q_offset)
    torch.testing.assert_close(got.cpu().to(want.dtype), want, **TOL)


def test_fully_padded_rows_are_zero_and_get_no_gradient():
    q, k, v, rk, rv = on_device(*inputs(nq=4, nk=6))
    pad = torch.zeros(2, 6, dtype=torch.bool, device=DEVICE)
    pad[1] = True
    leaves = [t.requires_grad_(True) for t in (q, k, v, rk, rv)]
    out = fused(*leaves, 2, pad)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)
    assert torch.equal(k.grad[1], torch.zeros_like(k.grad[1])) and torch.equal(q.grad[1], torch.zeros_like(q.grad[1]))


@pytest.mark.parametrize("terms", ["both", "key", "value"])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[4]])
def test_backward_matches_the_cpu_path(case, shared, terms):
    """Gradients of q, k, v and both tables equal the hand-written CPU backward (itself gradchecked)."""
    nq, nk, clip, causal, q_offset = case
    q, k, v, rk, rv = inputs(nq=nq, nk=nk, clip=clip, shared=shared, terms=terms, seed=1)
    pad = torch.zeros(2, nk, dtype=torch.bool)
    pad[1, nk - 2 :] = True
    weight = torch.linspace(-1, 1, q.numel(), dtype=q.dtype).view_as(q)  # every output element counts differently
    results = []
    for which in ("cpu path", "kernel"):
        device = DEVICE if which == "kernel" else "cpu"
        leaves = [None if t is None else t.detach().to(device, DTYPE).requires_grad_(True) for t in (q, k, v, rk, rv)]
        if which == "kernel":
            out = fused(*leaves, clip, pad.to(device), causal, q_offset)
        else:
            out = relation_aware_attention(*leaves, clip, key_padding_mask=pad, causal=causal, q_offset=q_offset)
        (out * weight.to(device, DTYPE)).sum().backward()
        results.append([out.detach().cpu()] + [None if t is None else t.grad.cpu() for t in leaves])
    for want, got in zip(*results):
        if want is not None:
            torch.testing.assert_close(got, want, **TOL)


# Triton's interpreter multiplies bfloat16 wrongly (a plain 16 x 16 tl.dot is off by 1e10), so bfloat16 is
# checked on GPUs only; float16 goes through the same casts.
HALF = [torch.float16, torch.bfloat16] if ON_GPU else [torch.float16]


@pytest.mark.parametrize("dtype", HALF)
def test_half_precision_forward_and_backward(dtype):
    """What autocast feeds the kernel: half-precision q, k, v and tables; float32 softmax and accumulators."""
    q, k, v, rk, rv = inputs(nq=20, nk=20, clip=3, seed=2)
    pad = torch.zeros(2, 20, dtype=torch.bool)
    pad[1, 15:] = True
    results = []
    for which in ("cpu path", "kernel"):
        if which == "kernel":
            leaves = [t.detach().to(DEVICE, dtype).requires_grad_(True) for t in (q, k, v, rk, rv)]
            out = fused(*leaves, 3, pad.to(DEVICE))
        else:
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, rk, rv)]
            out = relation_aware_attention(*leaves, 3, key_padding_mask=pad)
        out.float().sum().backward()
        assert out.dtype == leaves[0].dtype and all(t.grad.dtype == t.dtype for t in leaves)
        results.append([out] + [t.grad for t in leaves])
    for want, got in zip(*results):
        torch.testing.assert_close(got.cpu().double(), want, rtol=3e-2, atol=3e-2)


def test_dropout_matches_a_reference_with_the_kernels_mask():
    q, k, v, rk, rv = inputs(nq=20, nk=20, clip=2)
    p = 0.3
    torch.manual_seed(5)
    seed = torch.randint(0, 2**31 - 1, (1,), device=DEVICE)  # what relative_attention draws after the same seed
    keep = kernel.dropout_keep_mask(seed, 2, 2, 20, 20, p).cpu()
    assert 0.6 < keep.float().mean() < 0.8  # a real draw, not all-keep
    results = []
    for which in ("reference", "kernel"):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, rk, rv)]
        if which == "reference":
            b = torch.arange(20)[None, :] - torch.arange(20)[:, None]
            b = b.clamp(-2, 2) + 2
            scores = (leaves[0] @ leaves[1].transpose(-1, -2)
                      + torch.einsum("bhid,hijd->bhij", leaves[0], leaves[3][:, b])) / 4.0
            dropped = scores.softmax(-1) * keep / (1 - p)
            out = dropped @ leaves[2] + torch.einsum("bhij,hijd->bhid", dropped, leaves[4][:, b])
        else:
            torch.manual_seed(5)
            dev = on_device(*leaves)
            out = fused(*dev, 2, dropout_p=p).cpu()
        out.pow(2).sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for want, got in zip(*results):
        torch.testing.assert_close(got.to(want.dtype), want, **TOL)


def test_custom_op_is_traceable_without_graph_breaks():
    """torch.compile sees one opaque op with a fake (shape) implementation and a registered backward; the
    dispatch in nmt.attention traces too."""
    q, k, v, rk, rv = (t.requires_grad_(True) for t in on_device(*inputs(nq=6, nk=6, clip=2)))
    pad = torch.zeros(2, 6, dtype=torch.bool, device=DEVICE)
    pad[1, 4:] = True
    backend = AttentionBackend("triton")

    def layer(q, k, v, rk, rv):
        return relation_aware_attention(q, k, v, rk, rv, 2, key_padding_mask=pad, causal=True, backend=backend)

    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    got, want = compiled(q, k, v, rk, rv), layer(q, k, v, rk, rv)
    torch.testing.assert_close(got, want, **TOL)
    grads = torch.autograd.grad(got.sum(), (q, rk, rv))
    torch.testing.assert_close(grads, torch.autograd.grad(want.sum(), (q, rk, rv)), **TOL)


def test_backend_is_configuration(monkeypatch):
    calls = []
    monkeypatch.setattr(kernel, "relative_attention", lambda *a, **kw: calls.append(a))
    q, k, v, rk, rv = inputs()
    relation_aware_attention(q, k, v, rk, rv, 2)  # no backend: the PyTorch path
    relation_aware_attention(q, k, v, rk, rv, 2, backend=AttentionBackend("auto"))  # auto: CUDA only
    assert calls == []
    relation_aware_attention(q, k, v, rk, rv, 2, backend=AttentionBackend("triton"))
    assert len(calls) == 1
    monkeypatch.setenv("RELNMT_ATTENTION", "torch")  # stands in for auto, read once when the backend is made
    assert AttentionBackend("auto").mode.value == "torch" and AttentionBackend("triton").mode.value == "triton"
    monkeypatch.setenv("RELNMT_ATTENTION", "fast")
    with pytest.raises(ConfigError, match="'fast'"):
        AttentionBackend("auto")


# Under auto, a CPU "device" whose kernel runs in the interpreter, in float64 (what the interpreter gets right).
def checked_backend():
    return AttentionBackend("auto", devices=(DEVICE,), dtypes=(DTYPE,), head_dims=(16,))


def layer_run(backend, repeats=2, table_dtype=DTYPE):
    """Output and gradients of one relative layer (one case), run `repeats` times; the edge tables may be kept in
    another dtype than q, k, v (as parameters are under autocast)."""
    q, k, v, rk, rv = inputs(nq=20, nk=20, clip=3, seed=4)
    pad = torch.zeros(2, 20, dtype=torch.bool)
    pad[1, 17:] = True
    for _ in range(repeats):
        leaves = [t.detach().to(DEVICE, dtype).requires_grad_(True)
                  for t, dtype in zip((q, k, v, rk, rv), [DTYPE] * 3 + [table_dtype] * 2)]
        out = relation_aware_attention(*leaves, 3, key_padding_mask=pad.to(DEVICE), backend=backend)
        out.pow(2).sum().backward()
    return [out.detach()] + [t.grad for t in leaves]


def fallback_warnings(record):
    return [w for w in record if issubclass(w.category, KernelFallbackWarning)]


def test_auto_serves_a_case_only_after_its_self_test_passes(monkeypatch):
    launched = []
    real_launch = kernel.launch
    monkeypatch.setattr(kernel, "launch", lambda k, *a, **kw: launched.append(k) or real_launch(k, *a, **kw))
    backend = checked_backend()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = layer_run(backend)
    assert fallback_warnings(record) == []
    assert list(backend.verdicts.values()) == [True]  # one case, checked once
    assert launched.count(kernel.triton_code.forward_kernel) == 1 + 2  # the self-test, then both runs
    for g, w in zip(got, layer_run(None)):
        torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("fault", ["backward launch raises", "wrong numbers"])
def test_a_failing_kernel_gives_the_pytorch_path_with_one_warning(fault, monkeypatch):
    real_launch, real_forward = kernel.launch, kernel.forward
    if fault == "backward launch raises":
        def launch(k, *args, **kw):
            if k is kernel.triton_code.backward_q_kernel:
                raise RuntimeError("simulated launch failure")
            return real_launch(k, *args, **kw)
        monkeypatch.setattr(kernel, "launch", launch)
    else:
        monkeypatch.setattr(kernel, "forward", lambda *a, **kw: (lambda out, lse: (out * 1.01, lse))(
            *real_forward(*a, **kw)))
    backend = checked_backend()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = layer_run(backend)
    assert len(fallback_warnings(record)) == 1
    message = str(fallback_warnings(record)[0].message)
    assert ("simulated launch failure" if fault == "backward launch raises" else "output off by") in message
    assert list(backend.verdicts.values()) == [False]
    for g, w in zip(got, layer_run(None)):
        torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("table_dtype", [DTYPE, torch.float32])
def test_backward_falls_back_when_its_launch_raises_after_the_self_test(table_dtype, monkeypatch):
    monkeypatch.setattr(dispatch, "BACKWARD_FAILED", set())
    backend = checked_backend()
    layer_run(backend, repeats=1, table_dtype=table_dtype)  # passes the self-test
    assert list(backend.verdicts.values()) == [True]
    real_launch = kernel.launch

    def launch(k, *args, **kw):
        if k is kernel.triton_code.backward_kv_kernel:
            raise RuntimeError("simulated launch failure")
        return real_launch(k, *args, **kw)

    monkeypatch.setattr(kernel, "launch", launch)
    forwards = []
    real_forward = kernel.forward
    monkeypatch.setattr(kernel, "forward", lambda *a, **kw: forwards.append(1) or real_forward(*a, **kw))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = layer_run(backend, repeats=3, table_dtype=table_dtype)
    assert len(fallback_warnings(record)) == 1
    assert len(forwards) == 1  # after the failure, the case runs the PyTorch path
    want = layer_run(None, table_dtype=table_dtype)
    assert [g.dtype for g in got] == [w.dtype for w in want]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, **TOL)


def test_a_case_first_met_while_decoding_passes_its_self_test():
    """translate meets its cases under no_grad (and autocast on a GPU): the self-test still runs its backward."""
    backend = checked_backend()
    q, k, v, rk, rv = on_device(*inputs(nq=1, nk=9, clip=2))
    with warnings.catch_warnings(record=True) as record, torch.no_grad():
        warnings.simplefilter("always")
        out = relation_aware_attention(q, k, v, rk, rv, 2, causal=True, q_offset=8, backend=backend)
    assert fallback_warnings(record) == [] and list(backend.verdicts.values()) == [True]
    torch.testing.assert_close(out, relation_aware_attention(q, k, v, rk, rv, 2, causal=True, q_offset=8), **TOL)


def test_launch_grid_fits_cuda_limits_for_any_batch_the_batcher_builds():
    """B * H sits on grid axis 0 (limit 2**31 - 1): 32,768-token batches of 1-token pairs with 16 heads launch."""
    for tokens, heads, length in ((32_768, 16, 1), (25_000, 16, 6), (32_768, 8, 4), (4_096, 8, 250)):
        batch = tokens // length
        for block in (16, 32):
            size = tiles.grid(batch, heads, length, block)
            assert size[0] == batch * heads and all(s <= limit for s, limit in zip(size, tiles.GRID_LIMITS))
            assert tiles.fits_grid(batch, heads, length, block)
    assert not tiles.fits_grid(1, 1, 16 * 65_536, 16)  # a million-token sentence: the PyTorch path


def micro_model(share_heads, backend=None):
    from nmt.model import Transformer
    from tests.conftest import micro_config

    torch.manual_seed(0)
    cfg = micro_config(decoder_layers=2, clip=3, dropout=0.0, share_heads=share_heads)
    return Transformer(cfg, 40, backend).to(DEVICE, DTYPE)


@pytest.mark.parametrize("share_heads", [False, True])
def test_whole_model_through_the_kernel(share_heads):
    """A Transformer's loss and gradients are the same through the kernel as through the CPU path, and its
    incremental decoding (one query at an offset, against the cache) equals teacher forcing."""
    from nmt.model import BOS, PAD
    from tests.test_model import incremental_logits

    g = torch.Generator().manual_seed(3)
    src = torch.randint(4, 40, (2, 7), generator=g)
    src[1, 5:] = PAD
    tgt = torch.cat([torch.full((2, 1), BOS), torch.randint(4, 40, (2, 6), generator=g)], 1)
    src, tgt = src.to(DEVICE), tgt.to(DEVICE)
    results = {}
    for backend in ("torch", "triton"):
        model = micro_model(share_heads, AttentionBackend(backend))
        logits = model(src, tgt)
        logits.logsumexp(-1).sum().backward()
        results[backend] = [logits.detach()] + [p.grad for p in model.parameters()]
        if backend == "triton":
            with torch.no_grad():
                torch.testing.assert_close(incremental_logits(model.eval(), src, tgt), logits.detach(), **TOL)
    for got, want in zip(results["triton"], results["torch"]):
        torch.testing.assert_close(got, want, **TOL)


def _check_on_rank(rank: int, port: int, out_dir: str) -> None:
    import json
    from pathlib import Path

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}")
    cases = [dispatch.Case("cpu", torch.float64, 16, 16, causal, False, True, True, False, not causal, False)
             for causal in (False, True)]
    # rank 1's kernel fails the first case only; the real self-test is what the other tests exercise
    dispatch.self_test = lambda case, device: "simulated mismatch" if rank == 1 and case == cases[0] else None
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        verdicts = AttentionBackend("auto", devices=("cpu",), dtypes=(torch.float64,)).check(cases, torch.device("cpu"))
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(
        {"verdicts": [verdicts[c] for c in cases], "warnings": len(fallback_warnings(record))}))
    dist.destroy_process_group()


def test_ranks_adopt_a_case_only_if_it_passed_on_every_rank(tmp_path):
    import json
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_check_on_rank, args=(port, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result == {"verdicts": [False, True], "warnings": 1}  # one warning per rank for the failed case
