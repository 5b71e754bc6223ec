"""What a new user meets first: --help, a --flag, averaging after a stop, progress and n-best lists (issue 34)."""

import gzip
import re
from pathlib import Path

import pytest
import torch

from nmt import config
from nmt.checkpoints.checkpoint import load_checkpoint, save_checkpoint
from nmt.fields import help_text, schema_fields
from nmt.overrides import flag_error
from nmt.decoding.search import beam_search, beam_search_nbest
from nmt.train import run
from nmt.translate import count_lines
from tests.conftest import ROOT
from tests.test_search import real_model, sources
from tests.test_train import job
from tests.test_translate import cli

JOBS = {"train": config.TrainJob, "prepare": config.PrepareJob, "decode": config.DecodeJob,
        "score": config.ScoreJob, "export": config.ExportJob, "average": config.AverageJob}


@pytest.mark.parametrize("name", JOBS)
def test_every_field_of_every_job_has_a_description(name):
    fields = schema_fields(JOBS[name])
    assert fields and all(description for _, description in fields.values()), \
        [f for f, (_, d) in fields.items() if not d]


def test_help_lists_the_tools_own_fields_with_defaults_and_descriptions():
    train = help_text("train", config.TrainJob, "python -m nmt.train", "python -m nmt.train ...: the training loop.")
    assert "  model.clip=16" in train and "k: relative distances are clipped to [-k, k]" in train
    assert "model.d_model=256" in train  # the default preset's value (model=tiny), not the dataclass's 512
    assert "presets: model=base|big|tiny" in train and "+experiment=NAME" in train
    assert "schema" not in train and "checkpoint=" not in train
    decode = help_text("decode", config.DecodeJob, "python -m nmt.translate", None)
    assert "  beam=4" in decode and "nbest=1" in decode and "GNMT length penalty exponent" in decode
    assert "model." not in decode and "data." not in decode and "experiment" not in decode


def test_help_from_the_command_line():
    result = cli("nmt.translate", "--help")
    assert result.returncode == 0 and "checkpoint=???" in result.stdout and "schema" not in result.stdout


def test_a_flag_gets_one_line_with_the_nearest_field():
    assert flag_error(["--max-steps", "10"], config.TrainJob) == \
        "options are key=value, not --max-steps: did you mean train.max_steps=10?"
    assert flag_error(["--warmpu=10"], config.TrainJob).endswith("did you mean optim.warmup=10?")
    assert flag_error(["--beam", "5"], config.DecodeJob).endswith("did you mean beam=5?")
    assert flag_error(["--zzzz"], config.DecodeJob) == "options are key=value, not --zzzz"
    assert flag_error(["model=tiny", "-m", "--cfg", "job"], config.TrainJob) is None  # Hydra's own flags
    result = cli("nmt.train", "--max-steps", "10")
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "train.max_steps=10" in result.stderr


def weights_checkpoint(path, step, value, saved_for):
    save_checkpoint({"model": {"w": torch.full((2,), float(value))}, "step": step, "saved_for": saved_for}, path)


def test_average_leaves_out_a_checkpoint_saved_at_a_signal(tmp_path):
    for step, saved_for in ((100, "cadence"), (113, "signal"), (200, "cadence"), (300, "end")):
        weights_checkpoint(tmp_path / f"checkpoint_{step:07d}.pt", step, step, saved_for)
    result = cli("nmt.average", f"directory={tmp_path}", "last=3")
    assert result.returncode == 0, result.stderr
    averaged = load_checkpoint(tmp_path / "averaged.pt")
    assert averaged["averaged_from"] == ["checkpoint_0000100.pt", "checkpoint_0000200.pt", "checkpoint_0000300.pt"]
    torch.testing.assert_close(averaged["model"]["w"], torch.full((2,), 200.0))
    assert "left out checkpoint_0000113.pt: saved when a signal stopped the run" in result.stderr
    old_flags = cli("nmt.average", str(tmp_path), "--last", "2", "--output", str(tmp_path / "two.pt"))
    assert old_flags.returncode == 0 and load_checkpoint(tmp_path / "two.pt")["model"]["w"][0] == 250.0
    too_many = cli("nmt.average", f"directory={tmp_path}", "last=4")
    assert too_many.returncode == 2 and "has 3 regular ones (1 more saved at a signal" in too_many.stderr


