"""The decoding library that nmt.translate, validation and the experiments share: load a checkpoint, cut over-long
lines, batch by length, search (nmt.decoding.search), and give one output per input in input order."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from nmt.checkpoints.checkpoint import CheckpointError, load_checkpoint, non_finite
from nmt.config import SearchConfig, model_config_from_dict
from nmt.data.batching import pad_rows
from nmt.data.vocab import Vocab
from nmt.decoding.cpu_linear import onednn_preferred, use_onednn
from nmt.decoding.fused import fuse_self_attention
from nmt.decoding.search import Hypothesis, beam_search_nbest, greedy
from nmt.kernels.dispatch import AttentionBackend
from nmt.modeling.transformer import EOS, Transformer
from nmt.modes import Precision
from nmt.progress import ProgressBar

log = logging.getLogger("nmt.translate")


EXPORTED_CONFIG = "relnmt.json"  # beside an exported model's model.bin: the relnmt config it was exported from
EXPORT_FILES = ("model.bin", "config.json", "spm.model")  # what an export recorded without its file list needs
COMPUTE_TYPES = {Precision.auto: "default", Precision.fp32: "float32", Precision.bf16: "bfloat16",
                 Precision.fp16: "float16"}  # translate's precision= for an exported model


class ExportedModel:
    """A CTranslate2 directory written by nmt.export, behind the calls the decoding library makes of a
    Transformer: its config (the input limit) and translate_ids. CTranslate2 batches (max_tokens source tokens)
    and sorts by length itself; its search is always relnmt's stop=finished (length^alpha, not GNMT's penalty: at
    alpha = 0 the two rules agree), whatever `stop` says; its length limit is one per call, so a line that reaches
    the chunk's is cut to its own (greedy: exactly relnmt's)."""

    def __init__(self, directory: Path, vocab: Vocab, device: torch.device, precision: Precision):
        try:
            import ctranslate2
        except ImportError:
            raise CheckpointError(f"{directory} is a CTranslate2 model: pip install -e '.[deploy]' (or pip install "
                                  "ctranslate2) to translate with it") from None
        self.cfg = model_config_from_dict(json.loads((directory / EXPORTED_CONFIG).read_text())["model"])
        self.pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
        self.ids = {piece: i for i, piece in enumerate(self.pieces)}
        threads = torch.get_num_threads() if device.type == "cpu" else 0
        self.translator = ctranslate2.Translator(str(directory), device=device.type, device_index=device.index or 0,
                                                 compute_type=COMPUTE_TYPES[precision], intra_threads=threads)

    def search_ids(self, ids: list[list[int]], search: SearchConfig, nbest: int = 1) -> list[list[Hypothesis]]:
        """As nmt.decoding.decode.search_ids; the scores are CTranslate2's (its own length penalty)."""
        rows = [i for i, row in enumerate(ids) if row]
        outputs: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] * nbest for _ in ids]
        if not rows:
            return outputs
        results = self.translator.translate_batch(
            [[self.pieces[t] for t in ids[i]] for i in rows], beam_size=search.beam, length_penalty=search.alpha,
            patience=search.patience, max_decoding_length=max(len(ids[i]) for i in rows) + search.max_extra,
            min_decoding_length=search.min_length, max_batch_size=search.max_tokens, batch_type="tokens",
            num_hypotheses=nbest, return_scores=True)
        for i, result in zip(rows, results):  # each line's own limit, as relnmt's (the chunk's longest above)
            outputs[i] = [Hypothesis([self.ids[piece] for piece in tokens[: len(ids[i]) + search.max_extra]], score)
                          for tokens, score in zip(result.hypotheses, result.scores)]
        return outputs


