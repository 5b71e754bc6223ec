"""What a person at a terminal does to a running job: Ctrl-C (once, twice, under torchrun), `| head`, and waiting for
the first line of a translation."""

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nmt.checkpoints.checkpoint import LAST, load_checkpoint
from nmt.decoding import decode
from nmt.errors import EXIT_STOPPED
from nmt.runtime.signals import AGAIN_AFTER_S, stop_signals
from tests.conftest import INTERACTIVE, ROOT, data_overrides, model_overrides, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}




def train_args(data, out: Path, *extra) -> list[str]:
    return ["-m", "nmt.train", *data_overrides(data), *model_overrides(), "train.max_tokens=300", "train.valid_every=0",
            "train.valid_bleu_sentences=0", "train.threads=1", "train.log_every=1", "train.save_every_steps=1000",
            "train.max_steps=100000", "train.device=cpu", f"train.output_dir={out}", *extra]


def logged(out: Path, step: int) -> bool:
    log = out / "train.log"
    return log.is_file() and f"train update {step}:" in log.read_text()


def test_a_first_ctrl_c_raises_the_flag_and_a_second_one_later_stops_at_once():
    found = signal.getsignal(signal.SIGINT)  # Python's default_int_handler, or SIG_IGN where inherited ignored
    with stop_signals(announce=False) as signals:
        os.kill(os.getpid(), signal.SIGINT)
        assert signals["received"] == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)  # at once: the same press, passed on by a launcher
        time.sleep(AGAIN_AFTER_S + 0.1)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs here
    assert signal.getsignal(signal.SIGINT) is found  # put back as it was found


def test_ctrl_c_saves_the_update_it_stopped_at_and_the_same_command_continues(prepared, tmp_path):
    job = subprocess.Popen([sys.executable, *train_args(prepared, tmp_path)], cwd=ROOT, env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **INTERACTIVE)
    wait_for(lambda: logged(tmp_path, 3))
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == EXIT_STOPPED and "Traceback" not in stderr and "Ctrl-C: stopping" in stderr
    step = load_checkpoint(tmp_path / LAST)["step"]
    assert step >= 3 and logged(tmp_path, step) and not logged(tmp_path, step + 1)  # nothing trained is lost
    again = subprocess.run([sys.executable, *train_args(prepared, tmp_path)[:-2], f"train.output_dir={tmp_path}",
                            f"train.max_steps={step + 2}"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert again.returncode == 0 and f"at update {step}" in (tmp_path / "train.log").read_text()


def test_ctrl_c_at_a_terminal_stops_torchruns_workers_with_a_checkpoint(prepared, tmp_path):
    """The terminal sends SIGINT to the whole foreground group: torchrun and both workers (and torchrun passes it
    on once more)."""
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                 "--monitor-interval=0.2", *train_args(prepared, tmp_path)], cwd=ROOT, env=ENV,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
                                **INTERACTIVE)
    try:
        wait_for(lambda: logged(tmp_path, 4))
        os.killpg(launcher.pid, signal.SIGINT)
        _, stderr = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    state = load_checkpoint(tmp_path / LAST)
    assert state["step"] >= 4 and len(state["rng"]) == 2 and logged(tmp_path, state["step"])
    assert "stopped by SIGINT" in (tmp_path / "train.log").read_text()


@pytest.fixture
def long_input(tmp_path) -> Path:
    src = tmp_path / "in.en"
    src.write_text("".join(f"A man number {i} rides a red bike in the park.\n" for i in range(3000)))
    return src


def test_ctrl_c_keeps_every_finished_line_of_a_translation(checkpoint, long_input, tmp_path):
    out = tmp_path / "out.de"
    job = subprocess.Popen([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", f"input={long_input}",
                            f"output={out}", "beam=1", "device=cpu"], cwd=ROOT, env=ENV, stderr=subprocess.PIPE,
                           text=True, **INTERACTIVE)
    wait_for(lambda: out.is_file() and out.read_text().count("\n") >= 8)
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=120)
    kept = out.read_text()
    assert job.returncode == 130 and "Traceback" not in stderr and "every finished line is written" in stderr
    assert kept.endswith("\n") and 8 <= kept.count("\n") < 3000


