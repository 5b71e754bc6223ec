"""A job's config as a run records it (checkpoints, a run's result): plain values, the schema's defaults filled in for
the fields a record lacks because they were added to the schema after it was written, and which of its fields define
the run, its cell or its record (the roles the fields declare, nmt/roles.py). One home for all three, so that resume,
fine-tuning, a sweep's cell and a run's record read a job and an old record alike."""

from __future__ import annotations

import dataclasses
from enum import Enum

from omegaconf import OmegaConf

from nmt.config import SECTIONS, TrainJob
from nmt.roles import Role, declared_role


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


def role(section: str, name: str) -> Role | None:
    """The role a field of a training job declares (Role); None for a name the schema no longer has (an old record's)."""
    if section not in SECTIONS:
        return None
    return declared_role(SECTIONS[section], name, Role.weights if section == "model" else Role.defines)


def defines_run(section: str, name: str) -> bool:
    """A resume compares it: another value is another run (nmt/checkpoints/resume.py)."""
    return role(section, name) in (Role.weights, Role.defines)


def defines_cell(section: str, name: str) -> bool:
    """A -m sweep cell's name holds it (nmt/run_names.py): the run and what its score is taken on."""
    return role(section, name) in (Role.weights, Role.defines, Role.scores)


def defines_record(section: str, name: str) -> bool:
    """A run's record (result.json) is this job's, and the job is done, when the two agree on it (nmt/lab/record.py)."""
    return role(section, name) in (Role.weights, Role.defines, Role.scores, Role.extends)


def defines_weights(section: str, name: str) -> bool:
    """A fine-tuning checkpoint must agree on it (nmt/checkpoints/finetune.py): what its weights compute."""
    return role(section, name) == Role.weights
