"""The console scripts pyproject.toml installs (relnmt-train, ...): each runs its module's entry point, the same
program as `python -m nmt.X`, except that a shell-completion query is answered from the configs alone, before the
module and torch are imported: a TAB takes a fraction of a second, not the seconds torch's import costs."""

from __future__ import annotations

import importlib
import sys

from nmt import config
from nmt.fields import answer_completion, completion_query


def _command(module: str, config_name: str, schema: type, entry: str = "main"):
    def run() -> None:
        if (shell := completion_query(sys.argv[1:])) is not None:
            return answer_completion(config_name, schema, shell)
        return getattr(importlib.import_module(module), entry)()

    run.__doc__ = f"relnmt-{module.removeprefix('nmt.')}: {module}.{entry}, completion answered without importing it"
    return run


prepare = _command("nmt.prepare", "prepare", config.PrepareJob)
train = _command("nmt.train", "train", config.TrainJob)
average = _command("nmt.average", "average", config.AverageJob, "cli")
translate = _command("nmt.translate", "decode", config.DecodeJob)
score = _command("nmt.score", "score", config.ScoreJob)
export = _command("nmt.export", "export", config.ExportJob)
