"""Decoding's self-attention projections as one GEMM: Q, K and V of a step's rows by [W_q; W_k; W_v] (3d, d).

A decoding step multiplies a few rows (the hypotheses) by each weight, where a call's fixed cost is much of its
time: one call of three times the width costs less than three (CTranslate2 fuses them alike). Each output column is
the same dot product as in its own GEMM. For a model loaded to translate (nmt.decoding.decode.load_translator); the
fused matrix is made again if any of the three changes (a version counter moves, or a tensor is another)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.decoding.cpu_linear import PackedWeight, linear
from nmt.modeling.attention import MultiHeadAttention


class FusedQKV:
    """x (B, N, d) -> (B, N, 3d): x @ [W_q; W_k; W_v].T + [b_q; b_k; b_v], by oneDNN with a packed weight where the
    model's linear layers run by oneDNN (nmt.decoding.cpu_linear), else F.linear."""

    def __init__(self, attention: MultiHeadAttention, onednn: bool):
        self.parts = (attention.q_proj, attention.k_proj, attention.v_proj)
        self.onednn, self.key = onednn, None
        self.weight = self.bias = self.packed = None

    def __call__(self, x: Tensor) -> Tensor:
        tensors = [t for part in self.parts for t in (part.weight, part.bias)]
        key = tuple((t.data_ptr(), t._version, t.device, t.dtype) for t in tensors)
        if key != self.key:
            self.key = key
            with torch.inference_mode(False):  # a tensor with a version counter, which PackedWeight keys on
                self.weight = torch.cat([part.weight.detach() for part in self.parts])
                self.bias = torch.cat([part.bias.detach() for part in self.parts])
            self.packed = PackedWeight() if self.onednn else None
        if self.onednn:
            return linear(x, self.weight, self.bias, self.packed)
        return F.linear(x, self.weight, self.bias)


def fuse_self_attention(model: nn.Module, onednn: bool) -> nn.Module:
    """Give each decoder self-attention of `model` its FusedQKV, in place (parameters and state dict unchanged)."""
    for layer in model.decoder:
        layer.self_attn.fused_qkv = FusedQKV(layer.self_attn, onednn)
    return model
