"""Stop signals: SIGTERM, SIGUSR1, a submitit job's preemption signal and a first Ctrl-C end a run after its current
update, with a complete checkpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from nmt.cluster import preemption_signal


# A second Ctrl-C counts as "again" only this long after the first: torchrun passes the terminal's Ctrl-C on to its
# workers, which the terminal already reached, within milliseconds.
AGAIN_AFTER_S = 1.0


@contextlib.contextmanager
def stop_signals(announce: bool = True, on_stop=None):
    """SIGTERM (SLURM before a time limit or preemption; torchrun passes it on), SIGUSR1 (`#SBATCH
    --signal=USR1@120`), a submitit job's preemption signal (nmt/cluster.py) and a first SIGINT (Ctrl-C at a
    terminal) only raise a flag: the run ends after the current update, on every rank at the same one, with a
    complete checkpoint. Ctrl-C again raises KeyboardInterrupt: the
    run ends at once, keeping only what was saved. announce: say so on stderr at the first Ctrl-C (rank 0);
    on_stop: called once, in the handler, at the first stop signal (the folder lock says its job is stopping)."""
    state = {"received": None, "at": 0.0}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, _frame):
        now = time.monotonic()
        if signum == signal.SIGINT and state["received"] is not None and now - state["at"] >= AGAIN_AFTER_S:
            raise KeyboardInterrupt
        if state["received"] is None:
            state["received"], state["at"] = signal.Signals(signum).name, now
            if on_stop is not None:
                on_stop()
            if signum == signal.SIGINT and announce:  # os.write: logging is not safe inside a signal handler
                os.write(2, b"\nCtrl-C: stopping after this update, with a complete checkpoint "
                            b"(Ctrl-C again to stop at once, without saving)\n")

    stops = {signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, preemption_signal()} - {None}  # + a submitit job's
    previous = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield state
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
