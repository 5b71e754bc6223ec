"""python -m tests.failing_rank [nmt.train overrides]: nmt.train whose rank 1 raises at update 3 (for
tests/test_faults.py: the whole job must end promptly, with the error shown)."""

import os
import sys
from pathlib import Path

from nmt import train

real_step = train.Trainer.train_step


def train_step(self, *args, **kwargs):
    if self.env.rank == 1 and self.step + 1 == 3:
        raise RuntimeError("injected failure on rank 1 at update 3")
    return real_step(self, *args, **kwargs)


if __name__ == "__main__":
    assert os.environ.get("WORLD_SIZE") == "2"
    train.Trainer.train_step = train_step
    sys.argv.insert(1, f"--config-path={Path(train.__file__).resolve().parent.parent / 'configs'}")
    train.main()
