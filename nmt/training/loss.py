"""The training loss: label-smoothed cross-entropy (Szegedy et al. 2016; the paper's epsilon 0.1), from the logits
(smoothed_loss) or from the decoder's output states a chunk of tokens at a time (output_loss).

With z the logits of one token, lse = logsumexp(z), t its target and V the vocabulary:
    nll = lse - z_t,    uniform = lse - mean(z),    loss = (1 - epsilon) nll + epsilon uniform
    d loss / d z = softmax(z) - epsilon / V - (1 - epsilon) onehot(t)
    d nll / d z = d loss / d z - epsilon (onehot(t) - 1 / V)
token_losses and logits_grad are the first two lines, their one home. One autograd function computes both from the
logits without materializing the (tokens, V) log-probabilities, and its backward is that one expression, where the
composite (log_softmax, gather, mean) and its backward took five passes over them (a fill, a division, log_softmax's
backward); benchmarks/train_parts.py times both.

The logits z = h W^T of a micro-batch (h the decoder's output states, W the (V, d) output embedding) are its largest
tensors: 0.5 GiB in fp32 at 4,096 tokens and a 32k vocabulary, and as much again for their gradient. output_loss
never holds them whole: a chunk of tokens at a time it projects, takes the loss and, in the same pass, the loss sum's
gradients with respect to h and W (the backward's two GEMMs, done early: nothing is recomputed). It keeps only those,
(tokens, d) and (V, d); its backward scales them by the upstream gradient, and adds the NLL's difference from the
loss (the last line above: an embedding lookup and a scatter, no GEMM) only when the NLL is differentiated.
"""

from __future__ import annotations

import torch

from nmt.data.vocab import PAD
from nmt.modeling.transformer import tied_output
from nmt.runtime.precision import autocast


