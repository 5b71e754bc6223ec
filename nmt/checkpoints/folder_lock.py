"""One job writes an output folder at a time: a lock on OUT/.lock, taken by rank 0 for a whole training run
(nmt.train) or experiment (nmt.experiment), released by the kernel however the process ends. The same lock keeps a
machine's cores to one sweep (experiments/sweep.py)."""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import logging
import os
import socket
import sys
from pathlib import Path
from typing import IO

from nmt.checkpoints.checkpoint import CheckpointError
from nmt.runtime import Env, broadcast_flag

log = logging.getLogger(__name__)


def take_lock(path: Path) -> tuple[IO | contextlib.nullcontext | None, str]:
    """(the open lock file, held by this process, "") or (None, what the file says of the process holding it);
    OSError when the file cannot be opened.

    A POSIX record lock (fcntl F_SETLK, as lockf), not flock: it belongs to this process alone. A flock belongs to
    the open file, which forked children share (a sweep's pool workers, torch.compile's), so a killed sweep's
    orphaned workers held its lock and a re-run was refused, naming the dead process. Here the kernel drops the
    lock when the process ends, however it ends, and a child never holds it. Its one catch: closing any other open
    file of `path` in this process drops it too, so nothing else here opens a lock file."""
    handle = open(path, "a+")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EACCES, errno.EAGAIN):  # a file system without locks (some NFS, Lustre mounts)
            handle.close()
            log.warning("%s cannot be locked (%s): nothing stops a second job from using it", path, err.strerror or err)
            return contextlib.nullcontext(), ""
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not said who it is yet"
        handle.close()
        return None, holder
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {datetime.datetime.now():%Y-%m-%d %H:%M:%S}: "
                 f"{' '.join(sys.argv)}\n")
    handle.flush()
    return handle, ""


def lock_folder(out: Path):
    """The open lock file of `out`, held by this job: one training job writes a folder at a time (take_lock: a
    killed job leaves no lock behind). Raises CheckpointError naming the job that holds it."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        handle, holder = take_lock(out / ".lock")
    except OSError as err:
        raise CheckpointError(f"cannot write the output folder {out}: {err.strerror or err}") from None
    if handle is None:
        raise CheckpointError(f"{out} is being written by another training job ({holder}): wait for it to end, "
                              "or give this one another train.output_dir")
    return handle


def hold_folder(env: Env, out: Path):
    """This job's hold on its output folder (rank 0 takes the lock; the other ranks hold nothing): a context to keep
    for the whole run. Every rank raises the same CheckpointError when rank 0 could not take it, so no rank waits in
    a collective for one that stopped."""
    refused, held = None, contextlib.nullcontext()
    if env.main:
        try:
            held = lock_folder(out)
        except CheckpointError as err:
            refused = err
    if env.world_size > 1 and broadcast_flag(env, refused is not None):
        refused = refused or CheckpointError(f"rank 0 could not lock {out}")
    if refused is not None:
        raise refused
    return held
