"""python -m nmt.prepare data=<preset> [data.field=...]: raw text -> vocabulary + shards."""

import logging
import sys

from omegaconf import OmegaConf

from nmt.cli import hydra_job
from nmt.config import ConfigError, DataConfig, PrepareJob, register_schemas
from nmt.data.pipeline import prepare
from nmt.data.readers import DataError

log = logging.getLogger("nmt.prepare")
register_schemas()


@hydra_job("prepare", PrepareJob)
def main(cfg) -> None:
    data: DataConfig = OmegaConf.to_object(cfg.data)
    try:
        path = prepare(data.check(), force=cfg.force)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    log.info("prepared data in %s", path)


if __name__ == "__main__":
    main()