def token_losses(logits: torch.Tensor, target: torch.Tensor, epsilon: float):
    """Per-token (loss, nll, lse) of logits (..., V), in float32 at least (logits.float() would round float64
    logits, which gradcheck needs)."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(z, -1)
    nll = lse - z.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    uniform = lse - z.mean(-1)  # epsilon spread evenly over the vocabulary, as F.cross_entropy
    return (1.0 - epsilon) * nll + epsilon * uniform, nll, lse


def logits_grad(logits: torch.Tensor, target: torch.Tensor, lse: torch.Tensor, grad_loss: torch.Tensor,
                grad_nll: torch.Tensor, epsilon: float) -> torch.Tensor:
    """grad_loss * d loss / d z + grad_nll * d nll / d z per token, in lse's dtype:
    (gl + gn) softmax - gl eps / V - (gl (1 - eps) + gn) onehot."""
    grad = (logits.to(lse.dtype) - lse.unsqueeze(-1)).exp_()
    grad.mul_((grad_loss + grad_nll).unsqueeze(-1)).sub_((grad_loss * (epsilon / logits.shape[-1])).unsqueeze(-1))
    return grad.scatter_add_(-1, target.unsqueeze(-1), -(grad_loss * (1.0 - epsilon) + grad_nll).unsqueeze(-1))


class _SmoothedCrossEntropy(torch.autograd.Function):
    """Per-token (loss, nll) from logits (..., V) and targets (...)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, target: torch.Tensor, epsilon: float):
        loss, nll, lse = token_losses(logits, target, epsilon)
        ctx.save_for_backward(logits, target, lse)
        ctx.epsilon = epsilon
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor, grad_nll: torch.Tensor):
        logits, target, lse = ctx.saved_tensors
        return logits_grad(logits, target, lse, grad_loss, grad_nll, ctx.epsilon).to(logits.dtype), None, None


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over non-pad tokens of the label-smoothed loss and of the plain NLL (in float32 at least).

    Padding is masked with torch.where, not indexed away: a boolean index has a data-dependent shape (a device
    sync per micro-batch on CUDA, a graph break under torch.compile)."""
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
    keep = target.ne(PAD)
    return torch.where(keep, loss, 0.0).sum(), torch.where(keep, nll, 0.0).sum()


class _ChunkedOutputLoss(torch.autograd.Function):
    """Sums over non-pad tokens of (loss, nll) of the logits hidden (T, d) @ weight (V, d).T in `dtype`, chunk_tokens
    rows at a time; with need_grad, the loss sum's gradients are taken in the same pass (see the module's doc)."""

    @staticmethod
    def forward(ctx, hidden, weight, target, epsilon: float, chunk_tokens: int, dtype: torch.dtype, need_grad: bool):
        acc = torch.promote_types(dtype, torch.float32)  # sums and gradients
        keep = target.ne(PAD)
        w = weight.to(dtype)
        loss_sum, nll_sum = hidden.new_zeros((), dtype=acc), hidden.new_zeros((), dtype=acc)
        grad_hidden = hidden.new_empty(hidden.shape, dtype=acc) if need_grad else None
        grad_weight = weight.new_zeros(weight.shape, dtype=acc) if need_grad else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h, t, k = hidden[rows].to(dtype), target[rows], keep[rows]
            logits = tied_output(h, w)  # (n, V): the chunk's, the largest tensor here
            loss, nll, lse = token_losses(logits, t, epsilon)
            loss_sum += torch.where(k, loss, 0.0).sum()
            nll_sum += torch.where(k, nll, 0.0).sum()
            if need_grad:  # d loss_sum / d logits: padding rows are 0
                grad_logits = logits_grad(logits, t, lse, k.to(acc), torch.zeros_like(lse), epsilon).to(dtype)
                del logits
                grad_hidden[rows] = grad_logits @ w  # (n, d)
                if grad_weight.dtype == dtype:  # (V, d), accumulated by the GEMM itself: no (V, d) temporary
                    grad_weight.addmm_(grad_logits.t(), h)
                else:
                    grad_weight += grad_logits.t() @ h
        ctx.save_for_backward(grad_hidden, grad_weight, hidden, weight, target)
        ctx.epsilon = epsilon
        ctx.set_materialize_grads(False)  # a sum nobody differentiates (the NLL, in training) comes as None
        return loss_sum, nll_sum

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, grad_nll):
        grad_hidden, grad_weight, hidden, weight, target = ctx.saved_tensors
        scale = sum(g for g in (grad_loss, grad_nll) if g is not None)  # d loss / d z's share of both
        d_hidden, d_weight = grad_hidden * scale, grad_weight * scale
        if grad_nll is not None:  # d nll / d z = d loss / d z - eps (onehot(t) - 1 / V), over the kept tokens
            keep = target.ne(PAD).unsqueeze(-1)
            rate = grad_nll * ctx.epsilon
            lookup = weight.index_select(0, target).to(d_hidden.dtype) - weight.to(d_hidden.dtype).mean(0)  # (T, d)
            d_hidden -= rate * torch.where(keep, lookup, 0.0)
            kept = torch.where(keep, hidden, 0.0).to(d_weight.dtype)  # (T, d)
            onehot_h = torch.zeros_like(d_weight).index_add_(0, target, kept) - kept.sum(0) / weight.shape[0]
            d_weight -= rate * onehot_h
        return d_hidden.to(hidden.dtype), d_weight.to(weight.dtype), None, None, None, None, None


def output_loss(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, epsilon: float,
                chunk_tokens: int, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """smoothed_loss of the logits hidden (..., d) @ weight (V, d).T, taken in `dtype` (the forward's autocast dtype;
    None: hidden's), chunk_tokens tokens at a time (0: the whole logits at once), and its gradients: equal either
    way, to the rounding of a sum's order."""
    dtype = dtype or torch.promote_types(hidden.dtype, weight.dtype)
    hidden, target = hidden.flatten(0, -2), target.flatten()  # (T, d), (T,)
    if chunk_tokens == 0:
        return smoothed_loss(tied_output(hidden.to(dtype), weight.to(dtype)), target, epsilon)
    need_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(hidden.device.type, enabled=False):  # the dtype is explicit
        return _ChunkedOutputLoss.apply(hidden, weight, target, epsilon, chunk_tokens, dtype, need_grad)


def batch_loss(model, output_weight: torch.Tensor, batch, epsilon: float, chunk_tokens: int, device: torch.device,
               amp_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums of a batch's label-smoothed loss and NLL: model (a Transformer, or what training calls around it: DDP,
    torch.compile) up to the decoder's output states under autocast, then output_loss onto output_weight."""
    with autocast(device, amp_dtype):
        hidden = model(batch.src, batch.tgt_in, features_only=True)  # (B, Nt, d)
    return output_loss(hidden, output_weight, batch.tgt_out, epsilon, chunk_tokens, amp_dtype)
