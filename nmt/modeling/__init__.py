"""The model: the Transformer, relation-aware attention and its edge index, the other position schemes,
masks and dropout (the fused kernels: nmt/kernels/)."""
