"""A run's default output folder, outputs/<model>_<data>[.<model overrides>] (configs/train.yaml's hydra.run.dir,
through these two resolvers): an ablation gets its own folder, never the preset's, and never resumes another run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional


def model_overrides_suffix(overrides) -> str:
    """".clip-4.rel_value-false" for a run's model.* overrides, "" for none: the default output folder of an
    ablation (configs/train.yaml) is its own, not the preset's, so it never tries to resume another model's run.
    Only letters, digits, "_", "-" and ".": the folder can be passed back as an override value unquoted."""
    plain = [str(o).lstrip("+").replace("~model.", "model.no-", 1) for o in overrides]  # ++model.x=, ~model.x
    picked = sorted(o.removeprefix("model.").replace("=", "-") for o in plain if o.startswith("model."))
    return "".join("." + re.sub(r"[^A-Za-z0-9_.-]", "-", name) for name in picked)


def data_label(preset: str, src: str, tgt: str, train: Optional[str]) -> str:
    """The data part of a run's default folder: the preset's name, which names corpus and pair
    (multi30k_en_de); for data=local the pair and the training files' folder and prefix too
    (local_en_fr.europarl_train), so two local corpora never share, and never resume, one run."""
    if preset != "local" or not train:
        return preset
    corpus = "_".join(part for part in (Path(train).parent.name, Path(train).name) if part)
    return f"local_{src}_{tgt}." + re.sub(r"[^A-Za-z0-9_-]", "-", corpus)
