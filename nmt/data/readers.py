"""Parallel corpus readers. Each yields (source, target) string pairs in corpus order.

Text is decoded strictly as UTF-8 (a bad byte is an error naming file and line), a leading
BOM and the line terminator (LF or CRLF) are removed; nothing else is changed here.
"""

from __future__ import annotations

import gzip
import hashlib
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nmt.errors import UserError


class DataError(UserError):
    """Bad input data: the message says what, where (file:line) and what to do."""


MULTI30K_SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
WMT14_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


def find_file(prefix: str, lang: str) -> Path:
    """PREFIX.lang or PREFIX.lang.gz."""
    for candidate in (Path(f"{prefix}.{lang}"), Path(f"{prefix}.{lang}.gz")):
        if candidate.is_file():
            return candidate
    raise DataError(f"missing file: {prefix}.{lang} (or {prefix}.{lang}.gz)")


def _open_binary(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


BLOCK_LINES = 10_000  # lines decoded at a time where no chunk size is asked for


def raw_blocks(f, size: int) -> Iterator[list[bytes]]:
    """A binary file's lines, `size` at a time, undecoded (terminators kept): one readline each, in C."""
    while block := list(itertools.islice(f, size)):
        yield block


def decode_lines(path: Path, raw: list[bytes], first: int) -> list[str]:
    """Lines first, first + 1, ... of `path` as read (raw_blocks) -> text: strict UTF-8, without terminators (LF or
    CRLF) and, on line 1, without a BOM. A bad byte is a DataError naming file, line and byte, with the line number
    in its `line` attribute (which of two files' errors comes first)."""
    try:
        text = b"".join(raw).decode("utf-8")  # one C call: decoding line by line costs the reader most of its time
    except UnicodeDecodeError as err:
        number, start = first, err.start
        for line in raw:
            if start < len(line):
                break
            start -= len(line)
            number += 1
        error = DataError(f"{path}:{number}: invalid UTF-8 at byte {start} ({err.reason}); re-encode the file as "
                          f"UTF-8")
        error.line = number
        raise error from None
    lines = [line.rstrip("\r") for line in text.split("\n")[:len(raw)]]
    if first == 1 and lines:
        lines[0] = lines[0].removeprefix("\ufeff")
    return lines


def read_lines(path: Path) -> Iterator[str]:
    """Decoded lines of a plain or gzipped text file, without terminators."""
    if not path.is_file():
        raise DataError(f"missing file: {path}")
    with _open_binary(path) as f:
        first = 1
        for raw in raw_blocks(f, BLOCK_LINES):
            yield from decode_lines(path, raw, first)
            first += len(raw)


@dataclass
class LineBlock:
    """Aligned lines first, first + 1, ... of a source and a target file, undecoded: reading one costs a readline a
    line, so that prepare's parent reads and its workers decode (pairs), with read_lines' errors."""

    paths: tuple[Path, Path]
    first: int
    raw: tuple[list[bytes], list[bytes]]

    def __len__(self) -> int:
        return len(self.raw[0])

    def pairs(self) -> list[tuple[str, str]]:
        """(source, target) text; of two bad lines, the error of the one a pair-by-pair reader meets first."""
        sides, errors = [], []
        for path, raw in zip(self.paths, self.raw):
            try:
                sides.append(decode_lines(path, raw, self.first))
            except DataError as err:
                errors.append(err)
        if errors:
            raise min(errors, key=lambda err: err.line)  # min keeps the source's on a tie, as the reader would
        return list(zip(*sides))


@dataclass
class PairBlock:
    """Pairs read as text already (the hub's rows)."""

    items: list[tuple[str, str]]

    def __len__(self) -> int:
        return len(self.items)

    def pairs(self) -> list[tuple[str, str]]:
        return self.items


def pair_blocks(pairs: Iterator[tuple[str, str]], size: int) -> Iterator[PairBlock]:
    while block := list(itertools.islice(pairs, size)):
        yield PairBlock(block)


def line_blocks(src_path: Path, tgt_path: Path, size: int) -> Iterator[LineBlock]:
    """Two line-aligned files, `size` lines of each at a time; different line counts are an error naming both,
    raised after the last aligned block (whose own errors come first)."""
    with _open_binary(src_path) as src_file, _open_binary(tgt_path) as tgt_file:
        first = 1
        while True:
            src, tgt = list(itertools.islice(src_file, size)), list(itertools.islice(tgt_file, size))
            aligned = min(len(src), len(tgt))
            if aligned:
                yield LineBlock((src_path, tgt_path), first, (src[:aligned], tgt[:aligned]))
            if len(src) != len(tgt):
                src_total = first - 1 + len(src) + sum(1 for _ in src_file)
                tgt_total = first - 1 + len(tgt) + sum(1 for _ in tgt_file)
                raise DataError(f"parallel files differ in length: {src_path} has {src_total} lines, {tgt_path} "
                                f"has {tgt_total} lines; they must be line-aligned")
            if len(src) < size:
                return
            first += size


REPOSITORY = Path(__file__).resolve().parents[2]  # where the bundled corpus ships (data/multi30k)


def multi30k_prefix(root: str, split: str) -> str:
    """A Multi30k split's file prefix under `root`, as given where it is found from the working folder; a relative
    root that is not (the default data/multi30k, from any folder but the repository's) is the repository's."""
    prefix = Path(root) / MULTI30K_SPLITS[split]
    if not prefix.is_absolute() and not prefix.parent.is_dir() and (REPOSITORY / prefix).parent.is_dir():
        prefix = REPOSITORY / prefix
    return str(prefix)


HUB_SAMPLE_ROWS = 1000  # rows read, evenly spaced, for a hub split's content digest (all of a smaller split)


def hub_split_content(rows) -> dict:
    """What a hub split holds, wherever it was read from (the hub, its cache, a copy of the repository): its row
    count and the SHA-256 of HUB_SAMPLE_ROWS evenly spaced rows. The same rows read from another place are the same
    input; datasets' own fingerprint names the place too."""
    n = len(rows)
    picked = sorted({i * (n - 1) // max(1, HUB_SAMPLE_ROWS - 1) for i in range(min(n, HUB_SAMPLE_ROWS))})
    digest = hashlib.sha256()
    for row in rows.select(picked):
        digest.update(json.dumps(row["translation"], sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return {"rows": n, "sample_sha256": digest.hexdigest()}


def pairs_from_hub_split(rows, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """Rows with the WMT schema {"translation": {"en": ..., "de": ...}} -> (src, tgt) pairs."""
    for number, row in enumerate(rows, 1):
        translation = row["translation"]
        if src not in translation or tgt not in translation:
            raise DataError(f"row {number} has languages {sorted(translation)}, expected {src} and {tgt}")
        yield translation[src].strip("\r\n"), translation[tgt].strip("\r\n")


def load_hub_split(name: str, config: str, split: str):
    """One split of a `datasets` hub corpus, or a DataError that says how to work offline."""
    import datasets

    offline_hint = (
        f"to use a local copy, either pre-download it into the datasets cache on a machine with network "
        f"(python -c \"import datasets; datasets.load_dataset('{name}', '{config}')\") and point HF_HOME or "
        f"HF_DATASETS_CACHE at it, or copy the hub repository and give its folder as data.hub_name=DIR, or export "
        f"plain text files and use data=local data.train=PREFIX ..."
    )
    offline = os.environ.get("HF_DATASETS_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1"
    # a folder is a copy of the hub repository (huggingface-cli download wmt/wmt14 --repo-type dataset --local-dir D)
    offline = offline or Path(name).is_dir()
    if not offline and not _hub_reachable():
        raise DataError(f"cannot reach the Hugging Face hub to load {name} ({config}); if the dataset is already "
                        f"cached, set HF_DATASETS_OFFLINE=1; otherwise {offline_hint}")
    try:
        return datasets.load_dataset(name, config, split=WMT14_SPLITS[split])
    except (ConnectionError, OSError, ValueError) as err:
        cause = "offline mode is on and the dataset is not cached" if offline else f"{type(err).__name__}: {err}"
        raise DataError(f"cannot load {name} ({config}, {split}) from the Hugging Face hub: {cause}; "
                        f"{offline_hint}") from None


def _hub_reachable(timeout: float = 5.0) -> bool:
    """One TCP connect to the hub endpoint: `datasets` itself retries for ~30 s before giving up."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
