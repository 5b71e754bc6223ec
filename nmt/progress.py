"""Progress bars that share the terminal with the log: the one bar class of every command that shows one.

A bar is drawn only on a terminal. While one is open, log records bound for the console go through tqdm.write,
which clears the bar, writes the whole line and draws the bar again below it, so a log line is never glued to the
bar; file handlers (train.log) are left as they are. Off a terminal (a pipe, a SLURM log, `| tee`) no bar is drawn:
its carriage returns would be fragments in the file, and the log lines say the progress there."""

from __future__ import annotations

import sys

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


class ProgressBar(tqdm):
    def __init__(self, *args, disable: bool = False, file=None, **kwargs):
        self._redirect = None
        file = file if file is not None else sys.stderr
        on_terminal = hasattr(file, "isatty") and file.isatty()
        super().__init__(*args, disable=disable or not on_terminal, file=file, **kwargs)
        if not self.disable:
            self._redirect = logging_redirect_tqdm(tqdm_class=ProgressBar)
            self._redirect.__enter__()

    def close(self) -> None:
        redirect, self._redirect = self._redirect, None
        try:
            super().close()
        finally:
            if redirect is not None:  # the console handlers back as they were (bars close last-open first)
                redirect.__exit__(None, None, None)
