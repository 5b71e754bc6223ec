"""Where a corpus's raw pairs come from (the bundled Multi30k, local files, the Hugging Face hub) and what a
prepared folder is a function of: its inputs' content and its settings (the manifest's key), so that a stale
prepared folder is rebuilt and an unchanged one, however it was reached, is not."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from nmt.config import DataConfig
from nmt.data import readers
from nmt.data.vocab import given_vocabulary

FORMAT_VERSION = 1
SPLITS = ("train", "valid", "test")


def read_blocks(cfg: DataConfig, split: str, size: int) -> Iterator[readers.LineBlock | readers.PairBlock]:
    """A split's pairs, `size` at a time, each block's text read by its pairs(): files are read here and decoded
    there (by prepare's workers)."""
    if cfg.name in ("multi30k", "local"):
        prefix = readers.multi30k_prefix(cfg.root, split) if cfg.name == "multi30k" else _local_prefix(cfg, split)
        return readers.line_blocks(readers.find_file(prefix, cfg.src), readers.find_file(prefix, cfg.tgt), size)
    if cfg.name == "wmt14":
        rows = readers.load_hub_split(cfg.hub_name, cfg.hub_config, split)
        return readers.pair_blocks(readers.pairs_from_hub_split(rows, cfg.src, cfg.tgt), size)
    raise readers.DataError(f"unknown data.name={cfg.name!r}: expected multi30k, local or wmt14")


def _local_prefix(cfg: DataConfig, split: str) -> str:
    prefix = getattr(cfg, split)
    if not prefix:
        raise readers.DataError(f"data=local needs data.{split}=PREFIX (reads PREFIX.{cfg.src} and PREFIX.{cfg.tgt})")
    return prefix


def describe_inputs(cfg: DataConfig) -> dict:
    """What the prepared data is a function of: file digests, or the hub dataset's fingerprint."""
    inputs = {}
    for split in SPLITS:
        if cfg.name == "wmt14":
            rows = readers.load_hub_split(cfg.hub_name, cfg.hub_config, split)
            inputs[split] = {"config": cfg.hub_config, **readers.hub_split_content(rows)}
            continue
        prefix = readers.multi30k_prefix(cfg.root, split) if cfg.name == "multi30k" else _local_prefix(cfg, split)
        files = [readers.find_file(prefix, lang) for lang in (cfg.src, cfg.tgt)]
        inputs[split] = {str(f): readers.file_digest(f) for f in files}
    return inputs


def manifest_key(cfg: DataConfig, inputs: bool = True) -> dict:
    """What the prepared folder is a function of: its inputs' content (left out with inputs=False) and settings."""
    return {
        "format_version": FORMAT_VERSION,
        "src": cfg.src, "tgt": cfg.tgt,
        **({"inputs": describe_inputs(cfg)} if inputs else {}),
        "vocab": vocab_key(cfg),
        "filters": {"max_len": cfg.max_len, "max_ratio": cfg.max_ratio, "max_src_words": cfg.max_src_words},
    }


def vocab_key(cfg: DataConfig) -> dict:
    """The vocabulary's part of the key: the settings it is learned with, or the given model's digest (data.vocab_from:
    the same vocabulary from another path is the same data; an edited one is not)."""
    if cfg.vocab_from:
        return {"type": "sentencepiece-bpe", "given": hashlib.sha256(given_vocabulary(cfg.vocab_from)).hexdigest()}
    return {"type": "sentencepiece-bpe", "size": cfg.vocab_size, "sample": cfg.vocab_sample}


def prepared_offline(cfg: DataConfig, existing: dict | None) -> bool:
    """Whether a hub corpus's prepared folder serves a node that cannot read the hub: prepared from a copy of the
    repository (data.hub_name=DIR) or on a machine with network, with every setting this job asks for."""
    if cfg.name != "wmt14" or existing is None:
        return False
    settings = {name: value for name, value in existing.get("key", {}).items() if name != "inputs"}
    return settings == manifest_key(cfg, inputs=False)


def another_corpus(old_key: dict, key: dict) -> str | None:
    """Why a prepared folder (its manifest's key, `old_key`) holds another corpus than `key` asks for, or None: its
    training or validation inputs are other files (other paths, and other content: the same files edited, or the
    same content moved, are this corpus still). The test split may change; it is rebuilt, not refused."""
    for split in ("train", "valid"):
        old, new = old_key.get("inputs", {}).get(split), key["inputs"][split]
        if old is None or old == new or same_place(old, new) or same_content(old, new):
            continue
        return f"its data.{split} is {describe_input(old)}, not this job's {describe_input(new)}"
    return None


def same_place(old: dict, new: dict) -> bool:
    """The same files (by path as written, or resolved), or the same hub dataset's config."""
    if "config" in old or "config" in new:
        return old.get("config") == new.get("config")
    return sorted(old) == sorted(new) or sorted(map(_resolved, old)) == sorted(map(_resolved, new))


def same_content(old: dict, new: dict) -> bool:
    """The same digests (of files, or of a hub split's rows), wherever they were read from."""
    def content(inputs: dict) -> list:
        return sorted(str(value) for name, value in inputs.items() if name != "config")
    return content(old) == content(new)


def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def describe_input(inputs: dict) -> str:
    if "config" in inputs:
        return f"the hub dataset's {inputs['config']} config"
    return " and ".join(inputs)


def key_changes(old_key: dict, key: dict) -> str:
    """What differs between a prepared folder's manifest key and the one asked for, said as fields: the content of
    the same files (`train.de changed`), other test files, a setting (`data.vocab_size 600 -> 800`)."""
    changes = []
    for split in SPLITS:
        old, new = old_key.get("inputs", {}).get(split, {}), key["inputs"][split]
        if old == new:
            continue
        edited = [Path(path).name for path, digest in new.items() if path in old and old[path] != digest]
        moved = "the same content at other paths" if same_content(old, new) else "other files"
        changes.append(f"{', '.join(edited)} changed" if edited else f"data.{split}: {moved}")
    settings = {"src": ("src",), "tgt": ("tgt",), "vocab_size": ("vocab", "size"), "vocab_sample": ("vocab", "sample"),
                "vocab_from": ("vocab", "given"),
                **{name: ("filters", name) for name in key["filters"]}}
    for field, path in settings.items():
        old, new = _lookup(old_key, path), _lookup(key, path)
        if old != new:
            changes.append(f"data.{field} {old} -> {new}")
    if old_key.get("format_version") != key["format_version"]:
        changes.append(f"the prepared format {old_key.get('format_version')} -> {key['format_version']}")
    return "; ".join(changes) or "its inputs or settings changed"


def _lookup(key: dict, path: tuple[str, ...]):
    for part in path:
        key = key.get(part, {}) if isinstance(key, dict) else None
    return None if key == {} else key
