"""Parallel corpus readers. Each yields (source, target) string pairs in corpus order.

Text is decoded strictly as UTF-8 (a bad byte is an error naming file and line), a leading
BOM and the line terminator (LF or CRLF) are removed; nothing else is changed here.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterator
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


def read_lines(path: Path) -> Iterator[str]:
    """Decoded lines of a plain or gzipped text file, without terminators."""
    if not path.is_file():
        raise DataError(f"missing file: {path}")
    with _open_binary(path) as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:{number}: invalid UTF-8 at byte {err.start} ({err.reason}); "
                                f"re-encode the file as UTF-8") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            yield line.rstrip("\r\n")


def read_parallel(src_path: Path, tgt_path: Path) -> Iterator[tuple[str, str]]:
    """Pairs from two line-aligned files; different line counts are an error naming both."""
    src_lines, tgt_lines = read_lines(src_path), read_lines(tgt_path)
    count = 0
    while True:
        src, tgt = next(src_lines, None), next(tgt_lines, None)
        if src is None or tgt is None:
            break
        count += 1
        yield src, tgt
    if src is not None or tgt is not None:
        src_total = count + (src is not None) + sum(1 for _ in src_lines)
        tgt_total = count + (tgt is not None) + sum(1 for _ in tgt_lines)
        raise DataError(
            f"parallel files differ in length: {src_path} has {src_total} lines, "
            f"{tgt_path} has {tgt_total} lines; they must be line-aligned"
        )


def read_local(prefix: str, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """data=local: PREFIX.<src> and PREFIX.<tgt>, plain or .gz."""
    return read_parallel(find_file(prefix, src), find_file(prefix, tgt))


def read_multi30k(root: str, split: str, src: str, tgt: str) -> Iterator[tuple[str, str]]:
    """The bundled Multi30k task 1 corpus: {train,val,test_2016_flickr}.<lang>.gz under root."""
    return read_local(multi30k_prefix(root, split), src, tgt)


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
