"""The Hydra entry point every `python -m nmt.*` job shares: overrides checked before Hydra runs the job, so a
mistyped key exits 2 with one line, like an out-of-range value, instead of Hydra's multi-line report and exit 1."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import hydra

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def override_error(config_name: str, overrides: list[str]) -> str | None:
    """One line saying what is wrong with the overrides (an unknown key, a value of the wrong type, an unknown
    preset), or None. hydra.* keys are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    plain = [arg for arg in overrides if "=" in arg and not arg.startswith(("hydra.", "+hydra.", "hydra/"))]
    try:
        with initialize_config_dir(str(CONFIGS), version_base="1.3"):
            compose(config_name, overrides=plain)
    except (HydraException, OmegaConfBaseException) as err:
        text = f"{err}\n{err.__cause__ or ''}"
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        why = next((line for line in lines[1:] if line.startswith(("Key ", "Value "))), None)
        return " ".join(filter(None, [lines[0] if lines else type(err).__name__, why]))
    return None


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended


def hydra_job(config_name: str, interrupted: str = "interrupted"):
    """@hydra.main for configs/<config_name>.yaml, after the overrides' check (exit 2, one line naming the key).
    Ctrl-C (a KeyboardInterrupt that the job did not handle) ends it with `interrupted` on one line, exit 130."""
    def wrap(task):
        hydra_main = hydra.main(version_base="1.3", config_path="../configs", config_name=config_name)(task)

        @functools.wraps(task)
        def entry():
            args = sys.argv[1:]
            # any flag (-m, --config-name, --cfg, -sc, ...) or a sweep: Hydra's own checks, as they are
            if not any(arg.startswith(("-", "hydra.mode=")) for arg in args):
                error = override_error(config_name, args)
                if error is not None:
                    print(f"error: {error} (python -m nmt.{Path(sys.argv[0]).stem} --help lists the fields)",
                          file=sys.stderr)
                    sys.exit(2)
            try:
                hydra_main()
            except KeyboardInterrupt:
                print(f"\n{interrupted} (Ctrl-C)", file=sys.stderr)
                sys.exit(EXIT_INTERRUPTED)

        return entry

    return wrap
