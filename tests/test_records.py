"""Every committed record's command runs today: its program exists, its arguments parse with the program's own
parser, and the training overrides it carries compose against today's configs. (A record keeps the command that
made it as `command_as_run` where that one names a program or preset since renamed.)"""

import argparse
import json
import runpy
import shlex
import sys

import pytest

from nmt.compose import compose_job
from nmt.cli import program_name
from tests.conftest import ROOT

TRAINING_COMMANDS = ("nmt.experiment", "scripts/demo.py", "relnmt-train")  # their free arguments are the training job's overrides


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace):
        super().__init__("parsed")
        self.namespace = namespace


def records() -> dict[str, str]:
    """record path -> its command, for every JSON record under results/ that names one."""
    found = {}
    for path in sorted((ROOT / "results").rglob("*.json")):
        record = json.loads(path.read_text())
        if isinstance(record, dict) and isinstance(record.get("command"), str):
            found[str(path.relative_to(ROOT))] = record["command"]
    return found


def parse(command: str, monkeypatch) -> argparse.Namespace:
    """The program's own parse of the command's arguments (argparse's exit 2 on a bad one), without running it; a
    sweep's cell (`relnmt-train -m <overrides>`) or a scored run (`relnmt-train <overrides> train.score=true`) has
    only overrides, which compose below."""
    words = shlex.split(command)
    if words[0] == "relnmt-train":
        return argparse.Namespace(overrides=words[2:] if words[1] == "-m" else words[1:])
    assert words[0] == "python", command
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    if words[1] == "-m":
        monkeypatch.setattr(sys, "argv", [words[2], *words[3:]])
        run = lambda: runpy.run_module(words[2], run_name="__main__")  # noqa: E731
    else:
        assert (ROOT / words[1]).is_file(), f"{words[1]} does not exist"
        monkeypatch.setattr(sys, "argv", [words[1], *words[2:]])
        run = lambda: runpy.run_path(str(ROOT / words[1]), run_name="__main__")  # noqa: E731
    with pytest.raises(Parsed) as parsed:
        run()
    return parsed.value.namespace


def test_every_record_names_a_command():
    assert len(records()) >= 250


@pytest.mark.filterwarnings("ignore:.*found in sys.modules after import:RuntimeWarning")  # runpy re-running a module
def test_every_records_command_parses_and_its_overrides_compose(monkeypatch):
    checked, composed = 0, {}
    for path, command in records().items():
        try:
            namespace = parse(command, monkeypatch)
        except SystemExit as exit_:
            pytest.fail(f"{path}: `{command}` does not parse today (exit {exit_.code})")
        checked += 1
        program = shlex.split(command)[2 if command.startswith("python -m ") else 0 if command.startswith("relnmt-")
                                       else 1]
        if program in TRAINING_COMMANDS:
            overrides = [o for o in namespace.overrides if not o.startswith("train.seed=")]
            key = " ".join(overrides)
            if key not in composed:
                composed[key] = compose_job([*overrides, "train.output_dir=-"])
    assert checked == len(records()) and composed


def test_help_names_the_prepared_folder_the_code_writes():
    from nmt.fields import help_text
    from nmt.config import DataConfig, TrainJob
    from nmt.data.pipeline import prepared_dir

    shown = help_text("train", TrainJob, program_name("nmt.train"), None)
    assert "prepared/<name>_<src>_<tgt>" in shown
    assert str(prepared_dir(DataConfig(name="multi30k", src="en", tgt="de"))) == "prepared/multi30k_en_de"
