"""Linear layers through oneDNN for decoding on x86 CPUs that are not Intel's.

PyTorch's CPU builds multiply float32 matrices with Intel MKL, which takes a slow path on other vendors' CPUs: on
a 2-core AMD EPYC (family 26), a whole decode ran 1.62x (greedy) and 1.64x (beam 4) faster with oneDNN
(also inside PyTorch) for the linear layers (`python -m benchmarks.deploy`, results/deploy/deploy.json,
`gemm_library`). CTranslate2 makes the same choice: MKL on Intel, oneDNN elsewhere. The two libraries round
differently, so this is for inference (translation, export checks), not for training: a run's arithmetic does not
depend on the machine it resumes on.
"""

from __future__ import annotations

import platform
from functools import cache

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.machine import cpuinfo


@cache
def onednn_preferred() -> bool:
    """True on an x86 CPU whose vendor is not Intel, where PyTorch has oneDNN (CTranslate2's rule)."""
    if platform.machine().lower() not in ("x86_64", "amd64") or not torch.backends.mkldnn.is_available():
        return False
    vendors = set(cpuinfo("vendor_id"))  # none where not Linux: keep PyTorch's own choice
    return bool(vendors) and "GenuineIntel" not in vendors


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, packed: "PackedWeight | None" = None,
           post: str = "none") -> Tensor:
    """x @ weight.T + bias by oneDNN for float32 CPU tensors outside autograd and autocast (translate's bf16),
    F.linear otherwise. packed: weight's copy in oneDNN's own layout, used where it gives the same bits. post:
    "relu" applies max(0, .) to the output in the GEMM's own pass (oneDNN's post-op), not in a pass of its own."""
    if (x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32
            or torch.is_autocast_enabled("cpu")
            or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))):
        out = F.linear(x, weight, bias)
        return out.relu_() if post == "relu" else out
    if packed is not None and x.numel() > x.shape[-1]:  # one row takes another kernel, which packing changes
        weight = packed.of(weight)
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post, [], "")


# The row count oneDNN lays a packed weight out for: a decoding step's rows (hypotheses) are tens to thousands.
PACKED_FOR_ROWS = 1024


class PackedWeight:
    """A weight reordered once into oneDNN's blocked layout, so that a decoding step's GEMMs do not reorder it
    again at every call (1.0-1.5x faster per GEMM here, the most at a few dozen rows; bit-identical results for two
    rows or more). Packed again if the weight changes (its version counter moves, or it is another tensor)."""

    def __init__(self):
        self.key, self.packed = None, None

    def of(self, weight: Tensor) -> Tensor:
        key = (weight.data_ptr(), weight._version, weight.shape)
        if key != self.key:
            self.key, self.packed = key, torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_FOR_ROWS)
        return self.packed


class OneDNNLinear(nn.Linear):
    """nn.Linear with the same parameters and state dict, computed by `linear` above with a packed weight."""

    packed: PackedWeight
    post = "none"  # "relu": the ReLU after it, done in its pass (use_onednn: a feed-forward block's first layer)

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.packed, self.post)


class OneDNNOutput:
    """A tied output projection (logits = h @ embedding.T) computed by `linear` with the embedding packed."""

    def __init__(self):
        self.packed = PackedWeight()

    def __call__(self, h: Tensor, embedding: Tensor) -> Tensor:
        return linear(h, embedding, None, self.packed)


def use_onednn(model: nn.Module) -> nn.Module:
    """Route every linear layer of `model` (and a model's tied output projection, `output_linear`) through oneDNN,
    in place; parameters and state dict are unchanged. A linear layer followed by a ReLU (the feed-forward blocks)
    applies it in its own pass, and the ReLU module becomes an identity (its place, and so the state dict's names,
    kept)."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = OneDNNLinear
            module.packed = PackedWeight()
    for module in model.modules():
        if isinstance(module, nn.Sequential):
            for i in range(len(module) - 1):
                if type(module[i]) is OneDNNLinear and type(module[i + 1]) is nn.ReLU:
                    module[i].post, module[i + 1] = "relu", nn.Identity()
    if hasattr(model, "output_linear"):
        model.output_linear = OneDNNOutput()
    return model
