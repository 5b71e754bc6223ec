"""The commands `pip install` puts on PATH: each the same program as its `python -m nmt.X`, and Hydra's shell
completion for the Hydra ones (docs/configuration.md shows how to turn it on)."""

import importlib
import os
import subprocess
import sys
import tomllib
from pathlib import Path


from tests.conftest import ROOT

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
BIN = Path(sys.executable).parent
HYDRA_COMMANDS = ("relnmt-prepare", "relnmt-train", "relnmt-average", "relnmt-translate", "relnmt-score",
                  "relnmt-export")


def entry_point(command: str, target: str) -> tuple[str, str]:
    """(module, function) that a console script runs: nmt.commands' wrappers run their module's entry point."""
    module_name, function = target.split(":")
    if module_name == "nmt.commands":
        wrapper = getattr(importlib.import_module(module_name), function)
        module_name, function = wrapper.__doc__.split(": ", 1)[1].split(",")[0].rsplit(".", 1)
    return module_name, function


def test_each_command_is_the_entry_point_of_its_module():
    for command, target in SCRIPTS.items():
        module_name, function = entry_point(command, target)
        assert command == "relnmt-" + module_name.removeprefix("nmt."), command
        module = importlib.import_module(module_name)
        source = Path(module.__file__).read_text()
        assert f'if __name__ == "__main__":\n    {function}()' in source or \
            f'if __name__ == "__main__":\n    sys.exit({function}())' in source, \
            f"{module_name}'s `python -m` runs something else than {command} ({target})"


def help_of(program: list[str]) -> subprocess.Popen:
    return subprocess.Popen([*program, "--help"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_each_command_runs_after_install_and_says_its_own_name(tmp_path):
    """From any folder (not only the repository's root) and naming itself as the user typed it."""
    missing = [command for command in SCRIPTS if not (BIN / command).is_file()]
    assert not missing, f"not installed (pip install -e .): {missing}"
    started = {command: (help_of([str(BIN / command)]),
                         help_of([sys.executable, "-m", entry_point(command, target)[0]]))
               for command, target in SCRIPTS.items()}
    for command, (script, module) in started.items():
        out, err = script.communicate(timeout=120)
        module_out, _ = module.communicate(timeout=120)
        assert script.returncode == 0 and out.startswith(f"usage: {command}"), (command, out[:300], err[-2000:])
        module_name = entry_point(command, SCRIPTS[command])[0]
        words = " ".join(out.replace(command, f"python -m {module_name}").split())  # argparse wraps by name length
        assert words == " ".join(module_out.split()), command


def completion(line: str, cwd: Path) -> list[str]:
    """What Hydra's bash completion offers for a command line typed up to its end."""
    command = line.split()[0]
    done = subprocess.run([str(BIN / command), "-sc", "query=bash"], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "COMP_LINE": line, "COMP_POINT": str(len(line))}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_hydra_completion_installs_in_bash_for_each_hydra_command():
    """docs/configuration.md's line, `eval "$(relnmt-train -sc install=bash)"`, for every Hydra command at once."""
    lines = [f'eval "$({BIN / command} -sc install=bash)" && complete -p {command}' for command in HYDRA_COMMANDS]
    done = subprocess.run(["bash", "-c", " && ".join(lines)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    installed = [line.split()[-1] for line in done.stdout.splitlines() if "-F hydra_bash_completion" in line]
    assert installed == list(HYDRA_COMMANDS), done.stdout


def test_completion_offers_the_presets_and_fields_from_any_folder(tmp_path):
    assert completion("relnmt-train model=", tmp_path) == ["model=base", "model=big", "model=tiny"]
    assert "+experiment=table1" in completion("relnmt-train +experiment=t", tmp_path)
    assert completion("relnmt-train model=tiny train.max_st", tmp_path) == ["train.max_steps="]
    assert "data=wmt14_en_de" in completion("relnmt-prepare data=w", tmp_path)


def test_completion_offers_an_enum_or_bool_fields_values_quickly_without_torch(tmp_path):
    assert completion("relnmt-train model.position=", tmp_path) == [
        f"model.position={mode}" for mode in ("relative", "absolute", "both", "none", "learned", "t5", "alibi", "rope")]
    assert completion("relnmt-train model.position=r", tmp_path) == ["model.position=relative", "model.position=rope"]
    assert completion("relnmt-train model.rel_key=", tmp_path) == ["model.rel_key=true", "model.rel_key=false"]
    assert "precision=bf16" in completion("relnmt-translate precision=", tmp_path)
    probe = "import sys, runpy; sys.argv = ['relnmt-train', '-sc', 'query=bash']; " \
            "from nmt.commands import train; train(); print('torch' in sys.modules, file=sys.stderr)"
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COMP_LINE": "relnmt-train model=", "PYTHONPATH": str(ROOT)})
    assert done.stdout.split() == ["model=base", "model=big", "model=tiny"] and done.stderr.split()[-1] == "False"


def test_the_editable_build_says_no_warning(tmp_path):
    """make install's pip builds the package with setuptools: no deprecation or notice on every install."""
    build = "import setuptools.build_meta as b, sys; b.build_editable(sys.argv[1])"
    done = subprocess.run([sys.executable, "-W", "always", "-c", build, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "warning" not in (done.stdout + done.stderr).lower(), done.stderr[-3000:]
