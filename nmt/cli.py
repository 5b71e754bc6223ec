"""The Hydra entry point every `python -m nmt.*` job shares: the command line checked before Hydra runs the job
(nmt/overrides.py: a mistake is one line and exit 2, not Hydra's multi-line report and exit 1), `--help` and shell
completion from the job's schema (nmt/fields.py), and the job's body run so that whatever a user can cause ends in
one line."""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import os
import sys
from pathlib import Path

import hydra

from nmt.errors import EXIT_STOPPED, EXIT_USER_ERROR, Stopped, UserError
from nmt.fields import CONFIGS, answer_completion, completion_query, help_text
from nmt.outputs import remove_unused_folder
from nmt.overrides import emulated_bf16_error, flag_error, override_error, sweep_checks

def program_name(module: str) -> str:
    """The command as the user typed it, for usage lines and hints: `relnmt-train` when run as the console script
    (pyproject.toml's [project.scripts]), else `python -m nmt.train` (`module`: the entry point's module)."""
    script = Path(sys.argv[0]).name
    return script if script.startswith("relnmt-") else f"python -m {module}"


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command that Ctrl-C ended


def say_error(err: BaseException, tool: str) -> None:
    """One line on stderr: through the job's own log where it logs to stderr (so a run's train.log keeps it too),
    else as `error: ...`. Under torchrun an error that every rank raises alike (a config error) is said by rank 0
    alone."""
    if getattr(err, "every_rank_alike", False) and os.environ.get("RANK", "0") != "0":
        return
    if any(getattr(handler, "stream", None) is sys.stderr for handler in logging.getLogger().handlers):
        logging.getLogger(f"nmt.{tool}").error("%s", err)
    else:  # no log yet, or Hydra's own (to stdout)
        print(f"error: {err}", file=sys.stderr)


@contextlib.contextmanager
def ends_in_one_line(tool: str, interrupted: str = "interrupted"):
    """Around a job's body (every nmt CLI, Hydra's or argparse's): a UserError ends it in one line, exit 2; Stopped
    with exit 75 (the job said why and how to continue as it stopped); Ctrl-C that the job did not handle with
    `interrupted`, exit 130."""
    try:
        yield
    except UserError as err:
        say_error(err, tool)
        sys.exit(EXIT_USER_ERROR)
    except Stopped:
        sys.exit(EXIT_STOPPED)
    except KeyboardInterrupt:
        print(f"\n{interrupted} (Ctrl-C)", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)


class CellExited(Exception):
    """A sweep's cell that ended with an exit code inside a pool's worker process."""


OUTPUT_FOLDERS = ("train.output_dir",)  # the fields that name a job's own output folder


def hydra_run_dir(args: list[str]) -> list[str]:
    """The arguments, with Hydra's run folder the working directory where the user names the job's output folder:
    Hydra makes its run folder before the job starts, and its default (outputs/<preset>...) would be left behind
    empty; the job makes its own folder once its checks pass (a refused job writes nothing)."""
    named = [arg.split("=", 1)[1] for arg in args if arg.split("=", 1)[0] in OUTPUT_FOLDERS and "=" in arg]
    if not named or any(arg.startswith(("hydra.run.dir=", "-m", "--multirun", "hydra.mode=")) for arg in args):
        return args
    return [*args, "hydra.run.dir=."]


def remove_refused_job_folder() -> None:
    """The folder Hydra made for a job (a run's hydra.run.dir, a sweep cell's) before the job was refused, while it
    is still empty: a refused job writes nothing, and leaves no folder that a later command would take for a run."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    folder = Path(HydraConfig.get().runtime.output_dir).resolve()
    if folder != Path.cwd().resolve():  # hydra.run.dir=. (hydra_run_dir): the user's own directory, never removed
        remove_unused_folder(folder, bookkeeping=())


def hydra_job(config_name: str, schema: type, interrupted: str = "interrupted"):
    """@hydra.main for configs/<config_name>.yaml (whose fields `schema` describes), after the overrides' check
    (exit 2, one line naming the key). --help and -h print help_text; a --flag gets one line (exit 2); the job runs
    in ends_in_one_line."""
    def wrap(task):
        module = sys.modules[task.__module__]  # `python -m nmt.train` runs it as __main__: its spec has the name
        module_name = module.__spec__.name if getattr(module, "__spec__", None) else task.__module__
        tool = module_name.rpartition(".")[2]  # nmt.train -> train: the logger its errors go through
        @functools.wraps(task)
        def task_in_one_line(cfg):  # inside Hydra's main: Hydra reports an exception that reaches it with exit 1
            try:
                with ends_in_one_line(tool, interrupted):
                    return task(cfg)
            except SystemExit as ended:
                if ended.code == EXIT_USER_ERROR:
                    remove_refused_job_folder()
                if ended.code and multiprocessing.parent_process() is not None:
                    # a sweep's cell in a pool's worker (Hydra's joblib launcher): exiting would end the worker and
                    # the pool with it; an exception fails this cell alone, and the launcher names it
                    raise CellExited(f"exit {ended.code} (its line above says why)") from None
                raise

        # the folder by its absolute path: a relative one is resolved as a package, found only from the repository root
        hydra_main = hydra.main(version_base="1.3", config_path=str(CONFIGS), config_name=config_name)(task_in_one_line)

        @functools.wraps(task)
        def entry():
            args = sys.argv[1:]
            program = program_name(module_name)
            if (shell := completion_query(args)) is not None:
                answer_completion(config_name, schema, shell)
                sys.exit(0)
            if "--help" in args or "-h" in args:
                try:
                    print(help_text(config_name, schema, program, sys.modules[task.__module__].__doc__))
                    sys.stdout.flush()
                except BrokenPipeError:  # `--help | head`
                    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                sys.exit(0)
            if (error := flag_error(args, schema)) is not None:
                print(f"error: {error} ({program} --help lists the fields)", file=sys.stderr)
                sys.exit(EXIT_USER_ERROR)
            # a flag (--config-name, --cfg, -sc, ...): Hydra's own checks, as they are; a -m sweep: every value
            flags = [arg for arg in args if arg.startswith("-") or arg.startswith("hydra.mode=")]
            if all(flag in ("-m", "--multirun") for flag in flags):
                cells = sweep_checks(args)
                error = next(filter(None, (override_error(config_name, cell) for cell in cells)), None)
                if error is None and config_name == "train" and any(flag in ("-m", "--multirun") for flag in flags):
                    error = emulated_bf16_error(cells)
                if error is not None:
                    print(f"error: {error} ({program} --help lists the fields)", file=sys.stderr)
                    sys.exit(EXIT_USER_ERROR)
            sys.argv[1:] = hydra_run_dir(args)
            hydra_main()

        return entry

    return wrap
