"""A split's raw pairs -> filtered, encoded and binarized shards, on data.workers processes: the parent reads (so
a reading error is the same error on any number of workers), each worker encodes a chunk of data.chunk_lines pairs
with the shared vocabulary, and the chunks are written in input order, the same bytes as one worker writes. Memory
is two chunks a worker, whatever the corpus."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from nmt.config import DataConfig
from nmt.data.readers import DataError
from nmt.data.shards import Packed, ShardWriter, pack
from nmt.data.sources import read_split
from nmt.data.vocab import Vocab
from nmt.progress import ProgressBar
from nmt.workers import worker_pool


def drop_reason(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a training pair (lengths in subword tokens) is dropped, or None to keep it."""
    if src_len == 0 or tgt_len == 0:
        return "empty"
    if max(src_len, tgt_len) > max_len:
        return "too_long"
    if max(src_len, tgt_len) / min(src_len, tgt_len) > max_ratio:
        return "ratio"
    return None


def _chunks(pairs, size):
    iterator = iter(pairs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


@dataclass
class EncodedChunk:
    """One chunk of a split, encoded: the pairs it keeps, what it read and dropped, and (valid and test, which keep
    their text) its cleaned lines."""

    src: Packed
    tgt: Packed
    counts: Counter
    lines: tuple[list[str], list[str]] | None


def encode_chunk(pairs: list[tuple[str, str]], vocab: Vocab, cfg: DataConfig, split: str) -> EncodedChunk:
    """Encode one chunk of raw pairs. Training pairs are filtered; valid/test keep every line."""
    sources = [s.strip() for s, _ in pairs]
    targets = [t.strip() for _, t in pairs]
    # one thread: the cores are shared out as worker processes, which also run the Python work around the encode
    src_ids, tgt_ids = vocab.encode(sources, threads=1), vocab.encode(targets, threads=1)
    counts = Counter(read=len(pairs))
    if split == "train":
        keep = [drop_reason(len(s), len(t), cfg.max_len, cfg.max_ratio) for s, t in zip(src_ids, tgt_ids)]
        if cfg.max_src_words:
            keep = [reason or ("src_words" if len(text.split()) > cfg.max_src_words else None)
                    for reason, text in zip(keep, sources)]
        counts.update(f"dropped_{reason}" for reason in keep if reason)
        src_ids = [ids for ids, reason in zip(src_ids, keep) if reason is None]
        tgt_ids = [ids for ids, reason in zip(tgt_ids, keep) if reason is None]
    return EncodedChunk(pack(src_ids, len(vocab)), pack(tgt_ids, len(vocab)), counts,
                        None if split == "train" else (sources, targets))


_worker_job: tuple | None = None  # a pool worker's (vocab, cfg, split), loaded once by _load_worker


def _load_worker(spm_model: bytes, cfg: DataConfig, split: str) -> None:
    global _worker_job
    _worker_job = Vocab(model_proto=spm_model), cfg, split


def _encode_in_worker(pairs: list[tuple[str, str]]) -> EncodedChunk:
    return encode_chunk(pairs, *_worker_job)


def encoded_chunks(cfg: DataConfig, split: str, vocab: Vocab, workers: int) -> Iterator[EncodedChunk]:
    """encode_chunk over the split's chunks of cfg.chunk_lines pairs, in input order, on `workers` processes.

    The pairs are read here (a reading error is raised here, as with one process) and at most 2 chunks per worker
    are in flight, so memory is bounded by the workers and the chunk, not by the corpus. A split of one chunk is
    encoded here: a pool has nothing to share out."""
    chunks = _chunks(read_split(cfg, split), cfg.chunk_lines)
    first = next(chunks, None)
    second = next(chunks, None) if first is not None and workers > 1 else None
    if second is None:
        for chunk in itertools.chain([first] if first is not None else [], chunks):
            yield encode_chunk(chunk, vocab, cfg, split)
        return
    chunks = itertools.chain([first, second], chunks)
    del first, second  # held by the chain until it is past them: memory is the window of chunks in flight
    with worker_pool(workers, _load_worker, (vocab.model_proto(), cfg, split)) as pool:
        in_flight = deque()
        for chunk in chunks:
            in_flight.append(pool.submit(_encode_in_worker, chunk))
            del chunk  # the worker's copy is the one in flight
            if len(in_flight) >= 2 * workers:
                yield _result(in_flight.popleft(), cfg, workers)
        while in_flight:
            yield _result(in_flight.popleft(), cfg, workers)


def _result(task, cfg: DataConfig, workers: int) -> EncodedChunk:
    try:
        return task.result()
    except BrokenProcessPool:  # killed from outside: the OOM killer, most likely
        raise DataError(f"a worker of prepare's encode ended before its chunk was done (out of memory?): lower "
                        f"data.workers={workers} or data.chunk_lines={cfg.chunk_lines}") from None


def write_split(cfg: DataConfig, split: str, vocab: Vocab, out: Path, workers: int) -> dict:
    """Encode one split into shards, in input order, whatever the number of workers."""
    writers = {side: ShardWriter(out, split, side, len(vocab)) for side in ("src", "tgt")}
    raw = {} if split == "train" else {lang: open(out / f"{split}.{lang}", "w", encoding="utf-8")
                                          for lang in (cfg.src, cfg.tgt)}
    counts = Counter()
    # closed here, however this ends: an error while writing ends the workers at once, not when collected
    with ProgressBar(desc=f"encode {split}", unit=" pairs", leave=False) as bar, \
            contextlib.closing(encoded_chunks(cfg, split, vocab, workers)) as chunks:
        for encoded in chunks:
            counts.update(encoded.counts)
            if encoded.lines is not None:
                for lang, lines in zip((cfg.src, cfg.tgt), encoded.lines):
                    raw[lang].writelines(line + "\n" for line in lines)
            writers["src"].append(encoded.src)
            writers["tgt"].append(encoded.tgt)
            bar.update(encoded.counts["read"])
    for f in raw.values():
        f.close()
    counts["kept"] = writers["src"].close()
    writers["tgt"].close()
    return dict(counts)
