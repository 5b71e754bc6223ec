"""Checkpoints: atomic save, safe load (weights_only), resume lookup, averaging, and a training run's saves from
every rank (Checkpointer).

A checkpoint is a dict of tensors and plain containers. What a run writes in its output folder:
- checkpoint_<update>.pt: what averaging and decoding need, "model" (state_dict), "config" (resolved, plain),
  "vocab", "step": a third of the full state (no Adam moments);
- checkpoint_last.pt: the whole training state, for resuming: also "optimizer", "scaler", "epoch", "batch"
  (data position), "rng" (one entry per rank);
- checkpoint_prev.pt: the whole state of the save before, so a damaged checkpoint_last.pt still resumes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

import torch

from nmt.runtime import Env, all_gather, broadcast_flag, rng_state

log = logging.getLogger(__name__)

LAST = "checkpoint_last.pt"
PREVIOUS = "checkpoint_prev.pt"
WEIGHTS = ("model", "config", "vocab", "data", "step", "saved_for")  # what a numbered checkpoint keeps
_NUMBERED = re.compile(r"checkpoint_(\d+)\.pt$")


class CheckpointError(Exception):
    """A checkpoint that cannot be used: the message names the file and what to do."""


def save_checkpoint(state: dict, path: str | Path) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written checkpoint."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
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


def numbered_checkpoints(directory: str | Path) -> list[Path]:
    """checkpoint_<update>.pt files, oldest update first."""
    found = [(int(m.group(1)), p) for p in Path(directory).glob("checkpoint_*.pt") if (m := _NUMBERED.search(p.name))]
    return [p for _, p in sorted(found)]


def checkpoints_to_average(directory: str | Path, last: int) -> tuple[list[Path], list[Path]]:
    """(the newest `last` regular checkpoints, the newer ones left out): regular ones were saved at the save cadence
    or at the run's end; one saved when a signal stopped the run between two saves is left out (it would weigh a
    few updates' weights as much as a whole interval's). Reads each newest-first, memory-mapped."""
    taken: list[Path] = []
    left_out: list[Path] = []
    for path in reversed(numbered_checkpoints(directory)):
        if len(taken) == last:
            break
        (left_out if load_checkpoint(path, mmap=True).get("saved_for") == "signal" else taken).append(path)
    return taken[::-1], left_out[::-1]


def averaging_note(paths: list[Path], left_out: list[Path], output: Path) -> str:
    """The one line that says which checkpoints an average took, and which it left out and why."""
    note = f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {output}"
    if left_out:
        note += (f"; left out {', '.join(p.name for p in left_out)}: saved when a signal stopped the run, off the "
                 "save cadence")
    return note


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


def save_training_state(state: dict, out: Path, keep_last: int, resumable: int) -> bool:
    """save_numbered for a training run (rank 0). A failed write (a full disk) leaves every earlier checkpoint
    as it was and says so in one error line; returns whether the save was written. Non-finite weights are never
    written (the trainer skips non-finite updates, so this is the last guard, e.g. against an optimizer that
    overflowed): the earlier checkpoints stay the resumable ones."""
    broken = [name for name, t in state["model"].items() if t.is_floating_point() and not bool(t.isfinite().all())]
    if broken:
        log.error("update %d not saved in %s: %d parameters are not finite (%s); the earlier checkpoints are intact "
                  "(resumable from update %d)", state["step"], out, len(broken), broken[0], max(resumable, 0))
        return False
    try:
        log.info("saved %s", save_numbered(state, out, state["step"], keep_last))
        return True
    except (OSError, RuntimeError) as err:  # torch.save reports a failed write as RuntimeError (inline_container)
        reason = getattr(err, "strerror", None) or (str(err).strip().splitlines() or [type(err).__name__])[0]
        log.error("could not save update %d in %s (%s); the earlier checkpoints are intact (resumable from update "
                  "%d); the next save tries again", state["step"], out, reason, max(resumable, 0))
        return False


def lock_folder(out: Path):
    """The open lock file of `out`, held (flock) by this job: one training job writes a folder at a time. The
    kernel drops the lock when the process ends, however it ends, so a killed job leaves none behind. Raises
    CheckpointError naming the job that holds it."""
    import datetime
    import fcntl
    import socket
    import sys

    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = open(out / ".lock", "a+")
    except OSError as err:
        raise CheckpointError(f"cannot write the output folder {out}: {err.strerror or err}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not said who it is yet"
        handle.close()
        raise CheckpointError(f"{out} is being written by another training job ({holder}): wait for it to end, "
                              "or give this one another train.output_dir") from None
    except OSError as err:  # a file system without flock (some Lustre and NFS mounts): train, unguarded
        handle.close()
        log.warning("%s cannot be locked (%s): nothing stops a second job from writing it", out, err.strerror or err)
        return contextlib.nullcontext()
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {datetime.datetime.now():%Y-%m-%d %H:%M:%S}: "
                 f"{' '.join(sys.argv)}\n")
    handle.flush()
    return handle


def hold_folder(env: Env, out: Path):
    """This job's hold on its output folder (rank 0 takes the lock; the other ranks hold nothing): a context to keep
    for the whole run. Every rank raises the same CheckpointError when rank 0 could not take it, so no rank waits in
    a collective for one that stopped."""
    refused, held = None, contextlib.nullcontext()
    if env.main:
        try:
            held = lock_folder(out)
        except CheckpointError as err:
            refused = err
    if env.world_size > 1 and broadcast_flag(env, refused is not None):
        refused = refused or CheckpointError(f"rank 0 could not lock {out}")
    if refused is not None:
        raise refused
    return held


def check_same_model(state: dict, model: dict, vocab_size: int, out: Path) -> None:
    """Resuming continues the run in the folder: refused (CheckpointError naming the fields) when this job's model
    (plain fields) or vocabulary is another one than the folder's run; its weights would not load."""
    def shown(value):
        return str(value).lower() if isinstance(value, bool) else value

    theirs = state.get("config", {}).get("model", {})
    fields = [f"model.{name}={shown(model.get(name))} (the folder's run: {shown(theirs.get(name))})"
              for name in sorted(set(model) | set(theirs)) if model.get(name) != theirs.get(name)]
    saved_vocab = state["model"]["embed.weight"].shape[0]
    if saved_vocab != vocab_size:
        fields.append(f"a vocabulary of {vocab_size} (the folder's run: {saved_vocab})")
    if fields:
        raise CheckpointError(f"{out} holds a run of another model: {'; '.join(fields)}. Set train.output_dir to "
                              f"another folder, or remove {out} to start this one afresh")


