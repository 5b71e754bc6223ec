"""The GPU check (scripts/gpu_check.sh): its CPU dry run executes every stage and yields the file set a real run
brings back; a stage that fails or runs out of time costs only itself."""

import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

from benchmarks import gpu_check
from tests.conftest import ROOT


def test_the_stage_limits_fit_eight_minutes():
    assert sum(stage.limit_s for stage in gpu_check.STAGES) <= 8 * 60
    assert [stage.name for stage in gpu_check.STAGES][:3] == ["inputs", "kernel", "trainer"]  # by value


@pytest.mark.slow
def test_dry_run_runs_every_stage_and_brings_back_at_most_eight_files(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run(["scripts/gpu_check.sh", "--dry-run", str(out)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable}, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(os.listdir(out)) == sorted(gpu_check.OUTPUT_FILES) and len(gpu_check.OUTPUT_FILES) <= 8
    stages = json.loads((out / "answers.json").read_text())["stages"]
    assert list(stages) == [stage.name for stage in gpu_check.STAGES]
    for name, result in stages.items():
        assert result["status"] == "ok" and result["error"] is None, (name, result)
        assert result["answers"]["headline"], name
        assert "error" not in json.dumps(result["answers"]).lower(), (name, result["answers"])
    summary = (out / "summary.md").read_text()
    assert all(f"| {stage.name} | ok |" in summary for stage in gpu_check.STAGES)
    with tarfile.open(out / "archive.tar.gz") as archive:
        names = set(archive.getnames())
    assert {f"{stage.name}.json" for stage in gpu_check.STAGES} <= names and "trainer_base/train.log" in names
    assert not any(name.endswith(".pt") for name in names)
    log = (out / "log.txt").read_text()
    assert all(f"== {stage.name} " in log for stage in gpu_check.STAGES) and "Traceback" not in log


def test_a_stage_past_its_limit_is_killed_with_its_children_and_keeps_its_answers(tmp_path):
    child = tmp_path / "child.pid"
    answers = tmp_path / "stage.json"
    code = f"""
import json, subprocess, sys, time
sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
open({str(child)!r}, "w").write(str(sleeper.pid))
json.dump({{"first": 1}}, open({str(answers)!r}, "w"))
print("answered the first question", flush=True)
time.sleep(600)
"""
    with open(tmp_path / "log.txt", "w") as log:
        start = time.monotonic()
        status, seconds, error = gpu_check.run_stage([sys.executable, "-c", code], 5, log)
    assert status == "timeout" and "limit of 5 s" in error and time.monotonic() - start < 30
    assert json.loads(answers.read_text()) == {"first": 1}
    assert "answered the first question" in (tmp_path / "log.txt").read_text()  # unbuffered, kept on a kill
    time.sleep(0.5)
    pid = int(child.read_text())
    assert not os.path.exists(f"/proc/{pid}") or "Z" in open(f"/proc/{pid}/stat").read().split()[2]

    with open(tmp_path / "log.txt", "a") as log:
        status, _, error = gpu_check.run_stage([sys.executable, "-c", "raise SystemExit(3)"], 30, log)
    assert (status, error) == ("failed", "exit code 3")
