"""python -m tests.other_vocab_rank [nmt.train overrides]: nmt.train whose rank 1 reads the prepared folder at
$RANK1_PREPARED_DIR while it believes it reads data.prepared_dir, as a node whose local disk holds its own copy
at the same path (for tests/test_faults_edges.py: the ranks must find out that they disagree)."""

import os
import sys
from dataclasses import replace
from pathlib import Path

from nmt import train
from nmt.training import trainer

real_open_prepared = trainer.open_prepared


def open_prepared(cfg):
    if os.environ["RANK"] != "1":
        return real_open_prepared(cfg)
    return replace(real_open_prepared(replace(cfg, prepared_dir=os.environ["RANK1_PREPARED_DIR"])),
                   directory=Path(cfg.prepared_dir))  # the same path as rank 0's


if __name__ == "__main__":
    assert os.environ.get("WORLD_SIZE") == "2"
    trainer.open_prepared = open_prepared
    sys.argv.insert(1, f"--config-path={Path(train.__file__).resolve().parent.parent / 'configs'}")
    train.main()
