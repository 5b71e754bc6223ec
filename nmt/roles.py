"""What each field of a training job is to its run (Role), declared on the field in nmt/config.py: the one rule that a
sweep cell's name, "done" (a run's record), resume and fine-tuning read (nmt/recorded_config.py's predicates). A field
that declares no role defines the run (a model field: what the weights compute)."""

from __future__ import annotations

import dataclasses
from dataclasses import field
from enum import Enum


class Role(str, Enum):
    """What a field is to its run: declared as its default (`max_steps: int = extends(100_000)`)."""

    weights = "weights"  # what the weights compute (every model.* field but dropout): a fine-tuning checkpoint too
    defines = "defines"  # the trained and scored model: a resume may not change it, a cell's name holds it
    scores = "scores"  # what the run's score is taken on: a cell's name holds it, a resume may change it
    extends = "extends"  # the budget: a larger one continues the run; a run is finished at the budget it was given
    places = "places"  # where, how fast, how often it saves, logs or reads its files: never what the run is


def with_role(role: Role, default, **kwargs):
    """A schema field's default that declares its role (Role)."""
    return field(default=default, metadata={"role": role}, **kwargs)


def defines(default):
    return with_role(Role.defines, default)


def scores(default):
    return with_role(Role.scores, default)


def extends(default):
    return with_role(Role.extends, default)


def places(default):
    return with_role(Role.places, default)


def declared_role(schema: type, name: str, default: Role) -> Role | None:
    """The role field `name` of dataclass `schema` declares (`default` where it declares none); None for a name the
    schema does not have (an old record's)."""
    found = next((f for f in dataclasses.fields(schema) if f.name == name), None)
    return None if found is None else found.metadata.get("role", default)
