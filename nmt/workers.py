"""Worker processes of a stage that spreads its work over the cores (prepare's encode): how many, and a pool of them
that never outlives the stage, however the stage ends.

The pool's workers ignore Ctrl-C (the terminal sends SIGINT to the whole foreground group: the stage alone answers
it, in one line) and end when their parent ends, however it ends (SIGTERM, SIGKILL, the OOM killer); a stage that
ends early (an error, Ctrl-C, a consumer that stops reading) terminates them instead of waiting for their tasks.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity: a SLURM allocation or taskset, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_count(requested: int) -> int:
    """`requested` processes, or with 0 one per available core."""
    return requested or available_cores()


def die_with_parent() -> None:
    """SIGTERM to this process when its parent ends, however it ends (Linux prctl PR_SET_PDEATHSIG; elsewhere
    nothing): a parent killed from outside (SIGKILL, the OOM killer, a scheduler) leaves no worker running on."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG (linux/prctl.h)
    except (OSError, AttributeError):
        pass


LAUNCHER_PID = "RELNMT_LAUNCHER_PID"  # set by a launcher whose worker processes run the jobs (the joblib launcher's)


LAUNCHER_STOPPING = "RELNMT_LAUNCHER_STOPPING"  # a file the launcher creates when a signal asks it to stop


def die_with_launcher() -> None:
    """In a worker process of a launcher that named itself (LAUNCHER_PID): SIGTERM when the launcher ends, however it
    ends (SIGKILL, the OOM killer, a lost login shell), so a killed study leaves no cell training for nobody: the cell
    stops after its update with a checkpoint, as on any SIGTERM, and the study run again waits for that checkpoint
    (nmt/checkpoints/folder_lock.py) and continues the cell. Between cells, a SIGTERM ends the worker if its
    launcher is gone and is otherwise the launcher's (stop_workers): an idle worker has nothing to stop. Nothing in
    the launcher's own process."""
    launcher = os.environ.get(LAUNCHER_PID, "")
    if not launcher.isdigit() or int(launcher) == os.getpid():
        return
    signal.signal(signal.SIGTERM, lambda *_: os._exit(128 + signal.SIGTERM) if launcher_gone() else None)
    die_with_parent()
    if os.getppid() != int(launcher):  # the launcher ended before the line above could ask to be told
        os._exit(128 + signal.SIGTERM)


def launcher_stopping() -> bool:
    """In a launcher's worker process: whether a signal asked the launcher to stop (its LAUNCHER_STOPPING file is
    there): a cell not yet started then does not start."""
    path = os.environ.get(LAUNCHER_STOPPING, "")
    return bool(path) and os.path.exists(path)


def stop_workers() -> None:
    """SIGTERM to this process's worker processes (Linux: its children in /proc), each of which, training a cell,
    stops after its update with a checkpoint (die_with_launcher: an idle one lets it pass). Safe in a signal handler."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                parent = int(stat.read().rsplit(b")", 1)[1].split()[1])
            if parent == os.getpid():
                os.kill(int(entry), signal.SIGTERM)
        except (OSError, ValueError, IndexError):  # ended meanwhile, or not ours to signal
            continue


def launcher_gone() -> bool:
    """In a launcher's worker process (LAUNCHER_PID): whether the launcher has ended (this worker now belongs to init),
    so that nothing waits for the worker and it ends too, instead of idling for jobs that never come."""
    launcher = os.environ.get(LAUNCHER_PID, "")
    return launcher.isdigit() and int(launcher) != os.getpid() and os.getppid() != int(launcher)


def _start_worker(parent: int, initializer: Callable[..., None], initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a stop flag inherited from the parent (nmt.runtime.signals)
    die_with_parent()
    if os.getppid() != parent:  # the parent ended before the line above could ask to be told
        os._exit(1)
    initializer(*initargs)


@contextlib.contextmanager
def worker_pool(workers: int, initializer: Callable[..., None], initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """A ProcessPoolExecutor of `workers` forked processes, each set up once by initializer(*initargs). A worker that
    dies raises BrokenProcessPool at its task's result (multiprocessing.Pool would wait for it for ever)."""
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"), initializer=_start_worker,
                               initargs=(os.getpid(), initializer, initargs))
    try:
        yield pool
    except BaseException:
        # the executor has no public call that stops a running task: without this, shutdown waits for each one
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.terminate()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def map_in_order(pool: ProcessPoolExecutor, function: Callable, items: Iterable, window: int) -> Iterator:
    """function(item) for each item on the pool, results in input order, at most `window` in flight (memory is the
    window, not the input). An error raised by `items` itself (the reader) comes after the results of the items read
    before it, whose own errors come first: the order one process would meet them in."""
    in_flight = deque()
    try:
        for item in items:
            in_flight.append(pool.submit(function, item))
            del item  # the worker's copy is the one in flight
            if len(in_flight) >= window:
                yield in_flight.popleft().result()
    except Exception:
        while in_flight:
            yield in_flight.popleft().result()
        raise
    while in_flight:
        yield in_flight.popleft().result()
