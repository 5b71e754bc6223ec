"""The fused kernel's dispatch (nmt/kernels/dispatch.py): the backend as configuration, the self-test gate per
case, both fallbacks, DDP agreement, and the launch grid. Kernels run in Triton's interpreter on a CPU."""

import itertools
import warnings

import pytest
import torch

pytest.importorskip("triton")

from nmt.config import ConfigError  # noqa: E402
from nmt.kernels import cases, dispatch, tiles  # noqa: E402
from nmt.kernels import relative_attention as kernel  # noqa: E402
from nmt.kernels.dispatch import AttentionBackend, KernelFallbackWarning  # noqa: E402
from nmt.modeling.attention import relation_aware_attention  # noqa: E402
from tests.test_kernels import DEVICE, DTYPE, ON_GPU, TOL, inputs, on_device  # noqa: E402


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
    monkeypatch.setattr(cases, "BACKWARD_FAILED", set())
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
        backend = AttentionBackend("auto", devices=("cpu",), dtypes=(torch.float64,), head_dims=(16,))
        verdicts = backend.check(cases, torch.device("cpu"))
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


def test_only_cases_the_dispatcher_can_send_are_self_tested(monkeypatch):
    """An fp32 CUDA run (or heads the kernel does not take) self-tests nothing: auto would never send those cases."""
    from nmt.config import ModelConfig
    from nmt.modeling.transformer import model_cases

    tested = []
    monkeypatch.setattr(dispatch, "self_test", lambda case, device: tested.append(case))
    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # cases "on CUDA"; the verdicts' tensor on the CPU
    monkeypatch.setattr(dispatch, "TRITON_INSTALLED", True)
    base = ModelConfig()
    AttentionBackend("auto").check(model_cases(base, torch.float32, cuda, training=True), cpu)
    AttentionBackend("auto").check(model_cases(ModelConfig(d_model=64, heads=4), torch.bfloat16, cuda, True), cpu)
    AttentionBackend("auto").check(model_cases(base, torch.bfloat16, cpu, training=True), cpu)
    assert tested == []
    bf16_cases = model_cases(base, torch.bfloat16, cuda, training=True)
    AttentionBackend("auto").check(bf16_cases, cpu)
    assert tested == bf16_cases and len(tested) == 24  # 3 window classes x causal x dropout x decoding tiles


@pytest.mark.parametrize("version, usable", [("3.3.1", False), ("3.4.0", True), ("3.9.0", True)])
def test_triton_before_3_4_is_not_used(version, usable, monkeypatch):
    """Triton 3.3's dropout mask kernel draws another Philox stream than the main kernels: the floor is 3.4."""
    monkeypatch.setattr(dispatch.importlib.metadata, "version", lambda name: version)
    assert dispatch.triton_usable() is usable


def test_the_self_test_catches_a_wrong_gradient_with_a_right_output(monkeypatch):
    """The self-test compares every gradient; its runs must not share gradient tensors (on a CPU in float64 they
    once did, and any gradient passed)."""
    from nmt.config import ModelConfig
    from nmt.kernels.dispatch import self_test
    from nmt.modeling.transformer import model_cases

    real = kernel.relative_attention

    def wrong_dq(q, *args, **kwargs):
        out = real(q, *args, **kwargs)
        return out + (0.5 * q - (0.5 * q).detach())  # the same value, dq off by half

    case = model_cases(ModelConfig(d_model=32, heads=2, clip=3), DTYPE, torch.device(DEVICE), training=False)[0]
    assert self_test(case, torch.device(DEVICE)) is None
    monkeypatch.setattr(kernel, "relative_attention", wrong_dq)
    assert self_test(case, torch.device(DEVICE)).startswith("grad q off by")


@pytest.mark.slow  # tens of seconds: make test stays under 10 minutes
def test_a_passed_case_that_is_slower_than_the_pytorch_path_is_not_adopted(monkeypatch):
    """On CUDA auto times both paths after the self-test and keeps the faster. Here the interpreter is the slow
    kernel; the verdict names both times."""
    from nmt.config import ModelConfig
    from nmt.kernels.dispatch import slower_than_torch
    from nmt.modeling.transformer import model_cases

    case = model_cases(ModelConfig(d_model=32, heads=2, clip=3), DTYPE, torch.device(DEVICE), training=False)[0]
    if not ON_GPU:  # compiled, the kernel may well be the faster one
        cause = slower_than_torch(case, torch.device(DEVICE), repeats=1, shape=(2, 2, 20))
        assert cause.startswith("slower than the PyTorch path") and "ms against" in cause
    # nmt.timing reads the clock around each timed call, the two paths interleaved (kernel, PyTorch, kernel, ...)
    times = itertools.cycle([0.0, 3.0, 0.0, 1.0])  # kernel 3 s per call, PyTorch path 1 s: the PyTorch path
    monkeypatch.setattr("time.perf_counter", lambda: next(times))
    assert "3000.00 ms against 1000.00 ms" in slower_than_torch(case, torch.device(DEVICE), repeats=1, shape=(2, 2, 20))
    times = itertools.cycle([0.0, 1.0, 0.0, 3.0])  # kernel 1 s per call, PyTorch path 3 s: the kernel stays
    monkeypatch.setattr("time.perf_counter", lambda: next(times))
    assert slower_than_torch(case, torch.device(DEVICE), repeats=1, shape=(2, 2, 20)) is None


def test_a_window_wider_than_the_kernel_holds_takes_the_pytorch_path_said_once(monkeypatch):
    """k = 40 over 40 keys reaches 79 edge vectors (> MAX_BUCKETS): the PyTorch path, with one warning per job."""
    calls = []
    monkeypatch.setattr(kernel, "relative_attention", lambda *a, **kw: calls.append(a))
    q, k, v, rk, rv = inputs(nq=40, nk=40, clip=40)
    backend = checked_backend()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            out = relation_aware_attention(*on_device(q, k, v, rk, rv), 40, backend=backend)
    assert calls == [] and out.shape == q.shape
    said = fallback_warnings(record)
    assert len(said) == 1 and "at most 64 edge vectors" in str(said[0].message) and "79" in str(said[0].message)


def test_a_wide_window_under_torch_compile_is_one_graph_and_says_nothing():
    """Under compile the window is the whole table (2k+1 = 81 > 64 rows): the PyTorch path, traced whole
    (fullgraph: a warning would break the graph)."""
    q, k, v, rk, rv = inputs(nq=12, nk=12, clip=40)
    backend = checked_backend()
    fn = torch.compile(lambda *t: relation_aware_attention(*t, 40, backend=backend), fullgraph=True,
                       backend="aot_eager")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        got = fn(*on_device(q, k, v, rk, rv))
    assert fallback_warnings(record) == [] and not backend.wide_logged
    torch.testing.assert_close(got, relation_aware_attention(*on_device(q, k, v, rk, rv), 40), **TOL)
