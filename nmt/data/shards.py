"""Binarized token shards: one flat id array per side plus offsets, memory-mapped for training.

<split>.<side>.bin  token ids (uint16 when the vocabulary fits, else int32), sentences back to back
<split>.<side>.idx  int64 offsets, N + 1 entries: sentence i is bin[idx[i]:idx[i+1]]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.data.readers import DataError


def id_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32


@dataclass
class Packed:
    """Encoded sentences as a shard stores them: their ids back to back, and each one's length."""

    ids: np.ndarray  # (tokens,) id_dtype of the vocabulary
    lengths: np.ndarray  # (sentences,) int64


def pack(sentences: list[list[int]], vocab_size: int) -> Packed:
    lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
    ids = np.fromiter(itertools.chain.from_iterable(sentences), dtype=id_dtype(vocab_size), count=int(lengths.sum()))
    return Packed(ids, lengths)


class ShardWriter:
    """Appends packed sentences chunk by chunk; memory is bounded by the chunk."""

    def __init__(self, directory: Path, split: str, side: str, vocab_size: int):
        self.dtype = id_dtype(vocab_size)
        self.bin = open(directory / f"{split}.{side}.bin", "wb")
        self.idx_path = directory / f"{split}.{side}.idx"
        self.lengths: list[np.ndarray] = []

    def append(self, packed: Packed) -> None:
        packed.ids.astype(self.dtype, copy=False).tofile(self.bin)
        self.lengths.append(packed.lengths)

    def close(self) -> int:
        self.bin.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        with open(self.idx_path, "wb") as f:
            np.save(f, offsets, allow_pickle=False)
        return len(lengths)


class EncodedSplit:
    """Read side of one split: sentence i -> (source ids, target ids) as numpy views.

    Opening checks what a partial copy or a mix-up leaves behind (cheap: sizes, offsets, the largest id;
    about a second for WMT14): each .bin holds exactly the tokens its .idx points to, both sides hold the same
    number of sentences (`expected`, from the manifest, when given), and every id is below vocab_size. A damaged
    split raises DataError naming the file."""

    def __init__(self, directory: str | Path, split: str, vocab_size: int, expected: int | None = None):
        directory = Path(directory)
        dtype = id_dtype(vocab_size)
        self.src_offsets, self.src = _open_side(directory, split, "src", dtype, vocab_size)
        self.tgt_offsets, self.tgt = _open_side(directory, split, "tgt", dtype, vocab_size)
        for side, offsets in (("src", self.src_offsets), ("tgt", self.tgt_offsets)):
            want = expected if expected is not None else len(self.src_offsets) - 1
            if len(offsets) - 1 != want:
                raise _damaged(directory / f"{split}.{side}.idx", f"{len(offsets) - 1} sentences where the "
                               f"{'manifest says' if expected is not None else 'source side has'} {want}")

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.src[self.src_offsets[i] : self.src_offsets[i + 1]],
                self.tgt[self.tgt_offsets[i] : self.tgt_offsets[i + 1]])


def _damaged(path: Path, problem: str) -> DataError:
    return DataError(f"{path}: {problem}: the prepared data is damaged (a partial copy?) or from another "
                     f"vocabulary; rebuild it with python -m nmt.prepare ... force=true (or delete {path.parent})")


def _open_side(directory: Path, split: str, side: str, dtype, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, memory-mapped ids) of one side, checked against each other and the vocabulary."""
    idx_path, bin_path = directory / f"{split}.{side}.idx", directory / f"{split}.{side}.bin"
    for path in (idx_path, bin_path):
        if not path.is_file():
            raise _damaged(path, "missing")
    try:
        offsets = np.load(idx_path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as err:
        raise _damaged(idx_path, f"unreadable ({err})") from None
    if offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0):
        raise _damaged(idx_path, "not a list of increasing offsets from 0")
    itemsize = np.dtype(dtype).itemsize
    size = bin_path.stat().st_size
    if size != int(offsets[-1]) * itemsize:
        raise _damaged(bin_path, f"{size} bytes where the index needs {int(offsets[-1]) * itemsize}")
    ids = np.memmap(bin_path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    if len(ids) and int(ids.max()) >= vocab_size:
        raise _damaged(bin_path, f"token id {int(ids.max())} is outside the {vocab_size}-piece vocabulary")
    return offsets, ids
