"""The Hydra entry point every `python -m nmt.*` job shares: overrides checked before Hydra runs the job, so a
mistyped key exits 2 with one line, like an out-of-range value, instead of Hydra's multi-line report and exit 1;
`--help` that lists the job's own fields, each with its description and default, read from the schema
dataclasses (nmt/config.py: a field's description is the comment on its line); and one line for a `--flag`, since
options are key=value."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import functools
import inspect
import io
import logging
import os
import sys
import tokenize
from enum import Enum
from pathlib import Path

import hydra

from nmt.errors import EXIT_STOPPED, EXIT_USER_ERROR, Stopped, UserError

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def override_error(config_name: str, overrides: list[str]) -> str | None:
    """One line saying what is wrong with the overrides (an unknown key, a value of the wrong type, an unknown
    preset), or None. hydra.* keys are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    plain = [arg for arg in overrides if "=" in arg and not arg.startswith(("hydra.", "+hydra.", "hydra/"))]
    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            cfg = compose(config_name, overrides=plain)
    except (HydraException, OmegaConfBaseException) as err:
        text = f"{err}\n{err.__cause__ or ''}"
        if (near := did_you_mean(config_name, text, plain)) is not None:
            return near
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        why = next((line for line in lines[1:] if line.startswith(("Key ", "Value "))), None)
        return " ".join(filter(None, [lines[0] if lines else type(err).__name__, why]))
    # a required field left out (relnmt-translate without checkpoint=): one line here, not OmegaConf's traceback when
    # the job reads it. data.* are the data layer's to name (data=local says which files it reads)
    missing = [key for key in missing_fields(cfg) if not key.startswith(("data.", "hydra."))]
    if missing:
        return f"{', '.join(missing)} must be given: " + " ".join(f"{key}=..." for key in missing)
    return None


def nearest(word: str, choices: list[str]) -> str:
    """": did you mean X?" with the closest of `choices`, else "" (difflib's ratio, as --flag hints use)."""
    near = difflib.get_close_matches(word, choices, 1, 0.6)
    return f": did you mean {near[0]}?" if near else ""


def did_you_mean(config_name: str, text: str, overrides: list[str]) -> str | None:
    """One line for Hydra's or OmegaConf's report of an unknown preset, field or choice, with the nearest
    (model=tinny: did you mean model=tiny?) and, when they are few, every option; None for any other report."""
    import re

    if found := re.search(r"Could not find '([\w/]+)/([^']+)'", text):
        group, name = found.groups()
        presets = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
        prefix = "+" if group == "experiment" else ""
        return (f"{prefix}{group}={name} is not a preset{nearest(name, presets).replace('mean ', f'mean {prefix}{group}=')}"
                f" (presets: {', '.join(presets)})")
    if found := re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]\s+full_key: (\S+)", text):
        value, choices, key = found.groups()
        options = [choice.strip() for choice in choices.split(",")]
        return f"{key}={value} is not a choice{nearest(value, options)} ({' | '.join(options)})"
    if found := re.search(r"Key '[^']+' not in '\w+'\s+full_key: (\S+)", text):
        key = found.group(1)  # OmegaConf names the first part that is not there (trian of trian.max_steps=3)
        key = next((k for k in (o.split("=", 1)[0].lstrip("+~") for o in overrides) if k.startswith(f"{key}.")), key)
        return f"{key} is not a field{nearest(key, default_fields(config_name))}"
    return None


