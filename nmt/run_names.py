"""Where a run lives and what makes it the same run. A single run's default folder is
outputs/<model>_<data>[.<model overrides>] (configs/train.yaml's hydra.run.dir), a -m sweep's cell's
<hydra.sweep.dir>/<cell name> (multirun/tiny_multi30k_en_de+experiment-table1+train.seed-1), through the resolvers below: an ablation gets its
own folder, never the preset's, and never resumes another run. Which fields a cell's name holds is the schema's one
rule (the Role each field declares in nmt/config.py, read by nmt/recorded_config.py defines_cell)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional

from nmt.recorded_config import defines_cell

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


SECTIONS = ("model", "optim", "train", "data")
ALWAYS_NAMED = ("train.seed",)  # a row's seeds sit side by side, each named, the recipe's own seed too


def cell_name_of(job: dict, choices: dict, reference: dict, without: tuple[str, ...] = ()) -> str:
    """A -m sweep cell's folder under the sweep's: the model and data presets, the recipe (+experiment), then every
    field that defines the cell (defines_cell) whose value differs from what those three presets give alone, and
    the seed (`reference`: {section: {field: value}} as the three presets give them, nmt.compose.preset_values), as
    key-value joined by "+" ("tiny_multi30k_en_de+experiment-table1+model.clip-4+train.seed-2").
    Read from the composed config, not from the overrides' spelling, so two spellings of one run (model.clip=16,
    +ablation=k16, or nothing where 16 is the preset's k) are one cell, which every table that holds it reads; a
    cell of another preset, recipe or seed is another folder, whatever hydra.sweep.dir says. `without` leaves out
    fields (a row's name: the cell's less its seed). Only letters, digits, "_", "-", "+" and ".", so the folder
    passes back as an override value unquoted; a name over CELL_NAME_MAX characters keeps its start and ends in a
    digest of the whole."""
    data = job["data"]
    model, preset, experiment = choices["model"], choices["data"], choices.get("experiment")
    parts = [f"{model}_{data_label(preset, data.get('src'), data.get('tgt'), data.get('train'))}"]
    if experiment:
        parts.append(f"experiment-{experiment}")
    for section in SECTIONS:
        for field, value in sorted(job[section].items()):
            key = f"{section}.{field}"
            if key in without or not defines_cell(section, field):
                continue
            if key in ALWAYS_NAMED or named_value(value) != named_value(reference[section].get(field)):
                parts.append(f"{key}-{named_value(value)}")
    return capped("+".join(re.sub(r"[^A-Za-z0-9_.+-]", "-", part) for part in parts), "+h")


def named_value(value) -> str:
    """A value as an override writes it: true, null, 0.5, 10 (not 10.0), t5."""
    value = getattr(value, "value", value)  # an enum
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return f"{value:g}" if isinstance(value, float) else str(value)


CELL_NAME_MAX = 160  # characters: a file name holds 255 bytes, and a path of cells stays readable
DATA_LABEL_MAX = 60  # a local corpus's part of a run's folder: with the model's part, within a file name's 255 bytes


def capped(name: str, joint: str, limit: int = CELL_NAME_MAX) -> str:
    """`name` if it has at most `limit` characters, else its start and, after `joint`, a digest of the whole: still
    one name per run, and a file name the file system takes."""
    if len(name) <= limit:
        return name
    return f"{name[:limit - len(joint) - 10]}{joint}{hashlib.sha1(name.encode()).hexdigest()[:10]}"