def test_final_validation_and_the_runs_total_time_are_logged(prepared, tmp_path, capfd):
    run(job(prepared, tmp_path, max_steps=2, valid_every=0, valid_bleu_sentences=4))
    logged = capfd.readouterr().err
    assert "final validation at update 2" in logged and "final validation took" in logged
    first = load_checkpoint(tmp_path / "checkpoint_0000002.pt")
    assert first["saved_for"] == "cadence"
    seconds = load_checkpoint(tmp_path / "checkpoint_last.pt")["train_seconds"]
    assert seconds > 0
    run(job(prepared, tmp_path, max_steps=3, valid_every=0, valid_bleu_sentences=4))  # the same run, extended
    assert load_checkpoint(tmp_path / "checkpoint_0000003.pt")["saved_for"] == "end"  # off the cadence of 2
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_seconds"] > seconds  # both sessions
    done = next(line for line in capfd.readouterr().err.splitlines() if "nmt.train: done: " in line)
    assert "minutes of training (" in done and "in this session)" in done


def test_count_lines_counts_what_translate_reads(tmp_path):
    (tmp_path / "a").write_bytes(b"one\ntwo\n\nfour")
    (tmp_path / "b").write_bytes(b"")
    with gzip.open(tmp_path / "c.gz", "wb") as f:
        f.write(b"x\n" * 1000)
    assert [count_lines(str(tmp_path / n)) for n in ("a", "b", "c.gz")] == [4, 0, 1000]


def test_nbest_lists_are_the_search_best_first():
    model, src = real_model(), sources(5)
    best = beam_search(model, src, beam=4, alpha=0.6, max_extra=8)
    lists = beam_search_nbest(model, src, beam=4, alpha=0.6, max_extra=8, nbest=3)
    for one, hyps in zip(best, lists):
        assert len(hyps) == 3 and hyps[0].tokens == one.tokens and hyps[0].score == pytest.approx(one.score)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == 3
    with pytest.raises(ValueError, match="nbest=5"):
        beam_search_nbest(model, src, beam=4, nbest=5)


def test_translate_nbest_writes_one_block_per_line(checkpoint, tmp_path):
    lines = ["A man rides a bike.", "", "A dog runs."]
    src = tmp_path / "in.en"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = cli("nmt.translate", f"checkpoint={checkpoint}", f"input={src}", "nbest=3")
    assert result.returncode == 0, result.stderr
    rows = [line.split(" ||| ") for line in result.stdout.splitlines()]
    assert [int(index) for index, _, _ in rows] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all(len(row) == 3 and float(row[2]) <= 0 for row in rows)
    assert rows[3][1] == "" and float(rows[3][2]) == 0.0  # an empty line: empty translations
    one = cli("nmt.translate", f"checkpoint={checkpoint}", f"input={src}")
    assert [rows[0][1], rows[3][1], rows[6][1]] == one.stdout.splitlines()  # the first of each block is the 1-best
    assert "3/3" in result.stderr  # progress in lines, with the file's total


def test_code_is_imported_as_packages_never_by_path():
    """benchmarks/ and experiments/ are packages run with python -m: nothing edits sys.path or loads a file of this
    checkout by its path, and scripts/ holds launchers that nothing imports."""
    # the one load by path: OpenNMT-py's attention file as a reference, without its package's heavy __init__
    allowed = {(ROOT / "benchmarks" / "attention.py", "spec_from_file_location")}
    for path in ROOT.glob("*/**/*.py"):
        if path.parts[len(ROOT.parts)] in (".venv", "outputs", "build") or path == Path(__file__):
            continue
        text = path.read_text()
        for load in ("sys.path.insert", "sys.path.append", "sys.path[", "spec_from_file_location"):
            assert load not in text or (path, load) in allowed, f"{path}: {load}"
        assert not re.search(r"^\s*(from|import) scripts\b", text, re.M), path


def test_classes_stay_one_concept_in_size():
    import ast

    for path in (ROOT / "nmt").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno - node.lineno + 1 <= 160, f"{path.name}: {node.name}"



def nmt_imports() -> dict[str, set[str]]:
    """{module: the nmt modules it imports at its top level} (imports inside functions are lazy by intent)."""
    import ast

    modules = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (ROOT / "nmt").rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
        graph[name] = found - {name}
    return graph


def test_files_are_one_concept_in_size_and_imports_never_go_round():
    for path in (ROOT / "nmt").rglob("*.py"):
        assert len(path.read_text().splitlines()) <= 300, f"{path}: over 300 lines, more than one concept"
    graph, done = nmt_imports(), set()

    def visit(module, path):
        assert module not in path, f"import circle: {' -> '.join([*path[path.index(module):], module])}"
        if module not in done:
            for imported in graph[module]:
                visit(imported, [*path, module])
            done.add(module)

    for module in graph:
        visit(module, [])


