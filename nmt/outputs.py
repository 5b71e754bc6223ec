"""Outputs never destroy inputs: the checks every tool makes on a path before it opens anything for writing, the
one name (and clean-up) of a file or folder written whole under a temporary name, and the one writer of a JSON file.

One home for each rule, so that nmt.translate, nmt.average, nmt.score, nmt.export, the trainer's saves and prepare
refuse the same things with the same words."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
from pathlib import Path

from nmt.errors import UserError


def output_file(field: str, output: str | Path, inputs: dict[str, str | Path | None]) -> Path:
    """`output` as a file the tool may write, its folder made: refused (UserError, nothing opened) when it is a
    folder, when it is one of the job's inputs ({what it is: its path}), which opening it for writing would empty,
    or when its folder cannot be made. Paths are compared as files (os.path.samefile): `in.txt`, `./in.txt` and a
    link to it are the same file."""
    path = Path(output)
    if path.is_dir():
        raise UserError(f"{field}={output} is a folder: give the path of a file to write there, e.g. "
                        f"{field}={path / 'out.txt'} (nothing was written)")
    for what, given in inputs.items():
        if given is not None and same_file(path, Path(given)):
            raise UserError(f"{field}={output} is the {what} ({given}): writing it would destroy it; choose another "
                            f"{field} (nothing was written)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a file where a folder should be, a read-only or full disk
        raise UserError(f"{field}={output}: cannot make its folder {path.parent}: {err.strerror or err}") from None
    return path


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one existing file."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # either one missing: not the same existing file
        return False


def temporary_name(path: Path) -> Path:
    """Where `path` is written before it is renamed into place: hidden, beside it (the rename stays on one file
    system), and named after this machine and process, so that a later run can tell a dead writer's leftovers
    (remove_stale_temporaries), even on a file system that several nodes share."""
    return path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")


def write_json(path: Path | str, value, indent: int = 2) -> None:
    """`value` as JSON in `path` (what JSON has no type for, such as a path, as its str), whole or not at all: written
    under its temporary name, then renamed into place, so that a reader or a kill never meets half a file."""
    path = Path(path)
    staged = temporary_name(path)
    try:
        staged.write_text(json.dumps(value, indent=indent, default=str) + "\n")
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove what a killed writer of `path` left (a SIGKILL, an OOM kill, a SIGTERM to a tool without a handler:
    no `finally` ran): the temporary files or folders of `path` written on this machine by a process that is gone.
    A live writer's, and another machine's, are kept. Returns what was removed."""
    removed, prefix = [], f".{path.name}.tmp-"
    for leftover in path.parent.glob(f"{glob.escape(prefix)}*"):
        host, _, pid = leftover.name[len(prefix):].rpartition("-")
        if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid() or process_alive(int(pid)):
            continue  # another node's (its process cannot be seen from here), a live one, or not ours
        shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        removed.append(leftover)
    return removed


def process_alive(pid: int) -> bool:
    """Whether a process of this id runs on this machine (signal 0 tests, sends nothing)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_unused_folder(folder: Path, bookkeeping: tuple[str, ...]) -> bool:
    """Remove `folder`, which this job made, when it holds nothing but the job's `bookkeeping` files (its lock, its
    log): a job refused before it wrote anything leaves no folder for a later command to trip over. Whether it did."""
    if not folder.is_dir():
        return False
    held = list(folder.iterdir())
    if any(path.name not in bookkeeping for path in held):
        return False
    for path in held:
        path.unlink(missing_ok=True)
    folder.rmdir()
    return True
