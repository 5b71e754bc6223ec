"""A job's fields, as its schema dataclasses in nmt/config.py declare them (a field's description is the comment on
its line): `--help`, which lists them with their defaults, and shell completion, which offers presets, fields and
each enum or bool field's values. Imports nothing heavy: a TAB is answered before torch is loaded (nmt/commands.py)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import os
import sys
import tokenize
from enum import Enum

import hydra

from nmt.compose import CONFIGS, register_schemas



def field_descriptions(schema: type) -> dict[str, str]:
    """{field: the comment on its line} of a dataclass (the schema is each description's one home)."""
    source = inspect.getsource(schema)
    comments = {token.start[0]: token.string.lstrip("#").strip()
                for token in tokenize.generate_tokens(io.StringIO(source).readline) if token.type == tokenize.COMMENT}
    body = ast.parse(source).body[0].body
    return {node.target.id: comments.get(node.lineno, "") for node in body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def schema_fields(schema: type, prefix: str = "") -> dict[str, tuple[type | None, str]]:
    """{dotted field: (its dataclass when it is a group, else None; description)}, every level of the schema. An
    enum field's description ends with its choices."""
    described = {}
    for klass in reversed(schema.__mro__):  # a subclass (DecodeJob) adds to its base's fields (SearchConfig)
        if dataclasses.is_dataclass(klass):
            described.update(field_descriptions(klass))
    fields = {}
    for f in dataclasses.fields(schema):
        group = f.type if isinstance(f.type, type) and dataclasses.is_dataclass(f.type) else None
        if group is None:
            group = next((t for t in _config_types() if t.__name__ == f.type), None)
        description = described.get(f.name, "")
        choices = next((t for t in _config_types(Enum) if t.__name__ == f.type), None)
        if choices is not None and not all(c.value in description for c in choices):
            description += f" ({' | '.join(c.value for c in choices)})"
        fields[prefix + f.name] = (group, description.strip())
        if group is not None:
            fields.update(schema_fields(group, f"{prefix}{f.name}."))
    return fields


def _config_types(base: type | None = None) -> list[type]:
    """nmt.config's dataclasses (or its subclasses of `base`): a field's type is a name under postponed annotations."""
    from nmt import config

    return [t for t in vars(config).values() if isinstance(t, type)
            and (issubclass(t, base) and t is not base if base else dataclasses.is_dataclass(t))]


def value_choices(schema: type) -> dict[str, list[str]]:
    """{dotted field: the values it takes} for every enum and bool field of a job's schema, as overrides write them."""
    from nmt import config

    choices = {}
    for name, (group, _) in schema_fields(schema).items():
        if group is not None:
            continue
        owner = schema
        for part in name.split(".")[:-1]:  # the dataclass that declares the field
            owner = next(t for t in _config_types() if t.__name__ == _field_type(owner, part))
        kind = _field_type(owner, name.rsplit(".", 1)[-1])
        enum = getattr(config, kind, None) if isinstance(kind, str) else kind
        if isinstance(enum, type) and issubclass(enum, Enum):
            choices[name] = [choice.value for choice in enum]
        elif kind in ("bool", bool):
            choices[name] = ["true", "false"]
    return choices


def _field_type(schema: type, name: str):
    return next(f.type for f in dataclasses.fields(schema) if f.name == name)


def shown(value) -> str:
    """A default as an override writes it."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, bool):
        return str(value).lower()
    return "null" if value is None else str(value)


EXAMPLES = {"train": "model=base data=local train.max_steps=1000", "prepare": "data=multi30k_en_fr data.vocab_size=16000",
            "decode": "checkpoint=run/averaged.pt input=test.en beam=1", "score": "hyp=test.hyp.de ref=test.de",
            "export": "checkpoint=run/averaged.pt output=run/ct2", "average": "directory=outputs/run last=5"}


def help_text(config_name: str, schema: type, program: str, doc: str | None) -> str:
    """--help: usage, then each group of the job (with its presets) and each field with its default and description."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name)
    defaults = OmegaConf.to_container(cfg, resolve=False)
    fields = schema_fields(schema)
    lines = [f"usage: {program} [key=value ...]", "",
             *(inspect.cleandoc(doc).splitlines()[:1] if doc else []), "",
             f"Options are key=value (Hydra overrides), never --flags: e.g. {EXAMPLES[config_name]}."]
    presets = {group: sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
               for group in ("model", "data", "experiment") if (CONFIGS / group).is_dir()}
    if config_name == "train":
        studies = sorted(p.stem for p in (CONFIGS / "study").glob("*.yaml"))
        lines += ["", f"+experiment=NAME  a recipe over the presets: {', '.join(presets['experiment'])}",
                  "-m KEY=A,B ...    a sweep: a run per cell, each in a folder named by what defines it, ending in "
                  "its score", f"-m +study=NAME    a study of results/README.md as one sweep: {', '.join(studies)}"]
    lines += [*([] if config_name == "train" else [""]), "--cfg job [--resolve]  print the composed job instead of "
              "running it; -sc install=bash  shell completion (zsh, fish too)"]
    chosen = {k: v for entry in OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{config_name}.yaml").defaults)
              if isinstance(entry, dict) for k, v in entry.items()}  # the presets the defaults below come from
    width = min(40, max(len(name) + len(shown(_lookup(defaults, name))) for name, (group, _) in fields.items()
                        if group is None) + 3)
    for name, (group, description) in fields.items():
        if group is not None:
            offered = (f" (presets: {name}={'|'.join(presets[name])}; below: {name}={chosen[name]})"
                       if name in presets and name in chosen else "")
            lines += ["", f"{name}: {description}".rstrip() + offered]
            continue
        entry = f"{name}={shown(_lookup(defaults, name))}"
        lines.append(f"  {entry:<{width}}{description}" if len(entry) < width else f"  {entry}  {description}")
    return "\n".join(lines)


def _lookup(tree, dotted: str):
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return "???" if tree == "???" else tree


def completion_query(args: list[str]) -> str | None:
    """The shell of a completion query (`-sc query=bash`, what the installed completion runs at each TAB), or None."""
    if len(args) == 2 and args[0] in ("-sc", "--shell-completion") and args[1].startswith("query="):
        return args[1].split("=", 1)[1]
    return None


def answer_completion(config_name: str, schema: type, shell: str) -> None:
    """Hydra's shell completion for a job, but an enum or bool field's values as overrides write them (Hydra offers
    only the default, and an enum's as a Python name: Position.relative). Imports no more than the configs need: a
    TAB does not wait for torch."""
    line = os.environ.get("COMP_LINE", "")
    word = "" if line.endswith(" ") or not line.split() else line.split()[-1]
    key, equals, typed = word.partition("=")
    choices = value_choices(schema).get(key)
    if equals and choices is not None:
        print(("\n" if shell == "fish" else " ").join(f"{key}={c}" for c in choices if c.startswith(typed)))
        return
    register_schemas()
    sys.argv[1:] = ["-sc", f"query={shell}"]
    hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name=config_name)(lambda cfg: None)()
