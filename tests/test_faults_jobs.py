"""What a long job survives beyond the trainer's own faults (docs/robustness.md: what survives what): a second job
on a running job's folder, a folder of another model, the default folders of ablations, and a translation killed
part-way."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.config import SearchConfig
from nmt.decoding import decode
from nmt.run_names import model_overrides_suffix
from tests.conftest import ROOT, data_overrides, model_overrides, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def train_command(data, out: Path | None, *extra) -> list[str]:
    settings = ["train.max_tokens=300", "train.valid_every=0", "train.valid_bleu_sentences=0", "train.threads=1",
                "train.log_every=1", "train.save_every_steps=2", "train.device=cpu"]
    folder = [f"train.output_dir={out}"] if out is not None else []
    return [sys.executable, "-m", "nmt.train", *data_overrides(data), *model_overrides(), *settings, *folder, *extra]


def test_a_second_job_on_a_running_jobs_folder_is_refused_and_a_killed_job_leaves_no_lock(prepared, tmp_path):
    first = subprocess.Popen(train_command(prepared, tmp_path, "train.max_steps=100000"), cwd=ROOT, env=ENV,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "checkpoint_last.pt").exists())
        second = subprocess.run(train_command(prepared, tmp_path, "train.max_steps=4"), cwd=ROOT, env=ENV,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1, second.stderr
        assert f"{tmp_path} is being written by another training job (pid {first.pid} on" in second.stderr
    finally:
        first.send_signal(signal.SIGKILL)  # no chance to clean up
        first.wait()
    third = subprocess.run(train_command(prepared, tmp_path, "train.max_steps=4"), cwd=ROOT, env=ENV,
                           capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stderr[-2000:]  # the killed job's lock died with it
    assert "resuming from" in (tmp_path / "train.log").read_text()


def test_a_folder_of_another_model_is_one_line_and_keeps_its_record(prepared, tmp_path):
    made = subprocess.run(train_command(prepared, tmp_path, "train.max_steps=2"), cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    record = (tmp_path / "config.yaml").read_text()
    other = subprocess.run(train_command(prepared, tmp_path, "train.max_steps=4", "model.d_model=48",
                                         "model.rel_value=false"), cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    error = [line for line in other.stderr.splitlines() if "ERROR" in line]
    assert len(error) == 1 and "holds another run" in error[0]
    assert "model.d_model=48 (the folder's run: 32)" in error[0] and "model.rel_value=false" in error[0]
    assert (tmp_path / "config.yaml").read_text() == record


@pytest.mark.slow
def test_another_rate_for_t5s_tables_is_refused_on_resume_and_outside_t5(prepared, tmp_path):
    """optim.bias_lr_scale makes T5's tables an optimizer group of their own: a resume that would change the groups
    is one line (not load_state_dict's traceback), and the option refuses models with no such tables."""
    made = subprocess.run(train_command(prepared, tmp_path, "train.max_steps=2", "model.position=t5"), cwd=ROOT,
                          env=ENV, capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    other = subprocess.run(train_command(prepared, tmp_path, "train.max_steps=4", "model.position=t5",
                                         "optim.bias_lr_scale=10"), cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=300)
    assert other.returncode == 2 and "Traceback" not in other.stderr
    error = [line for line in other.stderr.splitlines() if "ERROR" in line]
    assert len(error) == 1 and "optim.bias_lr_scale=10.0 (the folder's run: 1.0)" in error[0], other.stderr
    relative = subprocess.run(train_command(prepared, tmp_path / "relative", "train.max_steps=2",
                                            "optim.bias_lr_scale=10"), cwd=ROOT, env=ENV, capture_output=True,
                              text=True, timeout=300)
    assert relative.returncode == 2 and "Traceback" not in relative.stderr
    assert "optim.bias_lr_scale" in relative.stderr and "model.position=t5" in relative.stderr
    assert not (tmp_path / "relative").exists()


def test_ablations_get_default_folders_of_their_own(prepared, tmp_path):
    """The README's Table 3 line after its relative run: each trains in its own outputs/<model>_<data>... folder."""
    for extra in ([], ["model.rel_value=false"]):
        done = subprocess.run(train_command(prepared, None, "train.max_steps=2", *extra), cwd=tmp_path, env=ENV,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
    suffix = model_overrides_suffix(model_overrides())
    folders = sorted(p.name for p in (tmp_path / "outputs").iterdir())
    data = f"local_en_de.{Path(prepared.train).parent.name}_train"  # the pair and the corpus, named
    assert folders == [f"tiny_{data}{suffix}",
                       f"tiny_{data}{model_overrides_suffix([*model_overrides(), 'model.rel_value=false'])}"]
    assert ".rel_value-false" in folders[1] and "=" not in "".join(folders) and "," not in "".join(folders)


def test_translating_a_stream_holds_one_chunk_at_a_time(monkeypatch):
    """A stand-in model: what matters is how far the reader runs ahead of the writer."""
    pulled, written = [0], [0]

    def source():
        for i in range(10_000):
            pulled[0] += 1
            yield f"line {i}"

    monkeypatch.setattr(decode, "encoded", lambda model, vocab, lines, *a: [list(line) for line in lines])
    monkeypatch.setattr(decode, "written", lambda model, vocab, ids, *a: ["".join(row).upper() for row in ids])
    ahead = 0
    out = []
    for chunk in decode.translate_stream(None, None, source(), SearchConfig(), None, chunk_lines=300):
        ahead = max(ahead, pulled[0] - written[0])
        written[0] += len(chunk)
        out += chunk
    assert ahead <= 300 and out == [f"LINE {i}" for i in range(10_000)]


def test_a_killed_translation_keeps_every_finished_chunk_in_order(checkpoint, tmp_path):
    lines = [f"A man number {i} rides a bike in the park." if i % 7 else "" for i in range(400)]
    src = tmp_path / "in.en"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    command = [sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", f"input={src}", "beam=1",
               "buffer_lines=40", "device=cpu"]
    whole = subprocess.run(command, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
    assert whole.returncode == 0 and len(whole.stdout.splitlines()) == 400
    partial = tmp_path / "partial.de"
    with open(partial, "w") as stdout:
        job = subprocess.Popen(command, cwd=ROOT, env=ENV, stdout=stdout, stderr=subprocess.DEVNULL)
        wait_for(lambda: partial.read_text().count("\n") >= 80)
        job.send_signal(signal.SIGKILL)
        job.wait()
    kept = partial.read_text().splitlines(keepends=True)
    assert 80 <= len(kept) < 400 and all(line.endswith("\n") for line in kept)  # whole lines of whole chunks
    assert "".join(kept) == "".join(whole.stdout.splitlines(keepends=True)[:len(kept)])  # in input order


@pytest.mark.parametrize("value", ["0", "-5"])
def test_buffer_lines_must_be_positive(checkpoint, value):
    done = subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", f"buffer_lines={value}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, input="")
    assert done.returncode == 2 and f"buffer_lines={value} is invalid" in done.stderr


def test_a_run_saved_before_a_model_field_existed_resumes_at_its_default(tmp_path):
    """A checkpoint whose config predates model.edge_buckets is the same model at edge_buckets=0 (its default),
    and another model at any other value."""
    import dataclasses

    import torch

    from nmt.checkpoints.checkpoint import CheckpointError
    from nmt.checkpoints.resume import check_same_config
    from tests.conftest import micro_config

    model = {k: getattr(v, "value", v) for k, v in dataclasses.asdict(micro_config()).items()}
    older = {k: v for k, v in model.items() if k != "edge_buckets"}
    state = {"config": {"model": older, "optim": {}}, "model": {"embed.weight": torch.zeros(40, 32)}}
    check_same_config(state, {"model": model, "optim": {}}, 40, 4096, tmp_path)
    with pytest.raises(CheckpointError, match=r"model.edge_buckets=8 \(the folder's run: 0\)"):
        check_same_config(state, {"model": {**model, "edge_buckets": 8, "clip": 12}, "optim": {}}, 40, 4096,
                          tmp_path)