def check_same_data(state: dict, identity: dict, spm_model: bytes, out: Path) -> None:
    """Resuming continues the run on its own data: refused (CheckpointError naming what differs) when the prepared
    data is another pair, other train or valid files, other vocabulary settings or filters, or the SentencePiece
    model is another one (the same ids would mean other words)."""
    theirs, differs = state.get("data"), []
    if theirs is not None:
        if (identity.get("src"), identity.get("tgt")) != (theirs.get("src"), theirs.get("tgt")):
            differs.append(f"the pair {identity.get('src')}-{identity.get('tgt')} (the folder's run: "
                           f"{theirs.get('src')}-{theirs.get('tgt')})")
        for split, files in identity.get("inputs", {}).items():
            before = theirs.get("inputs", {}).get(split, {})
            if files != before:
                changed = sorted(set(files) ^ set(before)) or sorted(f for f in files if files[f] != before.get(f))
                differs.append(f"the {split} files ({', '.join(changed)} differ from the folder's run)")
        for part in ("vocab", "filters"):
            if identity.get(part) != theirs.get(part):
                differs.append(f"the {part} settings {identity.get(part)} (the folder's run: {theirs.get(part)})")
    if "vocab" in state and state["vocab"].numpy().tobytes() != spm_model:
        differs.append("another SentencePiece vocabulary (spm.model)")
    if differs:
        raise CheckpointError(f"{out} holds a run trained on other data: {'; '.join(differs)}. Set "
                              f"train.output_dir to another folder, or remove {out} to start this one afresh")


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


def average_checkpoints(paths: list[str | Path]) -> dict:
    """Mean of the "model" tensors of several checkpoints (float32 accumulation).

    Floating-point tensors are averaged and cast back to their dtype; integer buffers are taken
    from the last checkpoint. All checkpoints must hold the same keys and shapes.
    """
    return _average(paths)[0]


def _average(paths: list[str | Path]) -> tuple[dict, dict]:
    """(averaged "model", the last checkpoint's other entries), reading one checkpoint at a time.

    At most two state dicts are alive at once (the running sum and the one being read): the big
    model's 20-checkpoint average needs the memory of two checkpoints, not twenty.
    """
    if not paths:
        raise CheckpointError("no checkpoints to average")
    total: dict[str, torch.Tensor] = {}
    shapes: dict[str, torch.Size] = {}
    model: dict[str, torch.Tensor] = {}
    for path in paths:
        model = last = {}  # let the previous checkpoint go before the next one is read
        last = load_checkpoint(path, mmap=True)  # mapped: the optimizer state is never read in
        model = last.pop("model")
        if not shapes:
            shapes = {name: tensor.shape for name, tensor in model.items()}
        if set(model) != set(shapes):
            diff = sorted(set(shapes).symmetric_difference(model))[:5]
            raise CheckpointError(f"{path}: parameters differ from {paths[0]} (e.g. {diff})")
        for name, tensor in model.items():
            if tensor.shape != shapes[name]:
                raise CheckpointError(f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                      f"{paths[0]} has {tuple(shapes[name])}")
            if tensor.is_floating_point():
                if name in total:
                    total[name] += tensor.float()
                else:
                    total[name] = tensor.float().clone()  # .float() of float32 is the same tensor
    averaged = {name: (total.pop(name) / len(paths)).to(t.dtype) if t.is_floating_point() else t.clone()
                for name, t in model.items()}
    return averaged, last


def write_average(paths: list[Path], output: str | Path) -> Path:
    """Average paths into a checkpoint of the same format (config and step of the last one)."""
    model, last = _average(paths)
    state = {"model": model, "averaged_from": [Path(p).name for p in paths],
             **{key: last[key] for key in ("config", "step", "vocab", "data") if key in last}}
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(state, output)
    return Path(output)



class Checkpointer:
    """A run's training state on disk: every rank takes part in a save (each one's generator states go into it),
    rank 0 writes it, and every rank learns whether it could. A failed write is retried at the next save (the
    last one before the run ends at the latest); a failed final one raises CheckpointError on every rank."""

    def __init__(self, env: Env, out: Path, keep_last: int):
        self.env, self.out, self.keep_last = env, out, keep_last
        self.saved_step = -1  # the update of the newest whole state on disk

    def resume(self) -> dict | None:
        """The newest usable whole state in the output folder (None: start afresh)."""
        found = latest_usable(self.out)
        if found is None:
            return None
        path, state = found
        self.saved_step = state["step"]
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
