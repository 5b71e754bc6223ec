"""Checkpoints: the file format (atomic save, safe load with weights_only), the rotation of a run's files, the lookup
of the newest usable state, and a training run's saves from every rank (Checkpointer). Averaging is
nmt/checkpoints/averaging.py, the folder lock nmt/checkpoints/folder_lock.py, the checks that a resumed run is the
same run nmt/checkpoints/resume.py.

A checkpoint is a dict of tensors and plain containers. What a run writes in its output folder:
- checkpoint_<update>.pt: what averaging and decoding need, "model" (state_dict), "config" (resolved, plain),
  "vocab", "step": a third of the full state (no Adam moments);
- checkpoint_last.pt: the whole training state, for resuming: also "optimizer", "scaler", "epoch", "batch"
  (data position), "rng" (one entry per rank);
- checkpoint_prev.pt: the whole state of the save before, so a damaged checkpoint_last.pt still resumes;
- checkpoint_best.pt: a numbered checkpoint's contents at the best validation so far (train.best_metric), with
  "best" (metric, score, update); not numbered, so averaging's "last N" never takes it.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import torch

from nmt.errors import UserError
from nmt.outputs import remove_stale_temporaries, temporary_name
from nmt.runtime.distributed import all_gather, broadcast_flag
from nmt.runtime.process import Env
from nmt.runtime.rng import rng_state

log = logging.getLogger(__name__)

LAST = "checkpoint_last.pt"
PREVIOUS = "checkpoint_prev.pt"
BEST = "checkpoint_best.pt"
WEIGHTS = ("model", "config", "vocab", "data", "step", "saved_for")  # what a numbered checkpoint keeps
_NUMBERED = re.compile(r"checkpoint_(\d+)\.pt$")


class CheckpointError(UserError):
    """A checkpoint that cannot be used: the message names the file and what to do."""


def save_checkpoint(state: dict, path: str | Path) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written checkpoint. What a killed
    earlier writer of the same path left (its temporary file, the checkpoint's size) goes first."""
    path = Path(path)
    remove_stale_temporaries(path)
    tmp = temporary_name(path)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def load_checkpoint(path: str | Path, map_location="cpu", mmap: bool = False) -> dict:
    """torch.load with weights_only=True: a file carrying pickled code is refused, not run.

    mmap=True maps the file instead of reading it: tensors are paged in only when touched.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except Exception as err:  # truncated zip, pickle refused by weights_only, wrong format...
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        if "weights_only" in str(err) or "Unsupported global" in str(err):
            reason = f"it contains pickled Python objects, which are refused for safety ({reason})"
        raise CheckpointError(f"{path}: not a usable checkpoint: {reason}") from None
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a relnmt checkpoint (no 'model' entry)")
    return state


def vocabulary_of(path: str | Path) -> bytes:
    """The SentencePiece model a checkpoint carries (the vocabulary its run was prepared with), as bytes; the file is
    mapped, so a whole training state's weights are not read. CheckpointError when it holds none."""
    state = load_checkpoint(path, mmap=True)
    if state.get("vocab") is None:
        raise CheckpointError(f"{path}: carries no vocabulary (a checkpoint nmt.train or nmt.average wrote does)")
    return state["vocab"].numpy().tobytes()


