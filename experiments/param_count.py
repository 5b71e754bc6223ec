"""Parameter count of each model preset: python -m experiments.param_count"""

import torch

from nmt.compose import preset_job
from nmt.modeling.transformer import Transformer, count_parameters

VOCAB = {"tiny": 8000, "base": 32768, "big": 32768}

print("| preset | layers | d_model | heads | FFN | dropout | k | edge tables | vocabulary | parameters | of which edge tables |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for preset, vocab in VOCAB.items():
    cfg = preset_job(f"model={preset}").model  # the schema's defaults under the preset's overrides
    with torch.device("meta"):  # shapes only: no memory for the big model's weights
        model = Transformer(cfg, vocab)
    edges = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("rel_k", "rel_v")))
    tables = "per layer" if cfg.share_heads else "per layer and head"
    print(f"| {preset} | {cfg.encoder_layers}+{cfg.decoder_layers} | {cfg.d_model} | "
          f"{cfg.heads} | {cfg.ffn_dim} | {cfg.dropout} | {cfg.clip} | {tables} | "
          f"{vocab:,} | {count_parameters(model):,} | {edges:,} |")
