"""nmt/training/loss.py: the label-smoothed loss and its hand-written backward, against F.cross_entropy; the chunked
output layer and loss against the whole logits."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.modeling.transformer import Transformer
from nmt.training.loss import output_loss, smoothed_loss
from tests.conftest import micro_config


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


def padded_batch(vocab: int, rows: int = 3, length: int = 9, seed: int = 0):
    """Random source, shifted target in and out of `rows` sentences, right-padded with PAD to different lengths."""
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(4, vocab, (rows, length), generator=g), torch.randint(4, vocab, (rows, length + 1), generator=g)
    for i in range(1, rows):
        src[i, length - 2 * i:] = 0
        tgt[i, length + 1 - 3 * i:] = 0
    return src, tgt[:, :-1], tgt[:, 1:]


def model_grads(model, src, tgt_in, tgt_out, chunk_tokens: int | None, nll_weight: float, dtype=None):
    """The loss, NLL and every parameter's gradient of (loss + nll_weight * nll) / target tokens (the trainer's
    normalization), through the model's whole logits (chunk_tokens=None: model(src, tgt_in) and smoothed_loss, the
    path before output_loss) or output_loss; dropout on, with the same masks for both."""
    model.zero_grad()
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype or torch.float32, enabled=dtype is not None):
        out = model(src, tgt_in, features_only=chunk_tokens is not None)
    if chunk_tokens is None:
        loss, nll = smoothed_loss(out, tgt_out, 0.1)
    else:
        loss, nll = output_loss(out, model.output_weight, tgt_out, 0.1, chunk_tokens, dtype)
    ((loss + nll_weight * nll) / tgt_out.ne(0).sum()).backward()
    return loss.detach(), nll.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("chunk_tokens", [0, 1, 5, 27, 1024])
@pytest.mark.parametrize("nll_weight", [0.0, 0.3])
def test_chunked_output_loss_equals_the_whole_logits(chunk_tokens, nll_weight):
    """output_loss (chunks of tokens, gradients taken in the forward) against the model's whole logits and
    smoothed_loss, in fp32: the loss, the NLL and every parameter's gradient (the tied output embedding's included)
    to 1e-6, with label smoothing and padding, whether the NLL is differentiated or not (the trainer:
    not), chunks of one token, of a size that leaves a remainder, and of more than the batch."""
    torch.manual_seed(0)
    model = Transformer(micro_config(), 61).train()
    src, tgt_in, tgt_out = padded_batch(61)
    want = model_grads(model, src, tgt_in, tgt_out, None, nll_weight)
    got = model_grads(model, src, tgt_in, tgt_out, chunk_tokens, nll_weight)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0.0)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=0.0)
    assert got[2].keys() == want[2].keys()
    for name, grad in want[2].items():  # gradients up to 0.5; some are 0 up to rounding (a key bias's)
        torch.testing.assert_close(got[2][name], grad, rtol=1e-6, atol=1e-6, msg=name)


def test_chunked_output_loss_gradcheck():
    """Its hand-written backward (gradients from the forward, the NLL's correction) against finite differences."""
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 13, (2, 5))
    target[1, 2:] = 0
    assert torch.autograd.gradcheck(lambda h, w: output_loss(h, w, target, 0.1, 3), (hidden, weight))


def test_chunked_output_loss_under_bf16_autocast():
    """The trainer's bf16 path: the projection in bf16 as autocast would take it, the loss and gradients in fp32, the
    same as the whole logits' to bf16's precision."""
    torch.manual_seed(0)
    model = Transformer(micro_config(), 61).train()
    batch = padded_batch(61)
    want = model_grads(model, *batch, None, 0.0, torch.bfloat16)
    got = model_grads(model, *batch, 5, 0.0, torch.bfloat16)
    assert got[0].dtype == torch.float32 and all(g.dtype == torch.float32 for g in got[2].values())
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=0.0)
    scale = max(grad.abs().max().item() for grad in want[2].values())
    for name, grad in want[2].items():  # bf16's 8 bits: within 1% of the largest gradient
        torch.testing.assert_close(got[2][name], grad, rtol=0.0, atol=0.01 * scale, msg=name)


class LargestTensor(TorchDispatchMode):
    """The most elements of any tensor an operator returns while it is on."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("chunk_tokens", [0, 4])
def test_no_tensor_holds_the_whole_logits(chunk_tokens):
    """In the forward and the backward of output_loss, no tensor has more than chunk_tokens x V elements (d < 4:
    the weight's gradient, V x d, is smaller); with chunk_tokens=0 the logits and their gradient hold tokens x V."""
    tokens, vocab = 24, 97
    hidden, weight = torch.randn(tokens, 3, requires_grad=True), torch.randn(vocab, 3, requires_grad=True)
    with LargestTensor() as largest:
        loss, nll = output_loss(hidden, weight, torch.randint(1, vocab, (tokens,)), 0.1, chunk_tokens)
        (loss + nll).backward()
    assert largest.numel == (chunk_tokens or tokens) * vocab
