"""python -m nmt.translate checkpoint=PATH [beam=4 alpha=0.6] [input=FILE] [output=FILE]

Raw source lines in (stdin or input=FILE), detokenized translations out (stdout or output=FILE):
exactly one output line per input line, in input order. Empty or whitespace-only lines give
empty lines. A line longer than max_input_tokens subword tokens (default 1,024, as fairseq's
--max-source-positions) is cut to that length with a warning naming it, never dropped, so one stray paragraph or
binary blob costs bounded time; a model with absolute (sinusoid) positions also cuts at its table's length.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import hydra
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf
from tqdm import tqdm

from nmt.checkpoint import CheckpointError, load_checkpoint
from nmt.config import Attention, ConfigError, Position, Precision, model_config_from_dict, require
from nmt.data.batching import pad_rows
from nmt.data.readers import DataError
from nmt.data.vocab import Vocab
from nmt.kernels.dispatch import AttentionBackend
from nmt.model import EOS, Transformer
from nmt.search import beam_search, greedy

log = logging.getLogger("nmt.translate")


@dataclass
class DecodeJob:
    checkpoint: str = MISSING
    beam: int = 4  # 1 = greedy
    alpha: float = 0.6  # GNMT length penalty exponent
    input: Optional[str] = None  # default: stdin
    output: Optional[str] = None  # default: stdout
    max_extra: int = 50  # longest output = source length + max_extra
    max_tokens: int = 4096  # padded source tokens per batch (each expanded to `beam` hypotheses)
    max_input_tokens: int = 1024  # longer input lines are cut to this many subword tokens, with a warning
    device: str = "auto"
    precision: Precision = Precision.auto  # auto: bf16 autocast on a GPU that has it, else fp32
    attention: Attention = Attention.auto  # relative self-attention's implementation (auto | torch | triton)

    def check(self) -> "DecodeJob":
        require(self.beam >= 1, "beam", self.beam, ">= 1 (1 = greedy)")
        require(self.alpha >= 0, "alpha", self.alpha, ">= 0 (0 = no length penalty)")
        require(self.max_extra >= 1, "max_extra", self.max_extra, ">= 1")
        require(self.max_tokens >= 1, "max_tokens", self.max_tokens, ">= 1")
        require(self.max_input_tokens >= 1, "max_input_tokens", self.max_input_tokens, ">= 1")
        require(self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"), "device", self.device,
                "auto, cpu, cuda or cuda:N")
        self.precision, self.attention = Precision(self.precision), Attention(self.attention)
        return self


def decoding_dtype(precision: Precision, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for decoding (None = fp32). auto: bf16 on a GPU that has it (the search's scores stay fp32),
    fp32 elsewhere: fp16 could overflow without the loss scaling that training has."""
    if precision == Precision.auto:
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if bf16 else None
    return {Precision.fp32: None, Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}[precision]


def load_translator(checkpoint: str | Path, device: torch.device,
                    backend: AttentionBackend | None = None) -> tuple[Transformer, Vocab]:
    state = load_checkpoint(checkpoint)
    if "vocab" not in state or "config" not in state:
        raise CheckpointError(f"{checkpoint}: no vocabulary or config inside; was it written by nmt.train?")
    vocab = Vocab(model_proto=state["vocab"].numpy().tobytes())
    model = Transformer(model_config_from_dict(state["config"]["model"]), state["model"]["embed.weight"].shape[0],
                        backend)
    model.load_state_dict(state["model"])
    return model.to(device).eval(), vocab


def input_limit(model: Transformer, max_extra: int, max_input_tokens: int | None = None) -> int | None:
    """Longest source (tokens, EOS excluded) decoded: max_input_tokens, and for a model with absolute positions
    the longest whose output still fits the sinusoid table (relative distances are clipped, never out of range).
    None: no limit."""
    limits = [max_input_tokens] if max_input_tokens is not None else []
    if model.cfg.position in (Position.absolute, Position.both):
        limits.append(model.cfg.max_positions - max_extra - 1)
    return min(limits) if limits else None


