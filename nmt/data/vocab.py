"""One shared SentencePiece word-piece vocabulary over both languages (as the paper's 32,768)."""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from nmt.checkpoints.checkpoint import CheckpointError, vocabulary_of
from nmt.config import ConfigError
from nmt.data.readers import DataError

log = logging.getLogger(__name__)

# Special token ids, fixed in every vocabulary (SentencePiece is trained with them), shared by data and model.
PAD, UNK, BOS, EOS = 0, 1, 2, 3


def train_vocab(text_file: Path, model_prefix: Path, vocab_size: int, sample_size: int, threads: int = 0) -> Path:
    """Train BPE on a file of sentences (one per line); returns the .model path.

    threads: SentencePiece's (0: one per core); the model is the same on any number.
    sample_size bounds the memory: the vocabulary learns from that many sentences drawn with a fixed seed
    (_sample_lines) instead of loading all of WMT14.
    A corpus too small for vocab_size gets the largest vocabulary it supports, with a warning; a vocab_size too
    small for the text's characters, or any other refusal of SentencePiece's, is a ConfigError naming the setting.
    """
    sample = _sample_lines(text_file, sample_size)
    try:
        return _train_or_fit(sample, model_prefix, vocab_size, sample_size, threads)
    finally:
        if sample != text_file:
            sample.unlink()


def _train_or_fit(text_file: Path, model_prefix: Path, vocab_size: int, sample_size: int, threads: int) -> Path:
    """BPE of vocab_size pieces on text_file, or of the most the text supports (with a warning)."""
    try:
        return _train_bpe(text_file, model_prefix, vocab_size, sample_size, threads)
    except RuntimeError as err:
        largest = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", str(err))
        if largest is None:
            raise ConfigError(sentencepiece_refusal(str(err), vocab_size, sample_size)) from None
        supported = int(largest.group(1))
        log.warning("data.vocab_size=%d is more than this training text supports (at most %d word pieces): "
                    "using %d; set data.vocab_size=%d or less to silence this", vocab_size, supported, supported,
                    supported)
        return _train_bpe(text_file, model_prefix, supported, sample_size, threads)


def sentencepiece_refusal(error: str, vocab_size: int, sample_size: int) -> str:
    """SentencePiece's RuntimeError ("INTERNAL: src/trainer_interface.cc(638) [...] Vocabulary size is smaller than
    required_chars. 60 vs 330. ...") as one line naming the data.* setting to change and how."""
    needed = re.search(r"smaller than required_chars\. \d+ vs (\d+)", error)
    if needed:
        return (f"data.vocab_size={vocab_size} is too small for this training text: its characters, with the 256 "
                f"byte pieces and 4 special ones, need {needed.group(1)} word pieces; set data.vocab_size="
                f"{needed.group(1)} or more (the paper: 32768)")
    if "sentences_.empty()" in error:
        return "the training text holds no sentence to learn a vocabulary from: check data.train (or the preset's files)"
    reason = error.split("]", 1)[-1].strip() or error.strip().splitlines()[0]
    return (f"SentencePiece could not learn a vocabulary of data.vocab_size={vocab_size} from "
            f"data.vocab_sample={sample_size} sentences: {reason}; change data.vocab_size or data.vocab_sample")


SAMPLE_SEED = 1  # which sentences of a larger text the vocabulary learns from: the same ones at every prepare


def _sample_lines(text_file: Path, sample_size: int) -> Path:
    """text_file, or where it has more lines than sample_size, a file beside it with sample_size of them drawn with
    SAMPLE_SEED (in their order). SentencePiece's own sampling (input_sentence_size) draws other sentences at every
    training, whatever seed it is given, so two prepares of one corpus would learn two vocabularies."""
    with open(text_file, "rb") as f:
        lines = sum(block.count(b"\n") for block in iter(lambda: f.read(1 << 20), b""))
    if lines <= sample_size:
        return text_file
    keep = np.zeros(lines, dtype=bool)
    keep[np.random.default_rng(SAMPLE_SEED).choice(lines, sample_size, replace=False)] = True
    sample = text_file.with_name(f"{text_file.stem}.sample{text_file.suffix}")
    with open(text_file, "rb") as source, open(sample, "wb") as out:
        out.writelines(itertools.compress(source, keep))
    return sample


