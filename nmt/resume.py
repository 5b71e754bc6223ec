"""A run knows what it trains: a resumed run is the same run (the folder's checkpoint against this job's model,
vocabulary and prepared data), and every rank of a run trains on the same prepared data; refused in one line naming
what differs."""

from __future__ import annotations

from pathlib import Path

from nmt.checkpoint import CheckpointError
from nmt.config import ModelConfig
from nmt.data.readers import DataError
from nmt.runtime import Env, all_gather


def check_same_model(state: dict, job: dict, vocab_size: int, out: Path) -> None:
    """Resuming continues the run in the folder: refused (CheckpointError naming the fields) when this job's model
    (the plain fields of job["model"]) or vocabulary is another one than the folder's run, whose weights would not
    load, or its optimizer's parameter groups differ (check_same_optimizer)."""
    check_same_optimizer(state, job["optim"], out)
    model = job["model"]
    def shown(value):
        return str(value).lower() if isinstance(value, bool) else value

    # a field added to the schema after the folder's run was saved held its default there
    theirs = {**vars(ModelConfig()), **state.get("config", {}).get("model", {})}
    fields = [f"model.{name}={shown(model.get(name))} (the folder's run: {shown(theirs.get(name))})"
              for name in sorted(set(model) | set(theirs)) if model.get(name) != theirs.get(name)]
    saved_vocab = state["model"]["embed.weight"].shape[0]
    if saved_vocab != vocab_size:
        fields.append(f"a vocabulary of {vocab_size} (the folder's run: {saved_vocab})")
    if fields:
        raise CheckpointError(f"{out} holds a run of another model: {'; '.join(fields)}. Set train.output_dir to "
                              f"another folder, or remove {out} to start this one afresh")


def check_same_optimizer(state: dict, optim: dict, out: Path) -> None:
    """Resuming keeps the optimizer's parameter groups: refused (CheckpointError) when optim.bias_lr_scale, which
    makes T5's tables a group of their own at their own rate, differs from the folder's run."""
    theirs = state.get("config", {}).get("optim", {}).get("bias_lr_scale", 1.0)
    if optim.get("bias_lr_scale", 1.0) != theirs:
        raise CheckpointError(f"{out} holds a run with optim.bias_lr_scale={theirs:g}, not "
                              f"{optim.get('bias_lr_scale', 1.0):g}: resume it with that value, or set "
                              "train.output_dir to another folder")


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


class RanksDisagree(DataError):
    """Ranks that read different prepared data: every rank gathered the same fingerprints, so every rank raises it."""

    every_rank_alike = True


def check_ranks_agree(env: Env, directory: Path, fingerprint: dict[str, str]) -> None:
    """Every rank trains on the same prepared data and vocabulary: under torchrun each node may read its own copy of
    the prepared folder at the same path (local disks prepared separately), and a rank with another SentencePiece
    model would train other words under the same ids without a sign. One all_gather of each rank's fingerprint
    (Prepared.fingerprint) at the start; RanksDisagree naming the first rank and file that differ from rank 0's."""
    if env.world_size == 1:
        return
    differs = first_disagreement(all_gather(env, fingerprint))
    if differs is not None:
        rank, name = differs
        raise RanksDisagree(f"rank {rank} reads other prepared data than rank 0: its {Path(directory) / name} differs "
                            "from rank 0's. Every rank must train on the same data: copy rank 0's prepared folder to "
                            "every node, or prepare it once on a file system they share")


def first_disagreement(fingerprints: list[dict[str, str]]) -> tuple[int, str] | None:
    """(rank, file) of the first rank whose fingerprint differs from rank 0's, file by file; None when all agree."""
    for rank, theirs in enumerate(fingerprints[1:], start=1):
        for name, digest in fingerprints[0].items():
            if theirs.get(name) != digest:
                return rank, name
    return None
