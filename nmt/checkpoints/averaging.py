"""Averaging checkpoints: which of a run's checkpoints are regular (saved at its cadence or its end; one saved when
a signal stopped the run between two saves is left out), their parameters' mean (a pure function, one checkpoint in
memory at a time) and the averaged checkpoint in the same format. nmt/average.py is its command line."""

from __future__ import annotations

from pathlib import Path

import torch

from nmt.checkpoints.checkpoint import (
    CheckpointError,
    load_checkpoint,
    non_finite,
    numbered_checkpoints,
    save_checkpoint,
)


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
    first: dict = {}
    for path in paths:
        model = last = {}  # let the previous checkpoint go before the next one is read
        last = load_checkpoint(path, mmap=True)  # mapped: the optimizer state is never read in
        model = last.pop("model")
        if broken := non_finite(model):  # one NaN makes the whole mean NaN
            raise CheckpointError(f"{path}: {broken}: it cannot be averaged; leave it out (nothing was written)")
        first = first or {"vocab": last.get("vocab"), "model": last.get("config", {}).get("model", {})}
        if mismatch := not_the_same_model(first, last):
            raise CheckpointError(f"{path}: {mismatch} from {paths[0]}: checkpoints of one run only can be averaged "
                                  "(nothing was written)")
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


def not_the_same_model(first: dict, state: dict) -> str:
    """What makes a checkpoint another model than the first of an average ({"vocab", "model"}: its vocabulary and
    model config), or "": two runs of one shape but other vocabularies (En-De and En-Fr, both 8,000 pieces) average
    into a model that translates neither, under the last one's vocabulary."""
    vocab = state.get("vocab")
    if (vocab is None) != (first["vocab"] is None) or vocab is not None and not torch.equal(vocab, first["vocab"]):
        return "its vocabulary differs"
    model = state.get("config", {}).get("model", {})
    # a field only one side records was added between their saves (a run resumed by newer code): not a difference
    fields = sorted(name for name in set(model) & set(first["model"]) if model[name] != first["model"][name])
    return f"its model differs in {', '.join(f'model.{name}' for name in fields[:4])}" if fields else ""


def write_average(paths: list[Path], output: str | Path) -> Path:
    """Average paths into a checkpoint of the same format (config and step of the last one)."""
    model, last = _average(paths)
    state = {"model": model, "averaged_from": [Path(p).name for p in paths],
             **{key: last[key] for key in ("config", "step", "vocab", "data") if key in last}}
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    save_checkpoint(state, output)
    return Path(output)
