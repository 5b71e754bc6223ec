"""prepare: raw parallel text -> shared SentencePiece vocabulary -> binarized shards + manifest.json.

Everything is built in a temporary folder next to the target and renamed into place at the
end, so a failure never leaves a half-written prepared folder behind. A manifest records what
produced the folder; re-running with the same inputs and settings is a no-op, anything else
rebuilds.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from nmt.config import DataConfig
from nmt.data import readers
from nmt.data.readers import DataError
from nmt.data.encode import map_blocks, write_split
from nmt.data.shards import EncodedSplit
from nmt.data.sources import SPLITS, another_corpus, key_changes, manifest_key, prepared_offline
from nmt.data.vocab import Vocab, given_vocabulary, train_vocab
from nmt.outputs import remove_stale_temporaries, temporary_name
from nmt.progress import ProgressBar
from nmt.workers import worker_count

log = logging.getLogger(__name__)



def prepared_dir(cfg: DataConfig) -> Path:
    capped = f"_src{cfg.max_src_words}w" if cfg.max_src_words else ""  # never overwrite the uncapped data
    return Path(cfg.prepared_dir or f"prepared/{cfg.name}_{cfg.src}_{cfg.tgt}{capped}")


def load_manifest(directory: Path) -> dict | None:
    path = directory / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def open_split(directory: Path, manifest: dict, split: str) -> EncodedSplit:
    """A prepared split, checked against the manifest: its sentence count, and the vocabulary its ids were
    written with (spm.model's digest, recorded by prepare since the manifest carried it)."""
    spm = directory / "spm.model"
    if "spm_sha256" in manifest and (not spm.is_file() or readers.file_digest(spm) != manifest["spm_sha256"]):
        raise DataError(f"{spm}: not the vocabulary the shards in {directory} were written with; rebuild with "
                        f"python -m nmt.prepare ... force=true")
    expected = manifest.get("stats", {}).get(split, {}).get("kept")
    return EncodedSplit(directory, split, manifest["vocab_size"], expected)


@dataclass
class Prepared:
    """A prepared folder opened for training: both splits checked against the manifest, and the vocabulary
    (checkpoints carry it)."""

    directory: Path
    train: EncodedSplit
    valid: EncodedSplit
    vocab_size: int
    spm_model: bytes
    identity: dict  # what a run trains on (pair, the train and valid files' digests, vocabulary, filters)

    def fingerprint(self) -> dict[str, str]:
        """{file: digest} of what makes two copies of the folder the same data: the manifest's identity and sizes
        (the shards are checked against it at open) and the SentencePiece model (the same ids, the same words)."""
        manifest = json.dumps({"identity": self.identity, "vocab_size": self.vocab_size,
                               "pairs": [len(self.train), len(self.valid)]}, sort_keys=True)
        return {"manifest.json": hashlib.sha256(manifest.encode()).hexdigest(),
                "spm.model": hashlib.sha256(self.spm_model).hexdigest()}


def open_prepared(cfg: DataConfig) -> Prepared:
    """The prepared folder of cfg, with a DataError naming what to rebuild when it is missing or damaged."""
    directory = prepared_dir(cfg)
    manifest = load_manifest(directory)
    if manifest is None:
        raise DataError(f"{directory} is not prepared: run python -m nmt.prepare data=<preset> first")
    train, valid = open_split(directory, manifest, "train"), open_split(directory, manifest, "valid")
    for name, split in (("training", train), ("validation", valid)):
        if len(split) == 0:
            raise DataError(f"{directory}: the {name} split holds no pair; prepare it again from files that do")
    spm = directory / "spm.model"
    if not spm.is_file():
        raise DataError(f"{spm} is missing: rebuild with python -m nmt.prepare ... force=true")
    return Prepared(directory, train, valid, manifest["vocab_size"], spm.read_bytes(),
                    data_identity(manifest.get("key", {})))


def data_identity(key: dict) -> dict:
    """The part of a manifest's key that training reads: the test split may change under a run."""
    return {**key, "inputs": {split: files for split, files in key.get("inputs", {}).items() if split != "test"}}


def _write_vocab_input(cfg: DataConfig, path: Path, workers: int) -> int:
    """Both sides of the training text, one sentence per line, for SentencePiece."""
    lines = 0
    with open(path, "wb") as f, \
            ProgressBar(desc="collect vocab text", unit=" lines", leave=False) as bar, \
            contextlib.closing(map_blocks(cfg, "train", workers)) as blocks:
        for text, sentences in blocks:
            f.write(text)
            lines += sentences
            bar.update(sentences)
    return lines


def _vocabulary(cfg: DataConfig, work: Path, workers: int) -> Vocab:
    """work/spm.model: the given vocabulary (data.vocab_from), byte for byte, or one learned from the training text."""
    if cfg.vocab_from:
        (work / "spm.model").write_bytes(given_vocabulary(cfg.vocab_from))
        log.info("vocabulary: given by data.vocab_from=%s (not learned; data.vocab_size unread)", cfg.vocab_from)
        return Vocab(work / "spm.model")
    vocab_text = work / "vocab_input.txt"
    sentences = _write_vocab_input(cfg, vocab_text, workers)
    if sentences == 0:  # before SentencePiece, whose error would not name the files
        raise DataError(no_pair_left(cfg, {"read": 0}))
    log.info("vocabulary text: %d sentences", sentences)
    vocab = Vocab(train_vocab(vocab_text, work / "spm", cfg.vocab_size, cfg.vocab_sample, threads=workers))
    vocab_text.unlink()
    return vocab


def prepare(cfg: DataConfig, force: bool = False) -> Path:
    """Build (or reuse, when up to date) the prepared folder for cfg; returns its path."""
    target = prepared_dir(cfg)
    existing = load_manifest(target)
    if existing is None and target.is_dir() and any(target.iterdir()):  # outputs never destroy inputs
        raise DataError(f"{target} holds files that nmt.prepare did not write (it has no manifest.json): set "
                        "data.prepared_dir to a new or empty folder (nothing was changed)")
    try:
        key = manifest_key(cfg)
    except DataError as unreachable:
        if force or not prepared_offline(cfg, existing):
            raise
        log.warning("%s: using the prepared data as it is (built from the same settings), since its source cannot "
                    "be read here to check it: %s", target, unreachable)
        return target
    if not force and existing is not None and existing.get("key") == key:
        log.info("%s is up to date (manifest matches inputs and settings)", target)
        return target
    if not force and existing is not None and (other := another_corpus(existing.get("key", {}), key)) is not None:
        # outputs never destroy inputs: another corpus's vocabulary and shards (and the runs trained on them)
        raise DataError(f"{target} holds another corpus: {other}; nothing was changed: set data.prepared_dir to a "
                        "folder of this corpus's own, or replace that one with relnmt-prepare ... force=true")
    if existing is not None:
        log.info("%s: rebuilding (%s)", target, "force=true" if force and existing.get("key") == key
                 else f"stale: {key_changes(existing.get('key', {}), key)}")

    work = temporary_name(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)  # a killed prepare's half-written folder (WMT14: gigabytes)
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        workers = worker_count(cfg.workers)
        vocab = _vocabulary(cfg, work, workers)
        stats = {}
        log.info("encoding on %d worker%s", workers, "s" * (workers > 1))
        for split in SPLITS:
            stats[split] = write_split(cfg, split, vocab, work, workers)
            if split == "train" and stats[split]["kept"] == 0:
                raise DataError(no_pair_left(cfg, stats[split]))
        for split, counts in stats.items():
            log.info("%s: %s", split, ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        manifest = {"key": key, "vocab_size": len(vocab), "stats": stats,
                    "spm_sha256": readers.file_digest(work / "spm.model")}
        (work / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        _replace(work, target)
    except OSError as err:  # a full disk, a quota, a read-only file system: one line, nothing half-written kept
        shutil.rmtree(work, ignore_errors=True)
        raise DataError(write_failure(target, err)) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return target


def write_failure(target: Path, err: OSError) -> str:
    """Why the prepared folder could not be written, with the space left where the disk is the cause."""
    what = err.strerror or str(err)
    if err.filename:
        what += f" ({Path(err.filename).name})"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        free = shutil.disk_usage(next(p for p in (target, *target.parents) if p.exists())).free
        what += f"; {free / 2**20:,.0f} MiB free there"
    return (f"could not write the prepared data {target}: {what}; nothing was kept (the folder is written whole or "
            "not at all): free some space, or set data.prepared_dir to a folder on another disk")


FILTERS = {"too_long": "data.max_len={max_len} (subword tokens, either side)",
           "ratio": "data.max_ratio={max_ratio} (token-length ratio)",
           "src_words": "data.max_src_words={max_src_words} (source words)", "empty": "an empty side"}


def no_pair_left(cfg: DataConfig, counts: dict) -> str:
    """Why prepare keeps no training pair: the files are empty, or the filters (named, with their counts) dropped
    every one."""
    if counts.get("read", 0) == 0:
        return f"the training files of data={cfg.name} hold no line: nothing to train on"
    dropped = sorted(((n, reason.removeprefix("dropped_")) for reason, n in counts.items()
                      if reason.startswith("dropped_")), reverse=True)
    named = "; ".join(f"{n:,} by {FILTERS[reason].format(**vars(cfg))}" for n, reason in dropped)
    return f"no training pair left: the filters dropped all {counts['read']:,} ({named}); loosen them"


def _replace(new: Path, target: Path) -> None:
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)
