"""One job writes an output folder at a time: an flock on OUT/.lock, taken by rank 0 for a whole training run
(nmt.train) or experiment (nmt.experiment), released by the kernel however the process ends."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from nmt.checkpoint import CheckpointError
from nmt.runtime import Env, broadcast_flag

log = logging.getLogger(__name__)


def lock_folder(out: Path):
    """The open lock file of `out`, held (flock) by this job: one training job writes a folder at a time. The
    kernel drops the lock when the process ends, however it ends, so a killed job leaves none behind. Raises
    CheckpointError naming the job that holds it."""
    import datetime
    import fcntl
    import socket
    import sys

    try:
        out.mkdir(parents=True, exist_ok=True)
        handle = open(out / ".lock", "a+")
    except OSError as err:
        raise CheckpointError(f"cannot write the output folder {out}: {err.strerror or err}") from None
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "a process that has not said who it is yet"
        handle.close()
        raise CheckpointError(f"{out} is being written by another training job ({holder}): wait for it to end, "
                              "or give this one another train.output_dir") from None
    except OSError as err:  # a file system without flock (some Lustre and NFS mounts): train, unguarded
        handle.close()
        log.warning("%s cannot be locked (%s): nothing stops a second job from writing it", out, err.strerror or err)
        return contextlib.nullcontext()
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}, since {datetime.datetime.now():%Y-%m-%d %H:%M:%S}: "
                 f"{' '.join(sys.argv)}\n")
    handle.flush()
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
