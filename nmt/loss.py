"""The training loss: label-smoothed cross-entropy (Szegedy et al. 2016; the paper's epsilon 0.1)."""

from __future__ import annotations

import torch

from nmt.data.vocab import PAD


def smoothed_loss(logits: torch.Tensor, target: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sums over non-pad tokens of the label-smoothed loss and of the plain NLL (in float32).

    Padding is masked with torch.where, not indexed away: a boolean index has a data-dependent shape (a device
    sync per micro-batch on CUDA, a graph break under torch.compile)."""
    log_probs = logits.float().log_softmax(-1)
    keep = target.ne(PAD)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    uniform = -log_probs.mean(-1)  # epsilon spread evenly over the vocabulary, as F.cross_entropy
    loss = (1.0 - epsilon) * nll + epsilon * uniform
    return torch.where(keep, loss, 0.0).sum(), torch.where(keep, nll, 0.0).sum()