def _train_bpe(text_file: Path, model_prefix: Path, vocab_size: int, sample_size: int, threads: int) -> Path:
    spm.SentencePieceTrainer.train(
        input=str(text_file),
        model_prefix=str(model_prefix),
        vocab_size=vocab_size,
        model_type="bpe",
        character_coverage=0.9999,
        byte_fallback=True,  # characters outside the vocabulary become bytes, never <unk>
        input_sentence_size=sample_size,
        shuffle_input_sentence=True,
        pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
        num_threads=threads or os.cpu_count() or 1,
        max_sentence_length=1 << 16,
        minloglevel=2,
    )
    model = model_prefix.with_suffix(".model")
    _forget_how_it_ran(model)
    return model


def _forget_how_it_ran(model: Path) -> None:
    """Clear what SentencePiece records in the model about the run rather than the vocabulary: the paths of the
    training text and the output (in prepare's temporary folder) and the thread count (the same pieces on any), so that
    two prepares of the same data, on any machine and any number of workers, write the same spm.model."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.read_bytes())
    for run_only in ("input", "model_prefix", "num_threads"):
        proto.trainer_spec.ClearField(run_only)
    model.write_bytes(proto.SerializeToString())


def given_vocabulary(path: str) -> bytes:
    """The SentencePiece model data.vocab_from names, as bytes: a prepared folder's spm.model, an spm.model file, or
    the vocabulary a checkpoint carries (fairseq's --srcdict, OpenNMT-py's -src_vocab). It must keep this project's
    special ids (a vocabulary nmt.prepare learned does); else a DataError naming data.vocab_from."""
    field, given = f"data.vocab_from={path}", Path(path)
    if given.is_dir():
        given = given / "spm.model"
        if not given.is_file():
            raise DataError(f"{field}: no spm.model in that folder (a folder nmt.prepare wrote holds one)")
    if not given.is_file():
        raise DataError(f"{field}: no such file or folder (give a prepared folder, its spm.model or a checkpoint)")
    if given.suffix == ".model":
        model = given.read_bytes()
    else:
        try:
            model = vocabulary_of(given)
        except CheckpointError as err:
            raise DataError(f"{field}: {err}") from None
    try:
        sp = spm.SentencePieceProcessor(model_proto=model)
    except RuntimeError:
        raise DataError(f"{field}: {given} is not a SentencePiece model") from None
    ids = (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id())
    if ids != (PAD, UNK, BOS, EOS):
        raise DataError(f"{field}: its special ids (pad, unk, bos, eos) are {ids}, not this project's "
                        f"{(PAD, UNK, BOS, EOS)}: give a vocabulary nmt.prepare learned")
    return model


class Vocab:
    """Encode raw text to ids and decode ids back to detokenized text."""

    def __init__(self, model_file: str | Path | None = None, model_proto: bytes | None = None):
        if model_proto is not None:
            self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
        else:
            self.sp = spm.SentencePieceProcessor(model_file=str(model_file))

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def model_proto(self) -> bytes:
        """The model as bytes: what a worker process loads it from."""
        return self.sp.serialized_model_proto()

    def encode(self, sentences: Iterable[str], threads: int = 0) -> list[list[int]]:
        """The ids of each sentence, on `threads` of SentencePiece's C++ threads (0: one per core)."""
        return self.sp.encode(list(sentences), out_type=int, num_threads=threads or os.cpu_count() or 1)

    def decode(self, ids: list[int]) -> str:
        """Detokenized text of one line (a decoded newline byte would break line alignment: made a space)."""
        text = self.sp.decode([i for i in ids if i > EOS])
        return text.replace("\r", " ").replace("\n", " ") if "\n" in text or "\r" in text else text