def load_translator(checkpoint: str | Path, device: torch.device, backend: AttentionBackend | None = None,
                    precision: Precision = Precision.auto, onednn: bool | None = None
                    ) -> tuple[Transformer | ExportedModel, Vocab]:
    """A relnmt checkpoint, or a directory that nmt.export wrote (run by CTranslate2 in `precision`).

    onednn: a checkpoint's linear layers run by oneDNN on a CPU (nmt.decoding.cpu_linear); None: where it is the faster
    library (x86 CPUs not made by Intel)."""
    exported = Path(checkpoint)
    if exported.is_dir():
        check_exported(exported)
        vocab = Vocab(exported / "spm.model")
        return ExportedModel(exported, vocab, device, precision), vocab
    state = load_checkpoint(checkpoint)
    if "vocab" not in state or "config" not in state:
        raise CheckpointError(f"{checkpoint}: no vocabulary or config inside; was it written by nmt.train?")
    if broken := non_finite(state["model"]):  # no hypothesis survives NaN scores
        raise CheckpointError(f"{checkpoint}: {broken}: it cannot translate; use another of the run's "
                              "checkpoints, or average them again")
    vocab = Vocab(model_proto=state["vocab"].numpy().tobytes())
    model = Transformer(model_config_from_dict(state["config"]["model"]), state["model"]["embed.weight"].shape[0],
                        backend)
    model.load_state_dict(state["model"])
    onednn = device.type == "cpu" and (onednn_preferred() if onednn is None else onednn)
    if onednn:
        use_onednn(model)
    return fuse_self_attention(model, onednn).to(device).eval(), vocab


def check_exported(directory: Path) -> None:
    """A folder that nmt.export wrote, whole: every file its relnmt.json lists, at the size written (a lost model.bin
    or a partial copy is one line naming the folder and what is missing, not CTranslate2's RuntimeError)."""
    record = directory / EXPORTED_CONFIG
    if not record.is_file():
        raise CheckpointError(f"{directory} is a folder, not a checkpoint nor a model written by nmt.export")
    try:
        files = json.loads(record.read_text()).get("files") or dict.fromkeys(EXPORT_FILES)
    except (ValueError, AttributeError):
        raise CheckpointError(f"{record}: not the record nmt.export writes (damaged?): export it again") from None
    missing = [name for name in files if not (directory / name).is_file()]
    short = [f"{name} has {(directory / name).stat().st_size} of its {size} bytes" for name, size in files.items()
             if name not in missing and size is not None and (directory / name).stat().st_size != size]
    if missing or short:
        what = "; ".join(filter(None, [f"{', '.join(missing)} missing" if missing else "", *short]))
        raise CheckpointError(f"{directory}: an incomplete export ({what}): copy it whole, or export it again")


def input_limit(model: Transformer, max_extra: int, max_input_tokens: int | None = None) -> int | None:
    """Longest source (tokens, EOS excluded) decoded: max_input_tokens, and for a model with an input position table
    (sinusoids or learned) the longest whose output still fits it (relative distances are clipped, never out of
    range).
    None: no limit."""
    limits = [max_input_tokens] if max_input_tokens is not None else []
    if model.cfg.position.input_table:
        limits.append(model.cfg.max_positions - max_extra - 1)
    return min(limits) if limits else None


def encode_lines(vocab: Vocab, lines: list[str], limit: int | None, first_line: int = 1) -> list[list[int]]:
    ids = vocab.encode([line.strip() for line in lines])
    for number, row in enumerate(ids, first_line):
        if limit is not None and len(row) > limit:
            log.warning("input line %d has %d tokens: truncated to %d (max_input_tokens, or the model's position "
                        "table)", number, len(row), limit)
            del row[limit:]
    return ids


def translate_ids(model: Transformer | ExportedModel, ids: list[list[int]], search: SearchConfig,
                  device: torch.device, progress: bool = False) -> list[list[int]]:
    """Token ids in, token ids out, same order. Empty inputs give empty outputs without decoding."""
    return [hyps[0].tokens for hyps in search_ids(model, ids, search, device, progress)]


@torch.inference_mode()
def search_ids(model: Transformer | ExportedModel, ids: list[list[int]], search: SearchConfig, device: torch.device,
               progress: bool = False, nbest: int = 1) -> list[list[Hypothesis]]:
    """The `nbest` best hypotheses of each input (token ids), best first, in input order. An empty input gets
    `nbest` empty hypotheses of score 0 without decoding."""
    if isinstance(model, ExportedModel):
        return model.search_ids(ids, search, nbest)
    order = [i for i in np.argsort([len(row) for row in ids], kind="stable") if ids[i]]
    outputs: list[list[Hypothesis]] = [[Hypothesis([], 0.0)] * nbest for _ in ids]
    bar = ProgressBar(total=len(order), unit=" sent", disable=not progress)
    start = 0
    while start < len(order):
        end = start + 1  # sorted by length: the last sentence of a batch is its longest
        while end < len(order) and (end - start + 1) * (len(ids[order[end]]) + 1) <= search.max_tokens:
            end += 1
        batch = order[start:end]
        src = pad_rows([np.asarray(ids[i]) for i in batch], suffix=EOS).to(device)
        if search.beam == 1:
            found = [[hyp] for hyp in greedy(model, src, search.max_extra, search.min_length)]
        else:
            found = beam_search_nbest(model, src, search.beam, search.alpha, search.max_extra, search.min_length,
                                      nbest, search.stop, search.patience)
        for i, hyps in zip(batch, found):
            outputs[i] = hyps
        bar.update(len(batch))
        start = end
    bar.close()
    return outputs


