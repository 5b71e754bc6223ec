"""Parameter count of each model preset: python scripts/param_count.py"""

from pathlib import Path

import torch
import yaml

from nmt.config import ModelConfig
from nmt.model import Transformer, count_parameters

ROOT = Path(__file__).resolve().parent.parent
VOCAB = {"tiny": 8000, "base": 32768, "big": 32768}

print("| preset | layers | d_model | heads | FFN | dropout | k | edge tables | vocabulary | parameters | of which edge tables |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for preset, vocab in VOCAB.items():
    fields = yaml.safe_load(open(ROOT / "configs/model" / f"{preset}.yaml"))
    with torch.device("meta"):  # shapes only: no memory for the big model's weights
        model = Transformer(ModelConfig(**fields), vocab)
    edges = sum(p.numel() for n, p in model.named_parameters() if n.endswith(("rel_k", "rel_v")))
    tables = "per layer" if fields["share_heads"] else "per layer and head"
    print(f"| {preset} | {fields['encoder_layers']}+{fields['decoder_layers']} | {fields['d_model']} | "
          f"{fields['heads']} | {fields['ffn_dim']} | {fields['dropout']} | {fields['clip']} | {tables} | "
          f"{vocab:,} | {count_parameters(model):,} | {edges:,} |")
