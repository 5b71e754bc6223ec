"""python -m nmt.translate checkpoint=PATH [beam=4 alpha=0.6] [input=FILE] [output=FILE] [nbest=N]

Raw source lines in (stdin or input=FILE), detokenized translations out (stdout or output=FILE):
exactly one output line per input line, in input order, written and flushed chunk by chunk: the first chunk is
8 lines, the next ones about eight full batches of source tokens each, up to buffer_lines input lines (default
5,000), so the first lines come out within seconds, memory stays bounded and a killed or interrupted (Ctrl-C) run
keeps every finished chunk. A reader that goes away (`| head`) ends it quietly. Empty or whitespace-only lines give
empty lines. A line longer than max_input_tokens subword tokens (default 1,024, as fairseq's
--max-source-positions) is cut to that length with a warning naming it, never dropped, so one stray paragraph or
binary blob costs bounded time; a model with absolute (sinusoid) positions also cuts at its table's length.
nbest=N (<= beam) writes N lines per input line instead, its N best translations, best first, as Moses' n-best
lists: "INDEX ||| TRANSLATION ||| SCORE", INDEX the input line's number from 0 (one block per input line, streamed
the same way).
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import os
import queue
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Optional

# GNU OpenMP's threads spin for 300,000 rounds after each parallel region before they sleep; decoding runs many small
# regions with pauses between them, and beside other jobs those spinning threads take the cores the work needs. A
# shorter spin costs nothing alone and is faster under load (python -m benchmarks.translate_pools). Read when torch
# loads libgomp, so before it is imported; a value the user set wins.
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

import torch  # noqa: E402
from omegaconf import OmegaConf

from nmt.cli import hydra_job
from nmt.config import DecodeJob
from nmt.compose import register_schemas
from nmt.data.readers import DataError
from nmt.decoding.decode import load_translator, translate_stream
from nmt.errors import UserError
from nmt.kernels.dispatch import AttentionBackend
from nmt.outputs import output_file
from nmt.progress import ProgressBar
from nmt.runtime.memory import retain_freed_memory
from nmt.runtime.precision import autocast, autocast_dtype
from nmt.runtime.process import resolve_device

log = logging.getLogger("nmt.translate")


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


def require_streams(job: DecodeJob) -> None:
    """Standard input and output that the job reads and writes are open: a shell's `<&-` or `>&-` (or a launcher
    that starts it without them) leaves sys.stdin or sys.stdout None, and the job would fail at its first read or
    write with a traceback, after loading the model."""
    if job.input is None and sys.stdin is None:
        raise UserError("standard input is closed: pipe the lines in (... | relnmt-translate ...) or give input=FILE")
    if job.output is None and sys.stdout is None:
        raise UserError("standard output is closed: give output=FILE, or leave standard output open")


def open_output(path: str):
    """output=FILE for writing (output_file checked it first), a failure in one line (a read-only disk, no room)."""
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as err:
        raise UserError(f"output={path}: cannot write it: {err.strerror or err}") from None


def descriptor_lines(fd: int, block: int = 1 << 16) -> Iterator[bytes]:
    """Raw lines (each with its newline; a last one without) read from a file descriptor with os.read, which holds no
    lock of Python's: the thread of ArrivingLines still blocked in its read when the job ends (`| head -1`, Ctrl-C,
    input still arriving) would otherwise hold sys.stdin.buffer's lock, and the interpreter aborts at shutdown
    ("Fatal Python error: _enter_buffered_busy", exit 134) when it closes standard input."""
    pending: list[bytes] = []  # the pieces of a line not yet ended, joined once it ends (a long line costs linear time)
    while data := os.read(fd, block):
        *complete, rest = data.split(b"\n")
        if complete:
            complete[0] = b"".join([*pending, complete[0]])
            pending = []
            yield from (line + b"\n" for line in complete)
        pending.append(rest)
    if last := b"".join(pending):
        yield last


class ArrivingLines:
    """Lines read by a thread as they arrive (standard input that is a pipe): take(n) is what has arrived, at most n
    lines, waiting only for the first, so a line written into the pipe is translated and written without waiting for
    the lines after it (fairseq-interactive's --buffer-size; buffer_lines=1 answers line by line). At most `bound`
    lines wait in memory."""

    _END = object()

    def __init__(self, lines: Iterable[str], bound: int):
        self.queue: queue.Queue = queue.Queue(maxsize=max(1, bound))
        self.ended = False
        threading.Thread(target=self._read, args=(lines,), daemon=True, name="stdin-reader").start()

    def _read(self, lines: Iterable[str]) -> None:
        try:
            for line in lines:
                self.queue.put(line)
        except Exception as err:  # noqa: BLE001 -- raised where the lines are taken, in the main thread
            self.queue.put(err)
        self.queue.put(self._END)

    def take(self, most: int) -> list[str]:
        taken, item = [], None if self.ended else self.queue.get()
        while item is not None:
            if item is self._END:
                self.ended = True
                break
            if isinstance(item, Exception):
                raise item
            taken.append(item)
            try:
                item = self.queue.get_nowait() if len(taken) < most else None
            except queue.Empty:
                item = None
        return taken


def count_lines(path: str) -> int:
    """Lines in a file (plain or .gz), as decode_source_lines will read them: a last line without its newline
    counts."""
    count, last = 0, b"\n"
    with open_source(path) as source:
        while block := source.read(1 << 20):
            count, last = count + block.count(b"\n"), block[-1:]
    return count + (last != b"\n")


register_schemas()


def quiet_stdout() -> None:
    """The reader of standard output went away: send what is left to /dev/null, so that the interpreter's own
    flush at exit does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


@hydra_job("decode", DecodeJob, interrupted="interrupted: every finished line is written")
def main(cfg) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s", force=True)
    job: DecodeJob = OmegaConf.to_object(cfg)
    try:
        require_streams(job.check())
        device = resolve_device(job.device)
        if job.threads:  # beside a training job, translate takes what it is given, not every core
            torch.set_num_threads(job.threads)
        if device.type == "cpu":  # each step's cache and activations reuse freed memory, not fresh pages
            retain_freed_memory()
        if job.output:  # before anything is opened for writing: output=FILE empties FILE at once
            source = {"input file": job.input} if job.input else {"standard input": "/dev/stdin"}  # `< FILE`
            output_file("output", job.output, {**source, "checkpoint": job.checkpoint})
        model, vocab = load_translator(job.checkpoint, device, AttentionBackend(job.attention), job.precision)
        dtype = autocast_dtype(job.precision, device, training=False)

        interactive = job.input is None and sys.stdin.isatty()  # answer each line as it is typed
        out = open_output(job.output) if job.output else sys.stdout
        # lines as they are written; a file's total (counted first, fast) gives the bar its rate and ETA
        bar = ProgressBar(total=count_lines(job.input) if job.input else None, unit=" lines", disable=job.input is None,
                   file=sys.stderr, mininterval=1.0)
        with open_source(job.input) as source, autocast(device, dtype):
            arriving_input = job.input is None and not interactive  # a pipe: read by a thread as the lines arrive
            raw_lines = descriptor_lines(sys.stdin.fileno()) if arriving_input else source
            lines = decode_source_lines(raw_lines, job.input or "<stdin>")
            arriving = ArrivingLines(lines, job.buffer_lines) if arriving_input else None
            for chunk in translate_stream(model, vocab, lines, job, device, 1 if interactive else job.buffer_lines,
                                          job.nbest, arriving.take if arriving else None):
                out.write("".join(translation + "\n" for translation in chunk))
                out.flush()  # a chunk done is a chunk kept, whatever happens next
                bar.update(len(chunk))
        bar.close()
        if out is not sys.stdout:
            out.close()
    except BrokenPipeError:  # `| head -1`: a filter ends quietly when its reader closes the pipe, as Unix tools do
        quiet_stdout()


if __name__ == "__main__":
    main()
