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


class Metrics:
    def __init__(self, out: Path, main: bool, total: int, initial: int):
        self.writer = None
        if main:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(out / "tensorboard"))
        self.bar = ProgressBar(total=total, initial=initial, unit="upd", disable=not main, dynamic_ncols=True,
                               mininterval=0.5)
        self.tokens, self.since = 0, time.monotonic()

    def update(self, step: int, scalars: dict, log_now: bool) -> None:
        """One update done; log_now: log its scalars with the target tokens per second since the last log."""
        self.bar.update(1)
        self.tokens += scalars["tokens"]
        if log_now:
            now = time.monotonic()
            scalars = {**scalars, "tokens_per_s": self.tokens / max(now - self.since, 1e-9)}
            self.tokens, self.since = 0, now
            self.log("train", step, scalars)
            self.bar.set_postfix(loss=f"{scalars['loss']:.3f}", ppl=f"{scalars['ppl']:.1f}",
                                 tok_s=f"{scalars['tokens_per_s']:.0f}", lr=f"{scalars['lr']:.2e}",
                                 refresh=False)  # shown at the bar's next draw: off a terminal, once a minute

    def log(self, prefix: str, step: int, stats: dict) -> None:
        if self.writer is None:
            return
        shown = {k: v for k, v in stats.items() if isinstance(v, float) or k == "tokens"}
        for key, value in shown.items():
            self.writer.add_scalar(f"{prefix}/{key}", value, step)
        self.writer.flush()
        log.info("%s update %d: %s", prefix, step, " ".join(f"{k} {v:.4g}" for k, v in shown.items()))

    def close(self) -> None:
        self.bar.close()