def test_a_closed_pipe_ends_the_filter_quietly(checkpoint, long_input):
    job = subprocess.Popen([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", "beam=1",
                            "device=cpu"], cwd=ROOT, env=ENV, stdin=open(long_input), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE)
    job.stdout.readline()  # `| head -1`
    job.stdout.close()
    stderr = job.stderr.read().decode()
    assert job.wait(timeout=300) == 0 and "Traceback" not in stderr and "Broken pipe" not in stderr


def translate_with_input_still_arriving(checkpoint) -> subprocess.Popen:
    """nmt.translate reading a pipe that stays open (`(echo ...; sleep 15; echo ...) | relnmt-translate`), its first
    line already answered: its stdin reader is blocked waiting for more."""
    job = subprocess.Popen([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", "beam=1",
                            "device=cpu"], cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, **INTERACTIVE)
    job.stdin.write(b"A dog runs.\n")
    job.stdin.flush()
    ready, _, _ = select.select([job.stdout], [], [], 120)
    assert ready and job.stdout.readline().endswith(b"\n")
    return job


def test_a_pipe_closed_downstream_ends_quietly_while_input_still_arrives(checkpoint):
    """`(echo a; sleep 15; echo b) | relnmt-translate ... | head -1`: the reader is gone while the input pipe is still
    open, and the thread reading stdin is blocked in its read at exit; that read once held standard input's lock, and
    the interpreter aborted at shutdown (exit 134, "Fatal Python error: _enter_buffered_busy")."""
    job = translate_with_input_still_arriving(checkpoint)
    try:
        job.stdout.close()  # `head -1` has its line and leaves
        job.stdin.write(b"Two men talk.\n")  # its translation meets the closed pipe; the input stays open
        job.stdin.flush()
        code = job.wait(timeout=120)
        stderr = job.stderr.read().decode()
        assert code == 0 and "Fatal Python error" not in stderr and "Traceback" not in stderr, stderr[-2000:]
    finally:
        job.kill()
        job.wait()


def test_ctrl_c_while_input_still_arrives_exits_130_with_its_one_line(checkpoint):
    job = translate_with_input_still_arriving(checkpoint)
    try:
        job.send_signal(signal.SIGINT)
        code = job.wait(timeout=120)
        stderr = job.stderr.read().decode()
        assert code == 130 and "Fatal Python error" not in stderr and "Traceback" not in stderr, stderr[-2000:]
        assert stderr.strip().splitlines()[-1] == "interrupted: every finished line is written (Ctrl-C)"
    finally:
        job.kill()
        job.wait()


def test_the_first_line_comes_before_the_input_ends(checkpoint):
    """A pipe that stays open after 20 lines: the first translations come out anyway (a chunk of 5,000 lines waited
    for the rest of the input)."""
    job = subprocess.Popen([sys.executable, "-m", "nmt.translate", f"checkpoint={checkpoint}", "beam=1",
                            "device=cpu"], cwd=ROOT, env=ENV, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL)
    try:
        job.stdin.write(b"".join(b"A dog runs on the beach.\n" for _ in range(20)))
        job.stdin.flush()
        ready, _, _ = select.select([job.stdout], [], [], 120)
        assert ready and job.stdout.readline().endswith(b"\n")
    finally:
        job.kill()
        job.wait()


def test_chunks_after_the_first_are_sized_by_source_tokens():
    batches = decode.CHUNK_BATCHES * 4096
    assert decode.next_chunk_lines(8, 8 * 16, 4096, 100_000) == batches // 16  # lines of 16 tokens: that many
    assert decode.next_chunk_lines(1000, 32_000, 4096, 100_000) == round(batches / 32)
    assert decode.next_chunk_lines(8, 8 * 16, 4096, 1000) == 1000  # up to buffer_lines
    assert decode.next_chunk_lines(1, 10**9, 4096, 5000) == 1  # at least one line
    assert decode.next_chunk_lines(8, 8 * 16, 4096, 1) == 1  # buffer_lines=1: line by line
