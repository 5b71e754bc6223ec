"""What a job can end with short of success, as the user meets it (nmt.cli.hydra_job turns each into one line and an
exit code, never a traceback):

- UserError: something the user can cause and mend (a config value, an input file, a checkpoint, a run that
  diverged): its message names the field or file and what to do; exit 2.
- Stopped: a signal ended the job after it saved what it had; running the same command again continues; exit 75
  (EX_TEMPFAIL: a batch scheduler's requeue code).
"""

EXIT_USER_ERROR = 2
EXIT_STOPPED = 75


class UserError(Exception):
    """Bad input, config or state that the user can mend: the message says what, where and what to do."""

    every_rank_alike = False  # under torchrun every rank raises the same one: rank 0 alone says it (nmt.cli)


class ConfigError(UserError, ValueError):
    """A config value out of its range: the message names the field, the value and what it must be."""
    every_rank_alike = True  # the same config on every rank: rank 0 says it


def require(condition: bool, field: str, value, rule: str) -> None:
    """The check of one config value (nmt/config.py): ConfigError naming the field, the value and the rule."""
    if not condition:
        raise ConfigError(f"{field}={value} is invalid: it must be {rule}")


class Stopped(Exception):
    """A signal stopped the job after its last save: run the same command again to continue."""