def non_finite(model: dict) -> str | None:
    """Which tensors of a state dict hold a NaN or an inf ("decoder.0.ffn.weight holds NaN or inf values (and 3 more
    tensors)"), None if none does. The one test of every door a weight passes: the trainer's save, averaging, and
    loading for decoding or export."""
    broken = [name for name, t in model.items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if not broken:
        return None
    more = f" (and {len(broken) - 1} more tensors)" if len(broken) > 1 else ""
    return f"{broken[0]} holds NaN or inf values{more}"


def numbered_checkpoints(directory: str | Path) -> list[Path]:
    """checkpoint_<update>.pt files, oldest update first."""
    found = [(int(m.group(1)), p) for p in Path(directory).glob("checkpoint_*.pt") if (m := _NUMBERED.search(p.name))]
    return [p for _, p in sorted(found)]


def save_numbered(state: dict, directory: str | Path, step: int, keep_last: int) -> Path:
    """checkpoint_<step>.pt (the weights), checkpoint_last.pt (the whole state; the one before it becomes
    checkpoint_prev.pt) and pruning to keep_last numbered checkpoints. A write that fails (a full disk) raises
    OSError and leaves every earlier file as it was."""
    directory = Path(directory)
    path = directory / f"checkpoint_{step:07d}.pt"
    save_checkpoint({key: state[key] for key in WEIGHTS if key in state}, path)
    staged = directory / f".{LAST}.new"
    try:
        save_checkpoint(state, staged)
        if (directory / LAST).exists():
            os.replace(directory / LAST, directory / PREVIOUS)
        os.replace(staged, directory / LAST)
    finally:
        staged.unlink(missing_ok=True)
    for old in numbered_checkpoints(directory)[:-keep_last] if keep_last > 0 else []:
        old.unlink()
    return path


def rank_rng(state: dict, rank: int, world_size: int) -> dict:
    """This rank's generator states from a whole training state: its own when the world size is the same (each
    rank continues its own dropout streams), else rank 0's."""
    rng = state["rng"]
    if not isinstance(rng, list):  # written before the states were kept per rank
        return rng
    return rng[rank] if len(rng) == world_size else rng[0]


def global_data_position(state: dict) -> int:
    """The whole state's data position in the one global sequence of batches that every world size shares. A
    multi-process run saved before that sequence existed (its config has no train.tokens_per_update, added with it)
    counted the batches of one rank's own share: its world_size ranks had consumed that many times as many, the same
    part of the epoch (the order within the epoch differs from there on, said in a log line)."""
    per_rank = "tokens_per_update" not in state.get("config", {}).get("train", {"tokens_per_update": 0})
    if not per_rank or state["world_size"] == 1:
        return state["batch"]
    position = state["batch"] * state["world_size"]
    log.info("update %d was saved by a %d-process run that counted each rank's batches: its data position %d "
             "per rank is %d in the global sequence; the batches within this epoch come in another order from here",
             state["step"], state["world_size"], state["batch"], position)
    return position


def save_training_state(state: dict, out: Path, keep_last: int, resumable: int) -> bool:
    """save_numbered for a training run (rank 0). A failed write (a full disk) leaves every earlier checkpoint
    as it was and says so in one error line; returns whether the save was written. Non-finite weights are never
    written (the trainer skips non-finite updates, so this is the last guard, e.g. against an optimizer that
    overflowed): the earlier checkpoints stay the resumable ones."""
    if broken := non_finite(state["model"]):
        log.error("update %d not saved in %s: %s; the earlier checkpoints are intact (resumable from update %d)",
                  state["step"], out, broken, max(resumable, 0))
        return False
    try:
        log.info("saved %s", save_numbered(state, out, state["step"], keep_last))
        return True
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as RuntimeError (inline_container)
        log.error("could not save update %d in %s (%s); the earlier checkpoints are intact (resumable from update "
                  "%d); the next save tries again", state["step"], out, write_failure(err), max(resumable, 0))
        return False


def write_failure(err: Exception) -> str:
    """Why a checkpoint was not written, in a few words: the OS's reason (a full disk), else torch.save's first line."""
    return getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]


def save_best(state: dict, out: Path, best: dict) -> bool:
    """out/checkpoint_best.pt (rank 0): the numbered checkpoint's part of the training state `state`, with `best`
    (metric, score, update), written atomically. Never a non-finite weight, and a failed write (a full disk) is one
    error line: the run goes on, and the next better validation writes it again. Returns whether it was written."""
    if broken := non_finite(state["model"]):
        log.error("update %d not kept as %s: %s", state["step"], BEST, broken)
        return False
    try:
        save_checkpoint({**{key: state[key] for key in WEIGHTS if key in state}, "saved_for": "best", "best": best},
                        out / BEST)
        return True
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as RuntimeError (inline_container)
        log.error("could not keep update %d as %s in %s (%s); the next better validation tries again", state["step"],
                  BEST, out, write_failure(err))
        return False


