"""Progress bars that share the terminal with the log: the one bar class of every command that shows one.

On a terminal, while a bar is open, log records bound for the console go through tqdm.write, which clears the bar,
writes the whole line and draws the bar again below it, so a log line is never glued to the bar; file handlers
(train.log) are left as they are. Off a terminal (a pipe, a SLURM log, `| tee`) the bar is redrawn at most once a
minute, each time as a line of its own: no carriage return, no fragment of a bar in the file, no line before the
first item (a bar's opening draw at 0 says nothing a log line does not), and the last state once. The minute is kept
here, not left to tqdm, whose monitor thread and refreshes draw more often."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

OFF_TERMINAL_INTERVAL = 60.0  # seconds between two progress lines in a file


class WholeLines:
    """A stream for a bar off a terminal: each draw becomes one line, a clear nothing."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


class ProgressBar(tqdm):
    def __init__(self, *args, disable: bool = False, file=None, mininterval: float = 0.1, **kwargs):
        self._redirect = None
        file = file if file is not None else sys.stderr
        on_terminal = hasattr(file, "isatty") and file.isatty()
        self._whole_lines = not on_terminal
        self._shown_n, self._shown_at = None, float("-inf")  # off a terminal: the last line written, and when
        if not on_terminal:
            file, mininterval = WholeLines(file), max(mininterval, OFF_TERMINAL_INTERVAL)
            kwargs["maxinterval"] = mininterval  # tqdm's monitor would redraw every 10 s
        super().__init__(*args, disable=disable, file=file, mininterval=mininterval, **kwargs)
        if on_terminal and not self.disable:
            self._redirect = logging_redirect_tqdm(tqdm_class=ProgressBar)
            self._redirect.__enter__()

    def display(self, msg=None, pos=None):
        if self._whole_lines:
            now, last = time.monotonic(), self.total is not None and self.n >= self.total
            if self.n == 0 or self.n == self._shown_n or not last and now - self._shown_at < OFF_TERMINAL_INTERVAL:
                return True
            self._shown_n, self._shown_at = self.n, now
        return super().display(msg, pos)

    def close(self) -> None:
        redirect, self._redirect = self._redirect, None
        try:
            super().close()
        finally:
            if redirect is not None:  # the console handlers back as they were (bars close last-open first)
                redirect.__exit__(None, None, None)
