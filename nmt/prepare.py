"""python -m nmt.prepare data=<preset> [data.field=...]: raw text -> vocabulary + shards."""

import logging

from omegaconf import OmegaConf

from nmt.cli import hydra_job
from nmt.config import DataConfig, PrepareJob
from nmt.compose import register_schemas
from nmt.data.pipeline import prepare

log = logging.getLogger("nmt.prepare")
register_schemas()


@hydra_job("prepare", PrepareJob)
def main(cfg) -> None:
    data: DataConfig = OmegaConf.to_object(cfg.data)
    path = prepare(data.check(), force=cfg.force)
    log.info("prepared data in %s", path)


if __name__ == "__main__":
    main()