def latest_usable(directory: str | Path) -> tuple[Path, dict] | None:
    """The newest whole training state that loads: checkpoint_last.pt, else checkpoint_prev.pt, else a numbered
    checkpoint that carries one (written before numbered checkpoints kept only the weights)."""
    directory = Path(directory)
    staged = directory / f".{LAST}.new"  # written whole, the process ended before renaming it
    candidates = [staged, directory / LAST, directory / PREVIOUS] + numbered_checkpoints(directory)[::-1]
    for path in candidates:
        if not path.exists():
            continue
        try:
            state = load_checkpoint(path)
        except CheckpointError as err:
            if path.name in (LAST, PREVIOUS):  # kept for a look, out of the way of the next save's rotation
                path.rename(path.with_name(path.name + ".damaged"))
                log.warning("skipping %s (kept as %s.damaged)", err, path.name)
            else:
                log.warning("skipping %s", err)
            continue
        if "optimizer" in state:
            return path, state
    return None


class NoStateToResume(CheckpointError):
    """Every rank reads the same folder, so every rank raises it."""

    every_rank_alike = True


def refuse_weights_without_state(directory: Path, first_save: int) -> None:
    """A folder with numbered checkpoints and no whole training state (checkpoint_last.pt and checkpoint_prev.pt
    deleted by a clean-up, left out of a partial copy, or both damaged) is never restarted from scratch: that run
    would write over checkpoints it did not write. Refused (CheckpointError) naming them and what to do; the
    weights alone cannot resume (Adam's moments, the data position and the RNG states are gone). One exception: the
    run's own first save (update `first_save`) cut short between its two files (save_numbered), which a new run
    writes again as it was."""
    numbered = numbered_checkpoints(directory)
    if [p.name for p in numbered] == [f"checkpoint_{first_save:07d}.pt"]:
        log.warning("%s holds only %s, no whole training state: a first save cut short; starting afresh",
                    directory, numbered[0].name)
        return
    if numbered:
        shown = ", ".join(p.name for p in numbered[:3]) + (f" and {len(numbered) - 3} more" if len(numbered) > 3 else "")
        raise NoStateToResume(f"{directory} holds {shown} but no whole training state ({LAST}, {PREVIOUS}) to resume "
                              "from: a new run there would write over them. Move them away to start afresh, or set "
                              "train.output_dir to another folder (they still average and translate as they are)")


class Checkpointer:
    """A run's training state on disk: every rank takes part in a save (each one's generator states go into it),
    rank 0 writes it, and every rank learns whether it could. A failed write is retried at the next save (the
    last one before the run ends at the latest); a failed final one raises CheckpointError on every rank."""

    def __init__(self, env: Env, out: Path, keep_last: int):
        self.env, self.out, self.keep_last = env, out, keep_last
        self.saved_step = -1  # the update of the newest whole state on disk
        self.resumed_step: int | None = None  # the update this session resumed from (None: it started afresh)

    def resume(self, first_save: int) -> dict | None:
        """The newest usable whole state in the output folder (None: start afresh); first_save: the update of the
        run's first save (refuse_weights_without_state)."""
        found = latest_usable(self.out)
        if found is None:
            refuse_weights_without_state(self.out, first_save)
            return None
        path, state = found
        self.saved_step = self.resumed_step = state["step"]
        log.info("resuming from %s at update %d (epoch %d, batch %d)", path, state["step"], state["epoch"],
                 state["batch"])
        if state["world_size"] != self.env.world_size:
            log.info("resuming a %d-process run on %d processes: the same batches in the same order, each rank's "
                     "dropout generator from rank 0's", state["world_size"], self.env.world_size)
        return state

    def save(self, state_with_rng, step: int, final: bool = False) -> None:
        """state_with_rng(every rank's generator states, by rank) -> the whole training state at update `step`."""
        env = self.env
        rng = all_gather(env, rng_state(env.device))
        written = True
        if env.main:
            written = save_training_state(state_with_rng(rng), self.out, self.keep_last, self.saved_step)
        if env.world_size > 1:
            written = broadcast_flag(env, written)
        if written:
            self.saved_step = step
        elif final:
            raise CheckpointError(f"could not save update {step} in {self.out}; the earlier checkpoints are intact "
                                  f"(resumable from update {max(self.saved_step, 0)})")