def encode_lines(vocab: Vocab, lines: list[str], limit: int | None) -> list[list[int]]:
    ids = vocab.encode([line.strip() for line in lines])
    for number, row in enumerate(ids, 1):
        if limit is not None and len(row) > limit:
            log.warning("input line %d has %d tokens: truncated to %d (max_input_tokens, or the model's position "
                        "table)", number, len(row), limit)
            del row[limit:]
    return ids


@torch.no_grad()
def translate_ids(model: Transformer, ids: list[list[int]], beam: int, alpha: float, max_extra: int,
                  max_tokens: int, device: torch.device, progress: bool = False) -> list[list[int]]:
    """Token ids in, token ids out, same order. Empty inputs give empty outputs without decoding."""
    order = [i for i in np.argsort([len(row) for row in ids], kind="stable") if ids[i]]
    outputs: list[list[int]] = [[] for _ in ids]
    bar = tqdm(total=len(order), unit=" sent", disable=not progress, file=sys.stderr)
    start = 0
    while start < len(order):
        end = start + 1  # sorted by length: the last sentence of a batch is its longest
        while end < len(order) and (end - start + 1) * (len(ids[order[end]]) + 1) <= max_tokens:
            end += 1
        batch = order[start:end]
        src = pad_rows([np.asarray(ids[i]) for i in batch], suffix=EOS).to(device)
        hyps = greedy(model, src, max_extra) if beam == 1 else beam_search(model, src, beam, alpha, max_extra)
        for i, hyp in zip(batch, hyps):
            outputs[i] = hyp.tokens
        bar.update(len(batch))
        start = end
    bar.close()
    return outputs


def translate_lines(model, vocab, lines: list[str], beam=4, alpha=0.6, max_extra=50, max_tokens=4096,
                    device=torch.device("cpu"), progress=False, max_input_tokens=1024) -> list[str]:
    ids = encode_lines(vocab, lines, input_limit(model, max_extra, max_input_tokens))
    out = translate_ids(model, ids, beam, alpha, max_extra, max_tokens, device, progress)
    return [vocab.decode(row) for row in out]


def decode_source_lines(raw_lines: Iterable[bytes], name: str) -> Iterator[str]:
    """Text lines from raw bytes; a line that is not valid UTF-8 is decoded with U+FFFD replacement
    and a warning naming it, so a filter still writes one output line for every input line."""
    for number, raw in enumerate(raw_lines, 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            log.warning("%s:%d: invalid UTF-8 at byte %d (%s): undecodable bytes replaced by U+FFFD",
                        name, number, err.start, err.reason)
            line = raw.decode("utf-8", errors="replace")
        if number == 1:
            line = line.removeprefix("\ufeff")
        yield line.rstrip("\r\n")


def open_source(path: Optional[str]):
    """The binary input stream: input=FILE (plain or .gz) or standard input."""
    if path is None:
        return contextlib.nullcontext(sys.stdin.buffer)
    if not Path(path).is_file():
        raise DataError(f"missing file: {path}")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


ConfigStore.instance().store(name="decode_schema", node=DecodeJob)


@hydra.main(version_base="1.3", config_path="../configs", config_name="decode")
def main(cfg) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s", force=True)
    job: DecodeJob = OmegaConf.to_object(cfg)
    try:
        device = pick_device(job.check().device)
        model, vocab = load_translator(job.checkpoint, device, AttentionBackend(job.attention))
        dtype = decoding_dtype(job.precision, device)

        def translate(lines, progress=False):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                return translate_lines(model, vocab, lines, job.beam, job.alpha, job.max_extra, job.max_tokens,
                                       device, progress, job.max_input_tokens)

        out = open(job.output, "w", encoding="utf-8") if job.output else sys.stdout
        with open_source(job.input) as source:
            lines = decode_source_lines(source, job.input or "<stdin>")
            if job.input is None and sys.stdin.isatty():  # interactive: answer each line as it is typed
                for line in lines:
                    print(translate([line])[0], file=out, flush=True)
            else:
                for translation in translate(list(lines), progress=job.input is not None):
                    out.write(translation + "\n")
        if out is not sys.stdout:
            out.close()
    except (ConfigError, CheckpointError, DataError) as err:
        log.error("%s", err)
        sys.exit(2)


if __name__ == "__main__":
    main()
