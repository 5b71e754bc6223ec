"""What is wrong with a command line, said in one line before Hydra runs the job: an unknown preset, field or choice
(with the nearest: model=tinny is not a preset: did you mean model=tiny?), a value of the wrong type, a required
field left out, a --flag where options are key=value; every value of a -m sweep checked once."""

from __future__ import annotations

import difflib
import functools

from nmt.fields import CONFIGS, schema_fields


def override_error(config_name: str, overrides: list[str]) -> str | None:
    """One line saying what is wrong with the overrides (an unknown key, a value of the wrong type, an unknown
    preset), or None. hydra.* keys are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    plain = [arg for arg in overrides if "=" in arg and not arg.lstrip("+~").startswith(("hydra.", "hydra/"))]
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
    if (added := added_key_error(config_name, plain)) is not None:
        return added
    # a required field left out (relnmt-translate without checkpoint=): one line here, not OmegaConf's traceback when
    # the job reads it. data.* are the data layer's to name (data=local says which files it reads)
    missing = [key for key in missing_fields(cfg) if not key.startswith(("data.", "hydra."))]
    if missing:
        return f"{', '.join(missing)} must be given: " + " ".join(f"{key}=..." for key in missing)
    return None


def added_key_error(config_name: str, overrides: list[str]) -> str | None:
    """One line for a `+key=...` or `++key=...` that names no field of the job's schema (+train.patiense=3): Hydra
    lifts the schema's check for an added key, so the typo would be kept in silence and the field meant stay at its
    default. A `+group=preset` (+experiment=table1, +study=..., +ablation=...: a folder of configs/) adds a preset."""
    fields = default_fields(config_name)
    for override in overrides:
        key = override.split("=", 1)[0]
        if not key.startswith("+"):
            continue
        key = key.lstrip("+")
        if is_config_group(key) or is_field(key, fields):
            continue
        return f"{key} is not a field{nearest(key, fields)}"
    return None


def is_config_group(key: str) -> bool:
    """`experiment` of +experiment=table1 (or `experiment@pkg`): a config group, a folder of presets under configs/."""
    return (CONFIGS / key.split("@", 1)[0]).is_dir()


def is_field(key: str, fields: list[str]) -> bool:
    """A dotted field of the schema, or a section of them (`train`)."""
    return key in fields or any(field.startswith(f"{key}.") for field in fields)


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
        written = [o for o in overrides if o.lstrip("+").split("=", 1)[0] == group]  # as the user wrote it
        prefix = written[0][:len(written[0]) - len(written[0].lstrip("+"))] if written else \
            ("" if group in ("model", "data") else "+")  # a group configs/train.yaml does not list is added
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


def emulated_bf16_error(cells: list[list[str]], native: bool | None = None) -> str | None:
    """One line, before a sweep trains, when its recipe trains in bf16 on a CPU that has no native bf16 and the
    command did not choose a precision: autocast then emulates bf16, and every update takes many times as long as in
    fp32 (a study's records were made in bf16: reproducing them bit for bit needs it). None where nothing is to say.
    native: whether this CPU computes bf16 natively (default: nmt.machine.native_cpu_bf16)."""
    if not cells or any(o.lstrip("+").startswith("train.precision=") for o in cells[0]):
        return None
    from nmt.compose import composed

    plain = [o for o in cells[0] if "=" in o and not o.lstrip("+~").startswith(("hydra.", "hydra/"))]
    train = composed(plain).train
    if str(getattr(train.precision, "value", train.precision)) != "bf16" or train.device not in ("auto", "cpu"):
        return None
    import torch

    from nmt.machine import native_cpu_bf16

    if torch.cuda.is_available() or (native if native is not None else native_cpu_bf16()):
        return None
    return ("this sweep's recipe trains in bf16 (its records' precision) and this CPU has no native bf16: autocast "
            "emulates it, and every update takes many times as long as in fp32. Choose: train.precision=fp32 "
            "(fast; its scores differ from the records' as another seed's do) or train.precision=bf16 (the records' "
            "bits, slowly)")
