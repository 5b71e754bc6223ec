"""nmt/kernels/dropout.py: the CPU mask's statistics, and dropout as x * keep * scale forward and backward."""

import pytest
import torch

from nmt.kernels.dropout import LANES, Dropout, dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_every_lane_keeps_the_stated_fraction(p):
    """Each of the four 16-bit lanes of a 64-bit word is uniform: a lane with a constant bit (a sign bit never set)
    would keep far more or fewer of every fourth element."""
    torch.manual_seed(0)
    n = 1 << 22
    keep, scale = keep_mask((n,), p, torch.device("cpu"))
    kept = 1 - round(p * LANES) / LANES
    assert scale == pytest.approx(1 / kept, rel=1e-12)  # the expectation is x exactly
    sigma = (kept * (1 - kept) / (n // 4)) ** 0.5
    for lane in range(4):
        assert abs(keep[lane::4].double().mean().item() - kept) < 5 * sigma


def test_forward_and_backward_are_the_mask_times_the_scale():
    x = torch.randn(3, 50, 64, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    out = dropout(x, 0.2)
    grad = torch.randn_like(out)
    out.backward(grad)
    torch.manual_seed(5)
    keep, scale = keep_mask(tuple(x.shape), 0.2, x.device)
    assert 0.7 < keep.double().mean().item() < 0.9  # the mask drops about p of the elements
    torch.testing.assert_close(out, x.detach() * keep * scale, rtol=0, atol=0)
    torch.testing.assert_close(x.grad, grad * keep * scale, rtol=0, atol=0)
    # F.dropout's scale 1 / (1 - p) and the mask's exact inverse differ by under 1e-4 of the value
    torch.testing.assert_close(out, x.detach() * keep / (1 - 0.2), rtol=1e-4, atol=0)


def test_the_draw_follows_the_generator_state():
    """A resumed run restores torch's RNG state and must draw the same masks."""
    torch.manual_seed(1)
    state = torch.get_rng_state()
    first = dropout(torch.ones(1000), 0.1)
    torch.set_rng_state(state)
    assert torch.equal(dropout(torch.ones(1000), 0.1), first)
    assert not torch.equal(dropout(torch.ones(1000), 0.1), first)


def test_evaluation_and_zero_rate_are_the_identity():
    x = torch.randn(4, 8)
    module = Dropout(0.1).eval()
    assert module(x) is x and dropout(x, 0.0) is x
    assert module.state_dict() == {} and isinstance(module, torch.nn.Dropout)  # checkpoints unchanged


def test_bf16_stays_bf16():
    x = torch.randn(16, 32, dtype=torch.bfloat16, requires_grad=True)
    out = dropout(x, 0.1)
    out.sum().backward()
    assert out.dtype == x.grad.dtype == torch.bfloat16


def test_dropout_traces_as_one_graph():
    """Under torch.compile (train.compile=true) the in-place draw would break the graph at every dropout site:
    the compiled path takes F.dropout and torch.rand masks, which it fuses."""
    x = torch.ones(64, 32)
    out = torch.compile(dropout, fullgraph=True, backend="eager")(x, 0.25)
    keep, _ = torch.compile(keep_mask, fullgraph=True, backend="eager")((64, 32), 0.25, x.device)
    # 2,048 draws at 0.25: the kept share's sd is 0.0096, so 0.04 is four of them and a rate of 0.2 or 0.3 fails
    assert abs(out.ne(0).float().mean().item() - 0.75) < 0.04 and abs(keep.float().mean().item() - 0.75) < 0.04
    assert torch.allclose(out[out.ne(0)], torch.tensor(1 / 0.75))
