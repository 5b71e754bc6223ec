"""Binarized token shards: one flat id array per side plus offsets, memory-mapped for training.

<split>.<side>.bin  token ids (uint16 when the vocabulary fits, else int32), sentences back to back
<split>.<side>.idx  int64 offsets, N + 1 entries: sentence i is bin[idx[i]:idx[i+1]]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def id_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32


class ShardWriter:
    """Appends encoded sentences chunk by chunk; memory is bounded by the chunk."""

    def __init__(self, directory: Path, split: str, side: str, vocab_size: int):
        self.dtype = id_dtype(vocab_size)
        self.bin = open(directory / f"{split}.{side}.bin", "wb")
        self.idx_path = directory / f"{split}.{side}.idx"
        self.lengths: list[np.ndarray] = []

    def append(self, sentences: list[list[int]]) -> None:
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        flat = np.fromiter((i for s in sentences for i in s), dtype=self.dtype, count=int(lengths.sum()))
        flat.tofile(self.bin)
        self.lengths.append(lengths)

    def close(self) -> int:
        self.bin.close()
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        with open(self.idx_path, "wb") as f:
            np.save(f, offsets, allow_pickle=False)
        return len(lengths)


class EncodedSplit:
    """Read side of one split: sentence i -> (source ids, target ids) as numpy views."""

    def __init__(self, directory: str | Path, split: str, vocab_size: int):
        directory = Path(directory)
        dtype = id_dtype(vocab_size)
        self.src = np.memmap(directory / f"{split}.src.bin", dtype=dtype, mode="r") if (
            directory / f"{split}.src.bin").stat().st_size else np.zeros(0, dtype)
        self.tgt = np.memmap(directory / f"{split}.tgt.bin", dtype=dtype, mode="r") if (
            directory / f"{split}.tgt.bin").stat().st_size else np.zeros(0, dtype)
        self.src_offsets = np.load(directory / f"{split}.src.idx", allow_pickle=False)
        self.tgt_offsets = np.load(directory / f"{split}.tgt.idx", allow_pickle=False)

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
