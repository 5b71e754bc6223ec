"""A run knows what it trains: a resumed run is the same run (the folder's checkpoint against this job's model,
optimizer, schedule, batch, seed, vocabulary and prepared data), and every rank of a run trains on the same prepared
data; refused in one line naming what differs."""

from __future__ import annotations

from pathlib import Path

from nmt.batch import effective_tokens, micro_batches
from nmt.checkpoints.checkpoint import CheckpointError
from nmt.config import TrainConfig
from nmt.data.pipeline import Prepared
from nmt.data.readers import DataError
from nmt.recorded_config import defines_run, with_schema_defaults
from nmt.runtime.distributed import all_gather
from nmt.runtime.process import Env


def check_same_run(state: dict, job: dict, data: Prepared, batch: int, out: Path) -> None:
    """Resuming continues the run in the folder: refused (CheckpointError naming every field that differs) when this
    job is another run than the folder's: another model (whose weights would not load), vocabulary, optimizer or
    schedule, seed, precision, micro-batch or effective batch (`batch`: W x max_tokens x F tokens per update), or
    other prepared data (check_same_data). What only extends or places a run (the Role its fields declare in
    nmt/config.py: max_steps, save and log cadence, device, ...) may change."""
    check_same_config(state, job, data.vocab_size, batch, out)
    check_same_data(state, data.identity, data.spm_model, out)


def check_same_config(state: dict, job: dict, vocab_size: int, batch: int, out: Path) -> None:
    """check_same_run's comparison of the job (plain values) and the effective batch with the folder's run."""
    saved = state.get("config", {})
    fields = []
    for section in ("model", "optim", "train"):
        ours = with_schema_defaults(section, job.get(section, {}))
        theirs = with_schema_defaults(section, saved.get(section, {}))
        fields += [f"{section}.{name}={shown(ours.get(name))} (the folder's run: {shown(theirs.get(name))})"
                   for name in sorted(set(ours) | set(theirs))
                   if ours.get(name) != theirs.get(name) and defines_run(section, name)]
    their_batch = saved_batch(state)
    if their_batch is not None and their_batch != batch:
        fields.append(f"an effective batch of {batch} tokens (the folder's run: {their_batch})")
    saved_vocab = state["model"]["embed.weight"].shape[0]
    if saved_vocab != vocab_size:
        fields.append(f"a vocabulary of {vocab_size} (the folder's run: {saved_vocab})")
    if fields:
        raise CheckpointError(f"{out} holds another run: {'; '.join(fields)}. Resume it with the folder's values, set "
                              f"train.output_dir to another folder, or remove {out} to start this one afresh")


def saved_batch(state: dict) -> int | None:
    """The effective batch (padded tokens per update) of a saved run, None where the checkpoint cannot say."""
    train = state.get("config", {}).get("train", {})
    if "max_tokens" not in train or "world_size" not in state:
        return None
    world_size, train = state["world_size"], with_schema_defaults("train", train)
    launch = TrainConfig(tokens_per_update=train["tokens_per_update"], max_tokens=train["max_tokens"],
                         update_freq=train["update_freq"])
    return effective_tokens(world_size, train["max_tokens"], micro_batches(launch, world_size))


def shown(value):
    return str(value).lower() if isinstance(value, bool) else value


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
