"""The best checkpoint and early stopping: the best validation so far by train.best_metric, kept as
checkpoint_best.pt, and train.patience's count of validations since, which stops the run. Both are part of the
training state (the trainer's "best"), so a run stopped and resumed decides as an uninterrupted one."""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from nmt.checkpoints.checkpoint import save_best
from nmt.config import TrainConfig
from nmt.modes import BestMetric
from nmt.runtime.distributed import broadcast_flag
from nmt.runtime.process import Env

log = logging.getLogger("nmt.train")


# Each metric's entry in a validation's scores and whether a higher score is better.
SCORES = {BestMetric.nll: ("nll", False), BestMetric.bleu: ("bleu_greedy", True)}


@dataclass
class BestValidation:
    """The best validation so far by one metric and how many validations since were no better (train.patience's
    count). Part of the training state: a resumed run decides as an uninterrupted one."""

    metric: str = BestMetric.nll.value  # train.best_metric
    score: float | None = None  # the best score so far (None: no validation yet)
    step: int = -1  # the update it was at: what checkpoint_best.pt holds
    since: int = 0  # validations since the best one, none of them better
    validated: int = -1  # the update of the last validation (kept on every rank; the scores on rank 0 only)

    def record(self, step: int, scores: dict) -> bool:
        """The validation at update `step`: whether it is the best so far (a first finite score is; ties and a
        non-finite score are not)."""
        key, higher = SCORES[BestMetric(self.metric)]
        score = scores[key]
        better = self.score is None or (score > self.score if higher else score < self.score)
        if math.isfinite(score) and better:
            self.score, self.step, self.since = score, step, 0
            return True
        self.since += 1
        return False

    def out_of_patience(self, patience: int) -> bool:
        """train.patience validations in a row without a better one (patience 0: never)."""
        return patience > 0 and self.since >= patience

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def resumed(cls, state: dict | None, metric: BestMetric) -> "BestValidation":
        """The saved record for train.best_metric `metric`; a record of another metric (changed on a resume) keeps
        only its last validation's update: the best is chosen afresh from the next validation."""
        state = state or {}
        if state.get("metric", metric.value) != metric.value:
            return cls(metric.value, validated=state.get("validated", -1))
        return cls(**{**state, "metric": metric.value})

    def stop_line(self, patience: int, step: int) -> str:
        """Why train.patience stopped the run, in one line."""
        best = "none was finite" if self.score is None else \
            f"the best: {self.score:.4g} at update {self.step}, kept as checkpoint_best.pt"
        return (f"stopped early at update {step}: train.patience={patience} validations in a row without a better "
                f"validation {self.metric} ({best})")


class BestCheckpoint:
    """A run's checkpoint_best.pt and train.patience. Rank 0 alone has every score (BLEU is its own): it keeps the
    record, writes the checkpoint (`weights`: the numbered checkpoint's part of the state) and decides; every rank
    gets its decision at the validation, which is a collective already, so no update waits on it."""

    def __init__(self, env: Env, out: Path, cfg: TrainConfig, weights: Callable[[], dict]):
        self.env, self.out, self.cfg, self.weights = env, out, cfg, weights
        self.record = BestValidation(cfg.best_metric.value)

    def state_dict(self) -> dict:
        return self.record.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        self.record = BestValidation.resumed(state, self.cfg.best_metric)

    @property
    def validated(self) -> int:
        """The update of the last validation (every rank knows it)."""
        return self.record.validated

    def validation(self, step: int, scores: Callable[[], dict], metrics) -> str | None:
        """The validation at update `step` when one is due (every train.valid_every updates, once), logged to
        `metrics`: checkpoint_best.pt when it is the best so far; "patience" when train.patience validations in a row
        brought no better one before train.max_steps. None otherwise."""
        if not self.cfg.valid_every or step % self.cfg.valid_every or self.record.validated == step:
            return None
        scores = scores()
        metrics.log("valid", step, scores)
        self.record.validated = step
        stop = False
        if self.env.main:
            if self.record.record(step, scores):
                save_best(self.weights(), self.out, self.record.state_dict())
            stop = self.record.out_of_patience(self.cfg.patience) and step < self.cfg.max_steps
        if self.env.world_size > 1:
            stop = broadcast_flag(self.env, stop)
        if stop and self.env.main:  # the other ranks hold no score
            log.info("%s", self.record.stop_line(self.cfg.patience, step))
        return "patience" if stop else None

    def resumed(self, step: int, scores: Callable[[], dict], metrics) -> str | None:
        """What an uninterrupted run decided at the update a resumed one starts at: "patience" when train.patience
        had ended the run there; else the validation there that a stop skipped (a signal at an update of
        train.valid_every), run now, and its decision. None for a new run."""
        if not 0 < step < self.cfg.max_steps:
            return None
        if self.record.out_of_patience(self.cfg.patience):
            log.info("%s", self.record.stop_line(self.cfg.patience, step))
            return "patience"
        return self.validation(step, scores, metrics)