@functools.cache
def default_fields(config_name: str) -> list[str]:
    """Every dotted field of a job's config as composed with its defaults (the presets its groups name)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import DictConfig

    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        cfg = compose(config_name)

    def leaves(node, prefix=""):
        for key in node:
            child = node._get_node(key)
            yield from leaves(child, f"{prefix}{key}.") if isinstance(child, DictConfig) else [f"{prefix}{key}"]

    return list(leaves(cfg))


def missing_fields(cfg, prefix: str = "") -> list[str]:
    """The dotted fields of a composed config left at ??? (OmegaConf.missing_keys would resolve every
    interpolation, and Hydra's, such as the run folder, exist only inside the job)."""
    from omegaconf import DictConfig, OmegaConf

    found = []
    for key in cfg:
        if OmegaConf.is_missing(cfg, key):
            found.append(f"{prefix}{key}")
        elif isinstance(node := cfg._get_node(key), DictConfig):
            found += missing_fields(node, f"{prefix}{key}.")
    return found


def sweep_checks(args: list[str]) -> list[list[str]]:
    """The override lists that check every value of a -m sweep once: the first cell, then each further value of each
    swept key with the others at their first (7 + 4 lists for model.clip=0,1,2,4,16,64,256 model.rel_key=...,
    not 28). Without a sweep, the overrides themselves."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    plain = [arg for arg in args if not arg.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(plain)
    except Exception:  # noqa: BLE001 -- a syntax error: override_error reports Hydra's own line for it
        return [plain]
    try:
        values = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override() else [a]
                  for o, a in zip(parsed, plain)]
    except Exception:  # noqa: BLE001 -- glob() and interval() sweeps expand only inside Hydra's run: its own checks
        return [[a for o, a in zip(parsed, plain) if not o.is_sweep_override()]]
    first = [options[0] for options in values]
    others = [[*first[:i], option, *first[i + 1:]] for i, options in enumerate(values) for option in options[1:]]
    return [first, *others]


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
    from nmt.config import register_schemas

    register_schemas()
    sys.argv[1:] = ["-sc", f"query={shell}"]
    hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name=config_name)(lambda cfg: None)()


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


def program_name(module: str) -> str:
    """The command as the user typed it, for usage lines and hints: `relnmt-train` when run as the console script
    (pyproject.toml's [project.scripts]), else `python -m nmt.train` (`module`: the entry point's module)."""
    script = Path(sys.argv[0]).name
    return script if script.startswith("relnmt-") else f"python -m {module}"


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
        lines += ["", f"+experiment=NAME  a recipe over the presets: {', '.join(presets['experiment'])}"]
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


HYDRA_FLAGS = {"-h", "--help", "--hydra-help", "--version", "-c", "--cfg", "-r", "--resolve", "-p", "--package",
               "-i", "--info", "-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-m",
               "--multirun", "-sc", "--shell-completion", "--run", "--experimental-rerun"}


def flag_error(args: list[str], schema: type) -> str | None:
    """One line for the first argument written as a --flag (options are key=value), with the nearest field."""
    for i, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if not arg.startswith("-") or name in HYDRA_FLAGS or arg.lstrip("-")[:1].isdigit():
            continue
        key = name.lstrip("-").replace("-", "_")
        value = arg.split("=", 1)[1] if "=" in arg else (args[i + 1] if i + 1 < len(args) and "=" not in args[i + 1]
                                                        and not args[i + 1].startswith("-") else "VALUE")
        fields = [f for f, (group, _) in schema_fields(schema).items() if group is None]
        leaves = {f.rsplit(".", 1)[-1]: f for f in fields}
        near = ([f for f in fields if f == key] or [leaves[k] for k in difflib.get_close_matches(key, leaves, 1, 0.75)]
                or difflib.get_close_matches(key, fields, 1, 0.75))
        hint = f": did you mean {near[0]}={value}?" if near else ""
        return f"options are key=value, not {name}{hint}"
    return None


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended


def say_error(err: BaseException, tool: str) -> None:
    """One line on stderr: through the job's own log where it logs to stderr (so a run's train.log keeps it too),
    else as `error: ...`. Under torchrun an error that every rank raises alike (a config error) is said by rank 0
    alone."""
    if getattr(err, "every_rank_alike", False) and os.environ.get("RANK", "0") != "0":
        return
    if any(getattr(handler, "stream", None) is sys.stderr for handler in logging.getLogger().handlers):
        logging.getLogger(f"nmt.{tool}").error("%s", err)
    else:  # no log yet, or Hydra's own (to stdout)
        print(f"error: {err}", file=sys.stderr)


@contextlib.contextmanager
def ends_in_one_line(tool: str, interrupted: str = "interrupted"):
    """Around a job's body (every nmt CLI, Hydra's or argparse's): a UserError ends it in one line, exit 2; Stopped
    with exit 75 (the job said why and how to continue as it stopped); Ctrl-C that the job did not handle with
    `interrupted`, exit 130."""
    try:
        yield
    except UserError as err:
        say_error(err, tool)
        sys.exit(EXIT_USER_ERROR)
    except Stopped:
        sys.exit(EXIT_STOPPED)
    except KeyboardInterrupt:
        print(f"\n{interrupted} (Ctrl-C)", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


OUTPUT_FOLDERS = ("train.output_dir",)  # the fields that name a job's own output folder


def hydra_run_dir(args: list[str]) -> list[str]:
    """The arguments, with Hydra's run folder the working directory where the user names the job's output folder:
    Hydra makes its run folder before the job starts, and its default (outputs/<preset>...) would be left behind
    empty; the job makes its own folder once its checks pass (a refused job writes nothing)."""
    named = [arg.split("=", 1)[1] for arg in args if arg.split("=", 1)[0] in OUTPUT_FOLDERS and "=" in arg]
    if not named or any(arg.startswith(("hydra.run.dir=", "-m", "--multirun", "hydra.mode=")) for arg in args):
        return args
    return [*args, "hydra.run.dir=."]


def hydra_job(config_name: str, schema: type, interrupted: str = "interrupted"):
    """@hydra.main for configs/<config_name>.yaml (whose fields `schema` describes), after the overrides' check
    (exit 2, one line naming the key). --help and -h print help_text; a --flag gets one line (exit 2); the job runs
    in ends_in_one_line."""
    def wrap(task):
        module = sys.modules[task.__module__]  # `python -m nmt.train` runs it as __main__: its spec has the name
        module_name = module.__spec__.name if getattr(module, "__spec__", None) else task.__module__
        tool = module_name.rpartition(".")[2]  # nmt.train -> train: the logger its errors go through
        @functools.wraps(task)
        def task_in_one_line(cfg):  # inside Hydra's main: Hydra reports an exception that reaches it with exit 1
            with ends_in_one_line(tool, interrupted):
                return task(cfg)

        # the folder by its absolute path: a relative one is resolved as a package, found only from the repository root
        hydra_main = hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name=config_name)(task_in_one_line)

        @functools.wraps(task)
        def entry():
            args = sys.argv[1:]
            program = program_name(module_name)
            if (shell := completion_query(args)) is not None:
                answer_completion(config_name, schema, shell)
                sys.exit(0)
            if "--help" in args or "-h" in args:
                try:
                    print(help_text(config_name, schema, program, sys.modules[task.__module__].__doc__))
                    sys.stdout.flush()
                except BrokenPipeError:  # `--help | head`
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(0)
            if (error := flag_error(args, schema)) is not None:
                print(f"error: {error} ({program} --help lists the fields)", file=sys.stderr)
                sys.exit(EXIT_USER_ERROR)
            # a flag (--config-name, --cfg, -sc, ...): Hydra's own checks, as they are; a -m sweep: every value
            flags = [arg for arg in args if arg.startswith("-") or arg.startswith("hydra.mode=")]
            if all(flag in ("-m", "--multirun") for flag in flags):
                error = next(filter(None, (override_error(config_name, cell) for cell in sweep_checks(args))), None)
                if error is not None:
                    print(f"error: {error} ({program} --help lists the fields)", file=sys.stderr)
                    sys.exit(EXIT_USER_ERROR)
            sys.argv[1:] = hydra_run_dir(args)
            hydra_main()

        return entry

    return wrap
