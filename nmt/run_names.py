"""A run's default output folder, outputs/<model>_<data>[.<model overrides>] (configs/train.yaml's hydra.run.dir,
through these two resolvers): an ablation gets its own folder, never the preset's, and never resumes another run."""

from __future__ import annotations

import hashlib
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


def cell_name(overrides) -> str:
    """A -m sweep cell's folder under the sweep's (configs/train.yaml's hydra.sweep.subdir): the overrides that define
    its run, sorted, as key-value joined by "+" ("experiment-paper_base+model.clip-4+train.seed-2"). Left out: Hydra's
    own and the launcher's keys, the model and data presets and the data's places (the sweep folder names the corpus;
    a run compares the prepared data by content) and what only extends or observes a run (nmt.config.RUN_EXTENSIONS),
    so the same sweep run again, or longer, continues each cell in its folder, and a cell of another sweep or recipe
    never shares one. Only letters, digits, "_", "-", "+" and ".", so the folder can be passed back as an override value
    unquoted; a name over CELL_NAME_MAX characters keeps its start and ends in a digest of the whole."""
    from nmt.config import DATA_PLACES, RUN_EXTENSIONS

    kept = []
    for override in map(str, overrides):
        key, _, value = override.lstrip("+~").partition("=")
        section, _, field = key.partition(".")
        if (key.startswith(("hydra.", "hydra/")) or key in ("model", "data")
                or section == "train" and field in RUN_EXTENSIONS or section == "data" and field in DATA_PLACES):
            continue
        kept.append(f"{key}-{value}" if value else f"no-{key}")
    name = "+".join(re.sub(r"[^A-Za-z0-9_.+-]", "-", part) for part in sorted(kept)) or "defaults"
    if len(name) > CELL_NAME_MAX:
        name = f"{name[:CELL_NAME_MAX - 12]}+h{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name


CELL_NAME_MAX = 160  # characters: a file name holds 255 bytes, and a path of cells stays readable
