"""Optional fused GPU kernels (Triton) for nmt.attention; each is tested against the CPU path."""