def test_result_records_name_the_cpu_by_what_decides_its_kernels(tmp_path, monkeypatch):
    """Every figure says which CPU: its model name (platform.processor() is empty on Linux), and since cloud CPUs
    share one name across generations, its family, model, stepping and the kernel-deciding flags, in the device
    string of a result and in every benchmark report (with its command and date)."""
    import json
    import sys

    from benchmarks.report import write_report
    from nmt.machine import KERNEL_FLAGS, machine

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text(errors="replace").splitlines() if cpuinfo.exists() else []
    field = {}
    for line in lines:
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    if "model name" not in field:
        pytest.skip("no model name in /proc/cpuinfo")
    flags = [flag for flag in KERNEL_FLAGS if flag in field.get("flags", "").split()]
    described = machine(torch.device("cpu"))
    assert described.startswith(f"CPU {field['model name']} (")
    assert f"family {field['cpu family']} model {field['model']} stepping {field['stepping']}" in described
    assert " ".join(flags) in described
    monkeypatch.setattr(sys, "argv", ["benchmarks/x.py", "--repeats", "1"])
    write_report(tmp_path / "r.json", {"seconds": 1.5})
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["seconds"] == 1.5 and record["host"]["model"] == field["model"] and record["date"]
    assert record["host"]["kernel_flags"] == flags and record["command"].endswith("--repeats 1")


def test_a_run_ends_with_its_last_validation_the_model_to_use_and_the_next_command(prepared, tmp_path, capfd):
    run(job(prepared, tmp_path, max_steps=2, valid_every=0, valid_bleu_sentences=4, average_last=1))
    logged = capfd.readouterr().err
    assert "last validation (update 2): nll " in logged and "greedy BLEU" in logged
    assert f"the model to use: {tmp_path / 'averaged.pt'} (the average of the last 1 checkpoints)" in logged
    source = Path(prepared.prepared_dir) / f"test.{prepared.src}"
    assert f"next: relnmt-translate checkpoint={tmp_path / 'averaged.pt'} input={source} " in logged
    assert "relnmt-score hyp=" in logged


def test_a_dry_run_says_the_batch_the_size_and_the_time_and_writes_no_run(prepared, tmp_path):
    import subprocess
    import sys

    from tests.conftest import data_overrides, model_overrides

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "nmt.train", *data_overrides(prepared), *model_overrides(),
                           "train.max_tokens=300", "train.max_steps=1000", "train.threads=1", "train.device=cpu",
                           f"train.output_dir={out}", "train.dry_run=true"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "effective batch: 1 devices x 300 tokens" in done.stdout and " parameters; 1,000 updates" in done.stdout
    assert re.search(r"estimate: [\d.]+ s an update .* x 1,000 updates = [\d.]+ hours", done.stdout), done.stdout
    assert "max_steps: 1000" in done.stdout  # the composed job
    assert not out.exists()


def test_the_bundled_corpus_is_found_from_any_folder(tmp_path, monkeypatch):
    from nmt.config import DataConfig
    from nmt.data.readers import REPOSITORY, multi30k_prefix
    from nmt.data.sources import read_blocks

    monkeypatch.chdir(tmp_path)
    assert multi30k_prefix("data/multi30k", "valid") == str(REPOSITORY / "data" / "multi30k" / "val")
    valid = read_blocks(DataConfig(name="multi30k", root="data/multi30k", src="en", tgt="de"), "valid", 400)
    assert sum(len(block.pairs()) for block in valid) == 1014
    monkeypatch.chdir(REPOSITORY)  # from the repository, as given: the prepared data's identity is unchanged
    assert multi30k_prefix("data/multi30k", "valid") == "data/multi30k/val"


@pytest.mark.parametrize("full", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                  MemoryError()])
def test_a_micro_batch_that_does_not_fit_names_the_two_remedies(prepared, tmp_path, monkeypatch, full):
    """Out of memory (the GPU's, faked here, or the host's): one line naming the settings that keep the batch."""
    from nmt.train import OutOfMemory
    from nmt.training.trainer import Trainer

    def no_room(*_args, **_kwargs):
        raise full

    monkeypatch.setattr(Trainer, "train_step", no_room)
    with pytest.raises(OutOfMemory) as said:
        run(job(prepared, tmp_path, max_steps=2, valid_every=0, valid_bleu_sentences=0))
    line = str(said.value)
    assert "\n" not in line and "train.checkpoint_activations=true" in line and "a smaller train.max_tokens" in line
    assert ("the GPU's" if isinstance(full, torch.OutOfMemoryError) else "the host's") in line
