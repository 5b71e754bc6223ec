"""What a training run reports: train.log and stderr lines, TensorBoard scalars and the progress bar (rank 0;
the other ranks report nothing)."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from nmt.progress import ProgressBar

log = logging.getLogger("nmt.train")


@dataclass
class UpdateStats:
    """What one update reports, read from the device once (per-token means over all ranks)."""

    loss: float
    nll: float
    lr: float
    grad_norm: float
    tokens: int
    stop: str | None  # "signal": some rank got SIGTERM/SIGUSR1/SIGINT; "time": some rank ran out of train.max_minutes
    save_due: bool = False  # some rank's train.save_every_minutes ran out (every rank saves together)
    skipped: bool = False  # a non-finite loss or gradient (fp16: an overflow): the step counter did not move

    def scalars(self) -> dict:
        return {"loss": self.loss, "nll": self.nll, "ppl": math.exp(min(self.nll, 50)), "lr": self.lr,
                "grad_norm": self.grad_norm, "tokens": self.tokens}


# fits 80 columns with a run of 100,000 updates and 10 hours to go (the learning rate is in the log lines)
BAR_FORMAT = "{l_bar}{bar:10}| {n_fmt}/{total_fmt} upd [{elapsed}<{remaining}]{postfix}"


class Interval:
    """The updates since the last log line: token-weighted sums, the wall time since the interval began."""

    def __init__(self):
        self.started, self.updates, self.tokens = time.monotonic(), 0, 0
        self.loss = self.nll = self.grad_norm = 0.0
        self.lr = 0.0

    def add(self, scalars: dict) -> None:
        tokens = scalars["tokens"]
        self.updates, self.tokens = self.updates + 1, self.tokens + tokens
        self.loss += scalars["loss"] * tokens
        self.nll += scalars["nll"] * tokens
        self.grad_norm += scalars["grad_norm"]
        self.lr = scalars["lr"]

    def scalars(self) -> dict:
        tokens = max(self.tokens, 1)
        nll = self.nll / tokens
        return {"loss": self.loss / tokens, "nll": nll, "ppl": math.exp(min(nll, 50)), "lr": self.lr,
                "grad_norm": self.grad_norm / max(self.updates, 1), "tokens": self.tokens,
                "tokens_per_s": self.tokens / max(time.monotonic() - self.started, 1e-9), "updates": self.updates}


class Metrics:
    """Each log line holds the interval since the previous one: loss and nll as means weighted by target tokens,
    tokens/s over the interval's wall time, the gradient norm's mean, the learning rate at its end (as fairseq's and
    OpenNMT-py's logs). Batches are bucketed by length, so one update's loss is noise; the bar shows the same
    interval's figures, current at every update. Everything here is on the host already (the update's one read)."""

    def __init__(self, out: Path, main: bool, total: int, initial: int):
        self.writer = None
        if main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out / "tensorboard"))
        self.bar = ProgressBar(total=total, initial=initial, unit="upd", disable=not main, dynamic_ncols=True,
                               mininterval=0.5, bar_format=BAR_FORMAT)
        self.interval = Interval()
        self.last_valid: tuple[int, dict] | None = None  # (update, scalars) of the newest validation

    def update(self, step: int, scalars: dict, log_now: bool) -> None:
        """One update done; log_now: log the interval's scalars since the last log line, and start a new interval."""
        self.interval.add(scalars)
        current = self.interval.scalars()
        self.bar.set_postfix_str(f"loss {current['loss']:.3f}, {current['tokens_per_s'] / 1000:.1f}k tok/s",
                                 refresh=False)
        self.bar.update(1)
        if log_now:
            self.log("train", step, current)
            self.interval = Interval()

    def log(self, prefix: str, step: int, stats: dict) -> None:
        if prefix == "valid":
            self.last_valid = (step, {**(self.last_valid[1] if self.last_valid and self.last_valid[0] == step
                                         else {}), **stats})
        if self.writer is None:
            return
        shown = {k: v for k, v in stats.items() if isinstance(v, float) or k == "tokens"}
        for key, value in shown.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)
        self.writer.flush()
        log.info("%s update %d: %s", prefix, step, " ".join(f"{k} {v:.4g}" for k, v in shown.items()))

    def close(self) -> None:
        self.bar.close()
