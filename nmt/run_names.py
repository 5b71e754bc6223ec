"""Where a run lives and what makes it the same run. A single run's default folder is
outputs/<model>_<data>[.<model overrides>] (configs/train.yaml's hydra.run.dir), a -m sweep's cell's
multirun/<model>_<data>/<cell name> (hydra.sweep.dir and subdir), through the resolvers below: an ablation gets its
own folder, never the preset's, and never resumes another run. RUN_EXTENSIONS and DATA_PLACES say which fields may
change on a resume (nmt/checkpoints/resume.py) and stay out of a cell's name."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional

# What only extends, observes or places a run: these train.* fields may differ when a folder's run is resumed
# (nmt/checkpoints/resume.py) and stay out of a sweep cell's folder name (cell_name below). Every other field of model, optim and
# train defines the run, and so do the data (compared by what was prepared: nmt/data/pipeline.py's identity) and the
# effective batch (W x max_tokens x F: the launch may change W and F, not their product).
RUN_EXTENSIONS = ("max_steps", "max_minutes", "save_every_steps", "save_every_minutes", "keep_last", "average_last",
                  "log_every", "valid_every", "valid_bleu_sentences", "max_bad_updates", "output_dir", "device",
                  "threads", "compile", "deterministic", "attention", "tokens_per_update", "update_freq", "score_split", "score_lines",
                  "best_metric", "patience", "dry_run",
                  "loss_chunk_tokens")
# Where the data is read and prepared, not what it is: a run compares the prepared data's identity (its files'
# digests, vocabulary and filters), so these data.* fields also stay out of a sweep cell's folder name.
DATA_PLACES = ("root", "train", "valid", "test", "prepared_dir", "hub_name", "chunk_lines", "workers")


def model_overrides_suffix(overrides) -> str:
    """".clip-4.rel_value-false" for a run's model.* overrides, "" for none: the default output folder of an
    ablation (configs/train.yaml) is its own, not the preset's, so it never tries to resume another model's run.
    Only letters, digits, "_", "-" and ".": the folder can be passed back as an override value unquoted."""
    plain = [str(o).lstrip("+").replace("~model.", "model.no-", 1) for o in overrides]  # ++model.x=, ~model.x
    picked = sorted(o.removeprefix("model.").replace("=", "-") for o in plain if o.startswith("model."))
    return capped("".join("." + re.sub(r"[^A-Za-z0-9_.-]", "-", name) for name in picked), ".h")


def init_from_suffix(overrides) -> str:
    """".from-<run folder>-<checkpoint>" for a train.init_from override (".from-tiny_multi30k_en_de-checkpoint_best"),
    "" for none: a fine-tuning run's default folder (configs/train.yaml) is its own, never the run it starts from
    (which it would otherwise try to resume, and be refused)."""
    paths = [str(o).split("=", 1)[1] for o in overrides if str(o).lstrip("+").startswith("train.init_from=")]
    if not paths or paths[-1] in ("", "null"):
        return ""
    path = Path(paths[-1])
    name = "-".join(part for part in (path.parent.name, path.stem) if part)
    return capped(".from-" + re.sub(r"[^A-Za-z0-9_.-]", "-", name), ".h", DATA_LABEL_MAX)


def data_label(preset: str, src: str, tgt: str, train: Optional[str]) -> str:
    """The data part of a run's default folder: the preset's name, which names corpus and pair
    (multi30k_en_de); for data=local the pair and the training files' folder and prefix too
    (local_en_fr.europarl_train), so two local corpora never share, and never resume, one run."""
    if preset != "local" or not train:
        return preset
    corpus = "_".join(part for part in (Path(train).parent.name, Path(train).name) if part)
    return capped(f"local_{src}_{tgt}." + re.sub(r"[^A-Za-z0-9_-]", "-", corpus), "-h", DATA_LABEL_MAX)


def defines_run(section: str, field: str) -> bool:
    """Whether a config field defines a run (the one rule: a resume compares it, a cell's name holds it)."""
    return not (section == "train" and field in RUN_EXTENSIONS or section == "data" and field in DATA_PLACES)


def defining_overrides(overrides) -> list[str]:
    """The overrides that define a run, as key=value ("+" dropped), sorted: all but Hydra's own and the launcher's
    keys, the model and data presets (a sweep's folder names them), the data's places (a run compares the prepared
    data by content) and what only extends or observes a run (RUN_EXTENSIONS)."""
    kept = []
    for override in map(str, overrides):
        key, _, value = override.lstrip("+~").partition("=")
        section, _, field = key.partition(".")
        if key.startswith(("hydra.", "hydra/")) or key in ("model", "data") or not defines_run(section, field):
            continue
        kept.append(f"{key}={value}" if value else f"no-{key}")
    return sorted(kept)


def cell_name(overrides) -> str:
    """A -m sweep cell's folder under the sweep's (configs/train.yaml's hydra.sweep.subdir): its defining overrides
    as key-value joined by "+" ("experiment-paper_base+model.clip-4+train.seed-2"), so the same sweep run again, or
    longer, continues each cell in its folder, and a cell of another sweep or recipe never shares one. Only letters,
    digits, "_", "-", "+" and ".", so the folder can be passed back as an override value unquoted; a name over
    CELL_NAME_MAX characters keeps its start and ends in a digest of the whole."""
    parts = [override.replace("=", "-", 1) for override in defining_overrides(overrides)]
    name = "+".join(re.sub(r"[^A-Za-z0-9_.+-]", "-", part) for part in parts) or "defaults"
    return capped(name, "+h")


CELL_NAME_MAX = 160  # characters: a file name holds 255 bytes, and a path of cells stays readable
DATA_LABEL_MAX = 60  # a local corpus's part of a run's folder: with the model's part, within a file name's 255 bytes


def capped(name: str, joint: str, limit: int = CELL_NAME_MAX) -> str:
    """`name` if it has at most `limit` characters, else its start and, after `joint`, a digest of the whole: still
    one name per run, and a file name the file system takes."""
    if len(name) <= limit:
        return name
    return f"{name[:limit - len(joint) - 10]}{joint}{hashlib.sha1(name.encode()).hexdigest()[:10]}"
