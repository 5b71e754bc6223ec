"""nmt/training/loss.py: the label-smoothed loss and its hand-written backward, against F.cross_entropy."""

import pytest
import torch

from nmt.training.loss import smoothed_loss


def test_smoothed_loss_matches_cross_entropy():
    logits, target = torch.randn(2, 5, 11), torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0  # PAD
    loss, nll = smoothed_loss(logits, target, 0.1)
    want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0,
                                             label_smoothing=0.1, reduction="sum")
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(nll, torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=0, reduction="sum"))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_smoothed_loss_gradients_are_cross_entropys(dtype):
    """nmt/training/loss.py's hand-written backward (softmax - eps / V - (1 - eps) onehot) against autograd through
    F.cross_entropy, for any weights of the two outputs, padding included."""
    torch.manual_seed(0)
    logits = torch.randn(3, 6, 17, dtype=dtype, requires_grad=True)
    target = torch.randint(1, 17, (3, 6))
    target[2, 2:] = 0
    loss, nll = smoothed_loss(logits, target, 0.1)
    got = torch.autograd.grad(loss + 0.3 * nll, logits)[0]
    ce = lambda smoothing: torch.nn.functional.cross_entropy(  # noqa: E731
        logits.flatten(0, 1), target.flatten(), ignore_index=0, label_smoothing=smoothing, reduction="sum")
    want = torch.autograd.grad(ce(0.1) + 0.3 * ce(0.0), logits)[0]
    torch.testing.assert_close(got, want)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda z: smoothed_loss(z, target, 0.1), (logits,))


def test_smoothed_loss_of_bf16_logits_is_float32_with_bf16_gradients():
    logits = torch.randn(2, 5, 11).bfloat16().requires_grad_()
    loss, _ = smoothed_loss(logits, torch.randint(1, 11, (2, 5)), 0.1)
    loss.backward()
    assert loss.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16


def test_smoothed_loss_has_no_data_dependent_shape():
    """The loss traces as one graph (fullgraph=True fails on a boolean index, which also syncs CUDA every micro-batch)
    and gives the eager numbers."""
    logits, target = torch.randn(3, 7, 13), torch.randint(1, 13, (3, 7))
    target[0, 4:] = 0
    traced = torch.compile(smoothed_loss, fullgraph=True, backend="eager")
    for got, want in zip(traced(logits, target, 0.1), smoothed_loss(logits, target, 0.1)):
        torch.testing.assert_close(got, want)
