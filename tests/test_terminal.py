"""What a user sees in a terminal: the progress bar and the log lines apart, and whole lines in a log file."""

import fcntl
import io
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time

import pytest
from tqdm import tqdm

from nmt import progress
from nmt.progress import ProgressBar
from nmt.training.metrics import BAR_FORMAT, Metrics
from tests.conftest import ROOT, data_overrides, model_overrides, process_state_kept

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING) ")
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def train_overrides(prepared, out) -> list[str]:
    # a log line every update and a validation every 4: as many chances as possible for a line to meet the bar
    return [*data_overrides(prepared), *model_overrides(), "train.max_steps=8", "train.max_tokens=800",
            "train.log_every=1", "train.valid_every=4", "train.valid_bleu_sentences=0", "train.save_every_steps=8",
            "train.threads=1", f"train.output_dir={out}"]


def run_in_terminal(command: list[str], timeout: float = 180) -> str:
    """The command's stdout and stderr as a terminal of 120 columns receives them."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # rows, columns: tqdm reads them
    os.set_blocking(parent, False)
    process = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "TERM": "xterm"}, stdin=child, stdout=child, stderr=child)
    os.close(child)
    received, deadline = bytearray(), time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(parent, 65536)
        except BlockingIOError:
            if process.poll() is not None:
                break
            time.sleep(0.05)
            continue
        except OSError:  # EIO: the child side closed
            break
        received += chunk
    process.wait(timeout=10)
    os.close(parent)
    assert process.returncode == 0, received.decode(errors="replace")[-3000:]
    return received.decode(errors="replace")


def screen_lines(text: str) -> list[str]:
    """What the terminal's cursor wrote between returns: a bar redrawn over itself is one piece per draw."""
    return [piece.strip() for piece in re.split(r"[\r\n]", ANSI.sub("", text)) if piece.strip()]


def test_log_lines_never_meet_the_progress_bar_in_a_terminal(prepared, tmp_path):
    shown = run_in_terminal([sys.executable, "-m", "nmt.train", *train_overrides(prepared, tmp_path / "run")])
    pieces = screen_lines(shown)
    bars = [piece for piece in pieces if "upd" in piece and "|" in piece]
    logs = [piece for piece in pieces if re.search(r"(INFO|WARNING) nmt", piece)]
    assert bars, "no progress bar was drawn in the terminal"
    assert len([line for line in logs if "train update" in line]) == 8, logs
    glued = [piece for piece in logs if not TIMESTAMP.match(piece)]
    assert not glued, f"log lines written onto the bar: {glued}"


def test_a_piped_run_writes_whole_lines(prepared, tmp_path):
    """Off a terminal (`| tee log`, a SLURM log) each draw of the bar is a line of its own: no carriage return,
    every line a log line or a progress line; train.log holds log lines only."""
    done = subprocess.run([sys.executable, "-m", "nmt.train", *train_overrides(prepared, tmp_path / "run")],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    log_file = (tmp_path / "run" / "train.log").read_text()
    progress = [line for line in done.stderr.splitlines() if "upd" in line and "|" in line]
    assert progress and "8/8" in progress[-1], done.stderr
    for text, bars in ((done.stderr, progress), (log_file, [])):
        assert "\r" not in text
        assert all(TIMESTAMP.match(line) or line in bars for line in text.splitlines() if line), text


def test_off_a_terminal_a_bar_writes_no_line_before_its_first_item():
    """A log gets no `0 pairs [00:00, ? pairs/s]` line from a bar that is opened and closed at once (prepare's
    steps when the folder is up to date), and a finished bar still ends with its total."""
    log = io.StringIO()
    with ProgressBar(desc="encode train", unit=" pairs", leave=False, file=log):
        pass
    for _ in ProgressBar(range(3), desc="translate", file=log):
        pass
    lines = log.getvalue().splitlines()
    assert len(lines) == 1 and "3/3" in lines[0] and "0/3" not in log.getvalue(), lines


def test_off_a_terminal_the_bar_writes_a_line_an_interval_and_its_end_once(monkeypatch):
    """However often tqdm is asked to draw (its monitor thread, refreshes, a postfix set at every update), a log gets
    at most a line an interval and the finished bar once: no pairs of lines, no final line twice."""
    monkeypatch.setattr(progress, "OFF_TERMINAL_INTERVAL", 0.25)
    log = io.StringIO()
    bar = ProgressBar(total=12, unit="upd", file=log)
    started = time.monotonic()
    for i in range(12):
        time.sleep(0.05)
        bar.set_postfix_str(f"loss {i}", refresh=True)
        bar.update(1)
        bar.refresh()
    bar.close()
    lines = log.getvalue().splitlines()
    assert len(lines) <= (time.monotonic() - started) / 0.25 + 2, lines
    assert [line for line in lines if "12/12" in line] == [lines[-1]] and "loss 11" in lines[-1], lines


def test_the_bar_fits_80_columns_with_its_figures():
    line = tqdm.format_meter(75000, 100000, 36000, ncols=80, bar_format=BAR_FORMAT, unit="upd",
                             postfix="loss 3.456, 123.4k tok/s")
    assert len(line) <= 80 and line.endswith("tok/s"), line


def test_log_lines_and_the_bar_hold_the_interval_since_the_last_line(tmp_path, caplog):
    """Token-weighted loss and nll over the updates since the last line, tokens/s over its wall time; the bar shows
    the same interval's figures after every update, not the last log line's."""
    metrics = Metrics(tmp_path, True, 10, 0)
    updates = [(3.0, 2.0, 100), (1.0, 0.5, 300), (2.0, 1.0, 600)]
    with caplog.at_level("INFO", logger="nmt.train"):
        for step, (loss, nll, tokens) in enumerate(updates, 1):
            metrics.update(step, {"loss": loss, "nll": nll, "lr": 1e-4 * step, "grad_norm": float(step),
                                  "tokens": tokens, "ppl": 0.0}, log_now=step == 2)
            if step == 2:
                assert "loss 1.500" in metrics.bar.postfix  # (3 x 100 + 1 x 300) / 400
    metrics.close()
    line = next(r.getMessage() for r in caplog.records if "train update 2:" in r.getMessage())
    assert " loss 1.5 " in line and " nll 0.875 " in line and " tokens 400 " in line and " grad_norm 1.5 " in line
    assert "loss 2.000" in metrics.bar.postfix  # the new interval: update 3 alone


@pytest.mark.parametrize("stop", [KeyboardInterrupt])
def test_a_run_ended_at_once_closes_its_bar_first(prepared, tmp_path, stop, monkeypatch):
    """Ctrl-C twice raises out of the loop: the bar is closed there, so none is drawn below the message."""
    from nmt.runtime.process import setup_env
    from nmt.training.trainer import Trainer
    from tests.test_train import job

    def interrupted(*_args, **_kwargs):
        raise stop

    with process_state_kept():
        trainer = Trainer(job(prepared, tmp_path), setup_env("cpu", 1))
        monkeypatch.setattr(trainer, "train_step", interrupted)
        with pytest.raises(stop):
            trainer.train()
    assert trainer.metrics.bar.disable  # tqdm's mark of a closed bar