def encoded(model: Transformer | ExportedModel, vocab: Vocab, lines: list[str], search: SearchConfig,
            first_line: int = 1) -> list[list[int]]:
    """`lines` as the search takes them: token ids, each cut to input_limit (a warning names the line)."""
    return encode_lines(vocab, lines, input_limit(model, search.max_extra, search.max_input_tokens), first_line)


def written(model: Transformer | ExportedModel, vocab: Vocab, ids: list[list[int]], search: SearchConfig,
            device: torch.device, nbest: int = 1, first_line: int = 1, progress: bool = False) -> list[str]:
    """The translations of `ids`, in their order (sorted by length inside, for batching). nbest > 1: one block per
    line instead, its `nbest` best translations, best first, one per line as Moses' n-best lists write them,
    "INDEX ||| TRANSLATION ||| SCORE": INDEX the input line's number from 0 (first_line: the number of ids[0] from
    1), SCORE the search's (log p(Y|X) / the stopping rule's length penalty for relnmt, CTranslate2's own for an
    export)."""
    found = search_ids(model, ids, search, device, progress, nbest)
    if nbest == 1:
        return [vocab.decode(hyps[0].tokens) for hyps in found]
    return ["\n".join(f"{index} ||| {vocab.decode(hyp.tokens)} ||| {hyp.score:.4f}" for hyp in hyps)
            for index, hyps in enumerate(found, first_line - 1)]


def translate_lines(model: Transformer, vocab: Vocab, lines: list[str], search: SearchConfig = SearchConfig(),
                    device: torch.device = torch.device("cpu"), progress: bool = False,
                    first_line: int = 1) -> list[str]:
    """Translations of `lines`, in their order; first_line: the input line number of lines[0], for the warnings."""
    return written(model, vocab, encoded(model, vocab, lines, search, first_line), search, device, 1, first_line,
                   progress)


# The first chunk is small, so that the first lines come out within a second whatever the input's length; the chunks
# after it are sized by source tokens, CHUNK_BATCHES full batches of max_tokens each at the mean length of the lines
# so far, up to buffer_lines: whole length-sorted batches, about as one chunk of everything decodes them, and the
# same chunks (so the same batches and translations) on any machine under any load. A killed run keeps every chunk
# finished before.
FIRST_CHUNK_LINES = 8
CHUNK_BATCHES = 8


def next_chunk_lines(lines: int, tokens: int, max_tokens: int, most: int) -> int:
    """The size of the next chunk after `lines` lines of `tokens` source tokens (EOS included): CHUNK_BATCHES x
    max_tokens tokens at their mean length, at most `most`, at least 1."""
    return min(most, max(1, round(CHUNK_BATCHES * max_tokens * lines / max(tokens, 1))))


def translate_stream(model: Transformer, vocab: Vocab, lines: Iterable[str], search: SearchConfig,
                     device: torch.device, chunk_lines: int, nbest: int = 1,
                     take: Callable[[int], list[str]] | None = None) -> Iterator[list[str]]:
    """The translations of `lines` chunk by chunk (at most chunk_lines input lines each, length-sorted within the
    chunk, sized by tokens: next_chunk_lines), each chunk in input order, as soon as it is done: memory holds one
    chunk whatever the input's size, and a caller that writes each chunk loses at most the chunk in progress.
    nbest > 1: each line's translation is its block of `written`. take(n): the next chunk of at most n lines
    (default: the next n of `lines`; a pipe's: the lines that have arrived, nmt.translate.ArrivingLines)."""
    source, first, size = iter(lines), 1, min(chunk_lines, FIRST_CHUNK_LINES)
    take = take or (lambda n: list(itertools.islice(source, n)))
    tokens = 0
    while chunk := take(size):
        ids = encoded(model, vocab, chunk, search, first)
        translations = written(model, vocab, ids, search, device, nbest, first)
        tokens += sum(len(row) + 1 for row in ids)
        first += len(chunk)
        size = next_chunk_lines(first - 1, tokens, search.max_tokens, chunk_lines)
        yield translations
