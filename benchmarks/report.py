"""The one writer of a benchmark's JSON report: the measured numbers, plus the command that produced them, the date
and the machine they were measured on (nmt.machine.host: CPU family/model/stepping and kernel flags), written whole
or not at all."""

from __future__ import annotations

import datetime
import shlex
import sys
from pathlib import Path

from nmt.machine import host
from nmt.outputs import write_json


def invoked_command() -> str:
    """`python -m benchmarks.NAME ARGS...` as this process was started."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([program, shlex.join(sys.argv[1:])]).strip()


def write_report(path: Path | str, report: dict, indent: int = 2) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**report, "command": report.get("command") or invoked_command(), "host": host(),
              "date": datetime.date.today().isoformat()}
    write_json(path, record, indent)
