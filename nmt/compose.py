"""Composition: configs/*.yaml over the schemas of nmt/config.py, for the commands (through Hydra) and for any code
that needs a job or a preset's values without running one (benchmarks, studies, the collector). The config layer's
top: it reads the schema and the run names, and nothing above it."""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import Optional

from omegaconf import OmegaConf

from nmt.config import SECTIONS, AverageJob, DecodeJob, ExportJob, PrepareJob, ScoreJob, TrainJob
from nmt.recorded_config import defines_cell
from nmt.run_names import cell_name_of, data_label, init_from_suffix, model_overrides_suffix

CONFIGS = Path(__file__).resolve().parent.parent / "configs"  # the presets' one home


def register_schemas() -> None:
    """Make the dataclasses the base of configs/*.yaml, so a typo in an override is an error; and the resolvers that
    name a run's folder (configs/train.yaml)."""
    from hydra.core.config_store import ConfigStore

    for name, resolver in {"run_dir": run_dir, "model_overrides": model_overrides_suffix, "cell_name": cell_name,
                           "data_label": data_label, "init_from": init_from_suffix}.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)
    for job, node in {"prepare": PrepareJob, "train": TrainJob, "decode": DecodeJob, "score": ScoreJob,
                      "export": ExportJob, "average": AverageJob}.items():
        ConfigStore.instance().store(name=f"{job}_schema", node=node)


def run_dir() -> str:
    """The resolver of train.output_dir's default: the folder Hydra made for this job (a sweep's cell's, or
    hydra.run.dir); outside a job that makes one (`--cfg job --resolve` prints the job), the folder a run would use."""
    from hydra.core.hydra_config import HydraConfig

    hydra = HydraConfig.get()
    made = None if OmegaConf.is_missing(hydra.runtime, "output_dir") else hydra.runtime.output_dir
    return made or hydra.run.dir


def composed(overrides: list[str], with_hydra: bool = False):
    """configs/train.yaml composed with the overrides: inside a Hydra job through its own config loader."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    if GlobalHydra.instance().is_initialized():
        return compose("train", overrides=overrides, return_hydra_config=with_hydra)
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        return compose("train", overrides=overrides, return_hydra_config=with_hydra)


def compose_job(overrides: list[str]) -> tuple[TrainJob, dict]:
    """The checked training job configs/train.yaml and the overrides describe, and its resolved plain form.

    The overrides must set train.output_dir: its default names the folder of a Hydra run, and this is none."""
    cfg = composed(overrides)
    return OmegaConf.to_object(cfg).check(), OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


_COMPOSE = threading.Lock()  # Hydra's compose API is a process-wide singleton: one thread at a time


def preset_job(*overrides: str) -> TrainJob:
    """The checked job that presets and overrides describe (e.g. "model=big", "+experiment=paper_big"), for code
    that needs a preset's values: the schema and configs/ stay their one home. Not a run: no output folder."""
    with _COMPOSE:
        return compose_job([*overrides, "train.output_dir=-"])[0]


def cell_fields(cfg, keep=lambda section, field: False) -> dict:
    """{section: {field: value}} of a composed job: the fields that define a cell (defines_cell), and `keep`'s."""
    return {section: {field: None if OmegaConf.is_missing(cfg[section], field) else cfg[section][field]
                      for field in cfg[section] if defines_cell(section, field) or keep(section, field)}
            for section in SECTIONS}


@functools.cache
def preset_values(model: str, data: str, experiment: Optional[str]) -> dict:
    """{section: {field: value}}: the fields that define a cell as the model and data presets and the recipe give
    them."""
    return cell_fields(composed([f"model={model}", f"data={data}", *([f"+experiment={experiment}"] if experiment
                                                                      else [])]))


def named_cell(job: dict, choices: dict, without: tuple[str, ...] = ()) -> str:
    """nmt.run_names.cell_name_of against the presets the choices name."""
    return cell_name_of(job, choices, preset_values(choices["model"], choices["data"], choices.get("experiment")),
                        without)


def cell_name(_root_) -> str:
    """The resolver of configs/train.yaml's hydra.sweep.subdir: the cell's name from its composed config. Only the
    fields that define the cell are read: train.output_dir is this folder, not yet known."""
    return named_cell(cell_fields(_root_, lambda section, field: section == "data" and field == "train"),
                      dict(_root_.hydra.runtime.choices))


def cell_name_for(overrides, without: tuple[str, ...] = ()) -> str:
    """The name of the cell that configs/train.yaml and these overrides compose (the collector's rows are declared
    by the overrides that sweep them)."""
    cfg = composed(list(overrides), with_hydra=True)
    job = cell_fields(cfg, lambda section, field: field in ("train", "src", "tgt"))
    return named_cell(job, dict(cfg.hydra.runtime.choices), without)
