"""The times a new user meets before any model: `make install` on a fresh clone, `make test`, and with --all
`make test-all` (what CI runs), each measured on a clean clone of this checkout's HEAD, alone on the machine.

    python -m benchmarks.suite [--all] [--output results/suite.json]

The clone gets its own .venv (pip installs from the package index or its cache, as a user's would), so the
install time includes that. Writes the record with the command, date and machine (benchmarks.report)."""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.report import write_report

ROOT = Path(__file__).resolve().parent.parent


def timed(command: list[str], cwd: Path) -> dict:
    """Wall seconds and exit code of one command, its output's last line (pytest's summary)."""
    start = time.monotonic()
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    lines = (done.stdout + done.stderr).strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]  # pytest's short summary (-rfE)
    return {"command": " ".join(command), "seconds": round(time.monotonic() - start, 1), "exit": done.returncode,
            "last_line": lines[-1] if lines else "", **({"failed": failed} if failed else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--all", action="store_true", help="also make test-all (CI's command: about half an hour)")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "suite.json")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    report = {"commit": commit, "steps": []}
    with tempfile.TemporaryDirectory() as folder:
        clone = Path(folder) / "relnmt"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        for target in ["install", "test", *(["test-all"] if args.all else [])]:
            step = timed(["make", target], clone)
            report["steps"].append(step)
            print(f"make {target}: {step['seconds'] / 60:.1f} min, exit {step['exit']}: {step['last_line']}",
                  *step.get("failed", []), sep="\n", flush=True)
            if step["exit"] != 0:
                break
    write_report(args.output, report)


if __name__ == "__main__":
    main()
