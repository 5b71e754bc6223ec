"""Fine-tuning (train.init_from): a new run starts from another checkpoint's model weights, with its own optimizer,
schedule, step and data position, in a folder of its own. The checkpoint must be of this job's model on this job's
vocabulary, else the run is refused in one line naming what differs."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from nmt.checkpoints.checkpoint import CheckpointError, load_checkpoint, non_finite
from nmt.checkpoints.resume import shown
from nmt.config import model_config_from_dict
from nmt.data.pipeline import Prepared
from nmt.recorded_config import defines_weights, plain

log = logging.getLogger("nmt.train")


class InitFromRefused(CheckpointError):
    """Every rank reads the same checkpoint and job, so every rank raises it: rank 0 alone says it."""

    every_rank_alike = True


def initial_weights(path: str, model: dict, data: Prepared) -> dict[str, torch.Tensor]:
    """The model weights of checkpoint `path` (any checkpoint nmt.train or nmt.average wrote) for a run of `model`
    (the job's model config, plain values) on `data`'s vocabulary. InitFromRefused, naming train.init_from and
    everything that differs, when the checkpoint cannot start this run."""
    field = f"train.init_from={path}"
    try:
        state = load_checkpoint(path, mmap=True)  # mapped: a whole training state's optimizer is never read in
    except CheckpointError as err:
        raise InitFromRefused(f"{field}: {err}") from None
    if "vocab" not in state or "config" not in state:
        raise InitFromRefused(f"{field}: no vocabulary or config inside: fine-tune from a checkpoint nmt.train or "
                              "nmt.average wrote")
    differs = model_differences(model, state["config"].get("model", {}))
    if state["vocab"].numpy().tobytes() != data.spm_model:
        differs.append(f"its vocabulary is another SentencePiece model than the prepared data's "
                       f"{data.directory / 'spm.model'} (prepare this corpus with the checkpoint's: data.vocab_from={path}, "
                       "in a data.prepared_dir of its own)")
    if differs:
        raise InitFromRefused(f"{field} cannot start this run: {'; '.join(differs)}")
    if broken := non_finite(state["model"]):
        raise InitFromRefused(f"{field}: {broken}: fine-tune from another of its run's checkpoints")
    log.info("fine-tuning from the weights of %s (train.init_from, update %s of its run); the optimizer, schedule, "
             "step and data position start afresh", Path(path).resolve(), state.get("step", "?"))
    return state["model"]


def model_differences(ours: dict, theirs: dict) -> list[str]:
    """Each model field that defines the weights (nmt.recorded_config.defines_weights: not dropout) where the job's
    model config differs from the checkpoint's: its weights would not load, or would compute another function. A field the checkpoint does not record held its default."""
    theirs = {name: plain(value) for name, value in vars(model_config_from_dict(theirs)).items()}
    return [f"model.{name}={shown(ours.get(name))} (the checkpoint's: {shown(theirs[name])})"
            for name in sorted(theirs) if defines_weights("model", name) and ours.get(name) != theirs[name]]
