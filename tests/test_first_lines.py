"""What a new user meets first: a study on a CPU without native bf16 says so before it trains, --help names the
sweep, study, --cfg and completion flags, `--cfg job --resolve` prints the job, a mistyped study keeps its `+`, and a
table filtered to nothing says so."""

import subprocess
import sys

import pytest

from nmt.compose import register_schemas
from nmt.overrides import emulated_bf16_error, override_error
from tests.conftest import ROOT, fake_cell, multi30k

ENV = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_a_bf16_study_on_a_cpu_without_native_bf16_says_so_before_it_trains():
    register_schemas()
    error = emulated_bf16_error([["+study=table3"]], native=False)  # the CPU faked: no native bf16
    assert error is not None and "train.precision=fp32" in error and "train.precision=bf16" in error
    assert emulated_bf16_error([["+study=table3"]], native=True) is None
    for chosen in ("train.precision=fp32", "train.precision=bf16"):  # an explicit choice is the user's
        assert emulated_bf16_error([["+study=table3", chosen]], native=False) is None
    assert emulated_bf16_error([["model=tiny"]], native=False) is None  # the default recipe: fp32 on a CPU


def run(*args):
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=ENV, capture_output=True, text=True,
                          timeout=120)


def test_help_names_the_sweep_the_studies_cfg_and_completion():
    shown = run("nmt.train", "--help").stdout
    for part in ("-m KEY=A,B", "-m +study=NAME", "table1", "--cfg job [--resolve]", "-sc install=bash"):
        assert part in shown, part
    assert "(optional)" not in shown.split("data.test=")[1].splitlines()[0]  # the local preset asks for it


def test_cfg_job_resolve_prints_the_job_with_its_folder():
    done = run("nmt.train", "--cfg", "job", "--resolve")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "output_dir: outputs/tiny_multi30k_en_de" in done.stdout


@pytest.mark.parametrize("typo, hint", [("+study=tabel1", "did you mean +study=table1?"),
                                        ("+experiment=tabel1", "did you mean +experiment=table1?"),
                                        ("model=tinny", "did you mean model=tiny?")])
def test_a_mistyped_preset_is_suggested_as_it_must_be_written(typo, hint):
    register_schemas()
    assert hint in override_error("train", [typo])


def test_a_table_filtered_to_nothing_says_so(tmp_path):
    register_schemas()
    refs = multi30k("test_2016_flickr")
    for seed in (1, 2):
        fake_cell(tmp_path, refs, refs, seed, "+ablation=k16")
    nothing = run("nmt.table", str(tmp_path), "--where", "train.seed=3")
    assert nothing.returncode == 2 and "no row of" in nothing.stderr and "train.seed=3" in nothing.stderr
    one = run("nmt.table", str(tmp_path), "--where", "train.seed=1", "--samples", "10")
    assert one.returncode == 0 and "| ablation=k16 | 1 |" in one.stdout.replace("(the shared overrides)",
                                                                                "ablation=k16"), one.stdout
