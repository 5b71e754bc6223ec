"""What each query may see: the keys hidden by padding and, in the decoder, by causality. One mask for the PyTorch
attention path (nmt/kernels/torch_attention.py) and for the position biases that fold it in once per stack
(nmt/modeling/positions.py)."""

from __future__ import annotations

import torch
from torch import Tensor


def attention_mask(nq, nk, key_padding_mask, causal, q_offset, device) -> tuple[Tensor | None, Tensor | None]:
    """(boolean (B or 1, 1, Nq, Nk) mask, True = may not attend; None when nothing is masked) and the rows with no
    visible key at all, (B, 1, Nq, 1) or None: they must give 0, not NaN nor a uniform average."""
    mask = None
    if causal and q_offset < nk - 1:  # from q_offset on, a query sees every key (a decoding step): nothing to mask
        query_pos = torch.arange(q_offset, q_offset + nq, device=device)
        mask = (torch.arange(nk, device=device)[None, :] > query_pos[:, None])[None, None]
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]  # (B, 1, 1, Nk)
        mask = pad if mask is None else (mask | pad)
    empty_rows = None if mask is None or key_padding_mask is None else mask.all(-1, keepdim=True)
    return mask, empty_rows
