"""The implementations of relation-aware attention behind nmt.modeling.attention: the PyTorch path (torch_attention.py) and
the fused Triton op (relative_attention.py), the dispatcher that chooses between them (dispatch.py) and the
kernel's resource check for GPUs this machine need not have (resources.py)."""
