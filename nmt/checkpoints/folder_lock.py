"""One job writes an output folder at a time: a lock on OUT/.lock, taken by rank 0 for a whole training run
(nmt.train) or experiment (nmt.experiment), released by the kernel however the process ends.

Two cases the kernel's lock alone gets wrong:
- a job that a signal is stopping (a killed sweep's cell finishing its update and its checkpoint) still holds the
  folder for a few seconds: it says so in the lock file (announce_stopping), and a job that wants the folder waits
  for it, up to STOPPING_WAIT_S, instead of failing the cell it should continue;
- a file system whose locks hold per node only (Lustre mounted with localflock) lets a job on a second node take a
  lock that a live job on the first holds: the holder touches its lock file every HEARTBEAT_S, and a lock file that
  names another node, another job and a recent touch is refused (the_other_node_holds_it).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO

from nmt.checkpoints.checkpoint import CheckpointError
from nmt.runtime.distributed import broadcast_flag
from nmt.runtime.process import Env

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
    handle.write(f"{holder_line()}\n")
    handle.flush()
    return handle, ""


LOCK = ".lock"
RUN_BOOKKEEPING = (LOCK, "train.log")  # what a run writes into its folder before it trains (nmt.train)
STOPPING = "stopping"  # the first word of a lock file whose holder a signal is stopping (announce_stopping)
STOPPING_WAIT_S = 300  # how long a job waits for a stopping one: its update and checkpoint (torchrun's shutdown bound)
HEARTBEAT_S = 60  # how often a folder's holder touches its lock file
ANOTHER_NODE_LIVE_S = 5 * HEARTBEAT_S  # a lock file touched this recently from another node names a live job
_held: "FolderLock | None" = None  # this process's folder lock, which announce_stopping marks


def holder_line() -> str:
    """Who holds a lock: the process, its machine and SLURM job (a requeued job keeps its id), since when, and the
    command."""
    job = f", SLURM job {os.environ['SLURM_JOB_ID']}" if os.environ.get("SLURM_JOB_ID") else ""
    return (f"pid {os.getpid()} on {socket.gethostname()}{job}, since {datetime.datetime.now():%Y-%m-%d %H:%M:%S}: "
            f"{' '.join(sys.argv)}")


def the_other_node_holds_it(text: str, age_s: float) -> bool:
    """Whether a lock file's last holder (its `text`, touched `age_s` ago) is a live job on another node, which a
    per-node lock (localflock) could not keep out: another host, another SLURM job, and a heartbeat within
    ANOTHER_NODE_LIVE_S. An ended holder emptied the file (FolderLock.release)."""
    host = socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID")
    return (bool(text.strip()) and f" on {host}," not in text and f" on {host}:" not in text
            and not (job and f"SLURM job {job}," in text) and age_s < ANOTHER_NODE_LIVE_S)


class FolderLock:
    """A held folder lock: touched every HEARTBEAT_S by a daemon thread (off the training step), emptied and released
    at the end of the `with`."""

    def __init__(self, handle):
        self.handle, self.done = handle, threading.Event()
        threading.Thread(target=self._beat, daemon=True, name="folder-lock-heartbeat").start()

    def _beat(self):
        while not self.done.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError, ValueError):
                os.utime(self.handle.fileno())

    def announce_stopping(self) -> None:
        """`stopping ...` first in the lock file; os-level writes: safe inside a signal handler."""
        with contextlib.suppress(OSError, ValueError):
            fd = self.handle.fileno()
            said = os.pread(fd, 4096, 0)
            if not said.startswith(STOPPING.encode()):  # opened to append: emptied, then written from the start
                os.ftruncate(fd, 0)
                os.write(fd, f"{STOPPING} (saving its checkpoint) since {datetime.datetime.now():%H:%M:%S}, ".encode()
                         + said)

    def release(self) -> None:
        global _held
        self.done.set()
        with contextlib.suppress(OSError, ValueError):
            self.handle.truncate(0)
        self.handle.close()
        _held = None if _held is self else _held

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.release()


def announce_stopping() -> None:
    """Say in this process's folder lock (if it holds one) that a signal is stopping it
    (nmt.runtime.signals.stop_signals' on_stop): a job that wants the folder waits for the checkpoint instead of failing."""
    if _held is not None:
        _held.announce_stopping()


def lock_folder(out: Path, wait_s: float = STOPPING_WAIT_S) -> FolderLock:
    """This job's lock of `out`: one training job writes a folder at a time (take_lock: a killed job leaves no lock
    behind). A holder that is stopping is waited for, up to `wait_s`. Raises CheckpointError naming the job that
    holds it."""
    global _held
    lock, deadline, said = out / LOCK, time.monotonic() + wait_s, False
    while True:
        try:
            out.mkdir(parents=True, exist_ok=True)
            last = lock.read_text() if lock.is_file() else ""
            age_s = time.time() - lock.stat().st_mtime if lock.is_file() else float("inf")
            handle, holder = take_lock(lock)
        except OSError as err:
            raise CheckpointError(f"cannot write the output folder {out}: {err.strerror or err}") from None
        if handle is not None:
            break
        if not holder.startswith(STOPPING) or time.monotonic() > deadline:
            still = f" (still stopping after {wait_s:.0f} s)" if holder.startswith(STOPPING) else ""
            raise CheckpointError(f"{out} is being written by another training job ({holder}){still}: wait for it to "
                                  "end, or give this one another train.output_dir")
        if not said:
            log.warning("%s: the job writing it is stopping (%s); waiting for its checkpoint, up to %.0f s", out,
                        holder, wait_s)
            said = True
        time.sleep(0.2)
    if isinstance(handle, contextlib.nullcontext):  # a file system without locks: nothing to hold or announce
        return handle
    if the_other_node_holds_it(last, age_s):
        handle.seek(0)
        handle.truncate()
        handle.write(last)  # the live holder's line stays
        handle.close()
        raise CheckpointError(f"{out} is being written by a job on another node ({last.strip()}); this file "
                              "system's locks hold per node only (Lustre's localflock): wait for it to end, or give "
                              "this one another train.output_dir")
    _held = FolderLock(handle)
    return _held


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
