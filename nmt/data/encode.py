"""A split's raw pairs -> the vocabulary's training text, and filtered, encoded and binarized shards, on data.workers
processes: the parent reads the files' lines undecoded, data.chunk_lines at a time, each worker decodes a block (with
the one-worker errors, raised in input order) and makes it text or encodes it with the shared vocabulary, and the
blocks are written in input order, the same bytes as one worker writes. Memory is two chunks a worker, whatever the
corpus."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

from nmt.config import DataConfig
from nmt.data.readers import DataError, LineBlock, PairBlock
from nmt.data.shards import Packed, ShardWriter, pack
from nmt.data.sources import read_blocks
from nmt.data.vocab import Vocab
from nmt.progress import ProgressBar
from nmt.workers import map_in_order, worker_pool

Block = LineBlock | PairBlock


def drop_reason(src_len: int, tgt_len: int, max_len: int, max_ratio: float) -> str | None:
    """Why a training pair (lengths in subword tokens) is dropped, or None to keep it."""
    if src_len == 0 or tgt_len == 0:
        return "empty"
    if max(src_len, tgt_len) > max_len:
        return "too_long"
    if max(src_len, tgt_len) / min(src_len, tgt_len) > max_ratio:
        return "ratio"
    return None


@dataclass
class EncodedChunk:
    """One chunk of a split, encoded: the pairs it keeps, what it read and dropped, and (valid and test, which keep
    their text) its cleaned lines."""

    src: Packed
    tgt: Packed
    counts: Counter
    lines: tuple[list[str], list[str]] | None


def encode_chunk(block: Block, vocab: Vocab, cfg: DataConfig, split: str) -> EncodedChunk:
    """Decode and encode one block of raw pairs. Training pairs are filtered; valid/test keep every line."""
    pairs = block.pairs()
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


def vocab_text(block: Block) -> tuple[bytes, int]:
    """A block's sentences for the vocabulary, UTF-8 (what the parent writes as it is): both sides, stripped, the
    empty ones left out, one a line."""
    sentences = [sentence for pair in block.pairs() for sentence in map(str.strip, pair) if sentence]
    return "".join(sentence + "\n" for sentence in sentences).encode(), len(sentences)


_worker_job: tuple | None = None  # a pool worker's (vocab, cfg, split), loaded once by _load_worker


def _load_worker(spm_model: bytes | None, cfg: DataConfig, split: str) -> None:
    global _worker_job
    _worker_job = Vocab(model_proto=spm_model) if spm_model else None, cfg, split


def _encode_in_worker(block: Block) -> EncodedChunk:
    return encode_chunk(block, *_worker_job)


def map_blocks(cfg: DataConfig, split: str, workers: int, vocab: Vocab | None = None) -> Iterator:
    """The split's blocks of cfg.chunk_lines pairs, each encoded (encode_chunk with vocab) or, without a vocabulary,
    made vocabulary text (vocab_text), in input order, on `workers` processes; a split of one block is done here,
    where a pool has nothing to share out. At most 2 blocks per worker are in flight, so memory is bounded by the
    workers and the chunk, not by the corpus; errors come in input order, as on one worker."""
    here = vocab_text if vocab is None else (lambda block: encode_chunk(block, vocab, cfg, split))
    blocks = read_blocks(cfg, split, cfg.chunk_lines)
    first = next(blocks, None)
    second = next(blocks, None) if first is not None and workers > 1 else None
    if second is None:
        for block in itertools.chain([first] if first is not None else [], blocks):
            yield here(block)
        return
    blocks = itertools.chain([first, second], blocks)
    del first, second  # held by the chain until it is past them: memory is the window of blocks in flight
    setup = (None if vocab is None else vocab.model_proto(), cfg, split)
    try:
        with worker_pool(workers, _load_worker, setup) as pool:
            yield from map_in_order(pool, vocab_text if vocab is None else _encode_in_worker, blocks, 2 * workers)
    except DataError as err:  # a bad line, found by a worker: the one line the user reads, as on one worker
        raise err.with_traceback(None) from None
    except BrokenProcessPool:  # killed from outside: the OOM killer, most likely
        raise DataError(f"a worker of prepare ended before its chunk was done (out of memory?): lower "
                        f"data.workers={workers} or data.chunk_lines={cfg.chunk_lines}") from None


def write_split(cfg: DataConfig, split: str, vocab: Vocab, out: Path, workers: int) -> dict:
    """Encode one split into shards, in input order, whatever the number of workers."""
    writers = {side: ShardWriter(out, split, side, len(vocab)) for side in ("src", "tgt")}
    raw = {} if split == "train" else {lang: open(out / f"{split}.{lang}", "w", encoding="utf-8")
                                          for lang in (cfg.src, cfg.tgt)}
    counts = Counter()
    # closed here, however this ends: an error while writing ends the workers at once, not when collected
    with ProgressBar(desc=f"encode {split}", unit=" pairs", leave=False) as bar, \
            contextlib.closing(map_blocks(cfg, split, workers, vocab)) as chunks:
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
