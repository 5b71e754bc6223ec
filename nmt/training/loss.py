"""The training loss: label-smoothed cross-entropy (Szegedy et al. 2016; the paper's epsilon 0.1).

With z the logits of one token, lse = logsumexp(z), t its target and V the vocabulary:
    nll = lse - z_t,    uniform = lse - mean(z),    loss = (1 - epsilon) nll + epsilon uniform
    d loss / d z = softmax(z) - epsilon / V - (1 - epsilon) onehot(t)
One autograd function computes both from the logits without materializing the (tokens, V) log-probabilities, and
its backward is that one expression, where the composite (log_softmax, gather, mean) and its backward took five
passes over them (a fill, a division, log_softmax's backward); benchmarks/train_parts.py times both.
"""

from __future__ import annotations

import torch

from nmt.data.vocab import PAD


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-token (loss, nll) from logits (..., V) and targets (...), in float32 at least (logits.float() would
    round float64 logits, which gradcheck needs)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float):
        z = logits.to(torch.promote_types(logits.dtype, torch.float32))
        lse = torch.logsumexp(z, -1)
        nll = lse - z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        uniform = lse - z.mean(-1)  # epsilon spread evenly over the vocabulary, as F.cross_entropy
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        return (1.0 - epsilon) * nll + epsilon * uniform, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        logits, target, lse = ctx.saved_tensors
        eps, vocab = ctx.epsilon, logits.shape[-1]
        # grad_loss * d loss + grad_nll * d nll = (gl + gn) softmax - gl eps / V - (gl (1 - eps) + gn) onehot
        grad = (logits.to(lse.dtype) - lse.unsqueeze(-1)).exp_()
        grad.mul_((grad_loss + grad_nll).unsqueeze(-1)).sub_((grad_loss * (eps / vocab)).unsqueeze(-1))
        grad.scatter_add_(-1, target.unsqueeze(-1), -(grad_loss * (1.0 - eps) + grad_nll).unsqueeze(-1))
        return grad.to(logits.dtype), None, None


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over non-pad tokens of the label-smoothed loss and of the plain NLL (in float32 at least).

    Padding is masked with torch.where, not indexed away: a boolean index has a data-dependent shape (a device
    sync per micro-batch on CUDA, a graph break under torch.compile)."""
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
    keep = target.ne(PAD)
    return torch.where(keep, loss, 0.0).sum(), torch.where(keep, nll, 0.0).sum()
