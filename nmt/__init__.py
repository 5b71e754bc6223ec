"""relnmt: Self-Attention with Relative Position Representations (Shaw et al. 2018)."""
