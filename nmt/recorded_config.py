"""A job's config as a run records it (checkpoints, a cell's result, an experiment's identity): plain values, and the
schema's defaults filled in for the fields a record lacks because they were added to the schema after it was written.
One home for both, so that resume, fine-tuning, a sweep's cell and an experiment read an old record alike."""

from __future__ import annotations

import dataclasses
from enum import Enum

from omegaconf import OmegaConf

from nmt.config import SECTIONS, TrainJob


def plain_job(job: TrainJob) -> dict:
    """The job as plain values, as checkpoints and results record it."""
    return OmegaConf.to_container(OmegaConf.structured(job), resolve=True, enum_to_str=True)


def plain(value):
    """A schema value as a record holds it (enums as their value)."""
    return value.value if isinstance(value, Enum) else value


def schema_default(section: str, name: str):
    """The schema's default of a recorded field (("model", "t5_buckets") -> 32), as a record holds it; None where it
    has none (no such section or field)."""
    field = next((f for f in dataclasses.fields(SECTIONS[section]) if f.name == name), None) \
        if section in SECTIONS else None
    if field is None or field.default is dataclasses.MISSING:
        return None
    return plain(field.default)


def with_schema_defaults(section: str, recorded: dict) -> dict:
    """A section of a recorded config with the schema's default for every field it lacks: a field added to the
    schema after the run was recorded held its default in that run."""
    return {**{f.name: schema_default(section, f.name) for f in dataclasses.fields(SECTIONS[section])}, **recorded}
