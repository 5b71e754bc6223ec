"""The GPU check's driver: every open GPU question in one call, within 8 minutes on one H200 (scripts/gpu_check.sh).

    python -m benchmarks.gpu_check [--dry-run] [--output OUT] [--only STAGE ...]

Stages run in the order of what their answers are worth, each in its own process group under its own time limit
(STAGES: the limit and what it was sized from). A stage records each answer the moment it exists
(benchmarks/gpu_stages.py); a stage that raises or runs out of time is recorded with its error or its time, keeps the
answers it had, and the next stage runs. After every stage OUT is rewritten whole, so a kill at any point leaves
every finished answer behind, in four files (the device tool brings back at most eight):

    OUT/summary.md       what a person reads first: one line per stage, the targets, what could not be done
    OUT/answers.json     every answer, by stage, with each stage's status, seconds and limit
    OUT/log.txt          every stage's output, as it was printed (unbuffered)
    OUT/archive.tar.gz   the stages' own files: JSON per stage, the trainer's train.log and config.yaml, the kernel
                         resource table

--dry-run runs every stage's code on the CPU at tiny sizes (the kernel through Triton's interpreter), in about
two minutes: what CI runs, so the harness cannot rot before the next GPU meets it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from nmt.outputs import write_json

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_FILES = ("summary.md", "answers.json", "log.txt", "archive.tar.gz")


@dataclass(frozen=True)
class Stage:
    name: str
    limit_s: int  # on one H200 with 16 CPU cores
    basis: str  # the counted work the limit was sized from
    question: str


# The limits add up to 480 s. Basis figures: a process start with torch + CUDA, about 8 s; a cold Triton compile of
# one kernel variant, about 1 s (three kernels per case, 24 cases for base: the self-test); a cold inductor compile
# of base for training, 40-60 s; a base update at 25k tokens, about 0.1 s.
STAGES = (
    Stage("inputs", 20, "1 process start + imports; a Multi30k prepare if absent (about 5 s on 16 cores)",
          "wheels importable, versions, device, prepared data"),
    Stage("kernel", 85, "1 process; 24 base cases self-tested cold (about 75 compiles) + 7 forced layer cases",
          "kernel vs the PyTorch path on CUDA: heads 64/128/256 in bf16 and fp32, B*H > 65,535, a bf16 base "
          "step through auto vs torch, the self-test verdicts, registers and spills as the driver reports them"),
    Stage("trainer", 110, "2 process starts, self-test from the disk cache, 1 inductor compile, 150 base updates",
          "the real trainer (python -m nmt.train, base, relative, compiled): target tokens/s"),
    Stage("layer", 45, "1 process; 3 lengths x 3 layers x 30 timed repeats of about 5 ms; 2 lengths x 5 modes x 20; "
          "2 base models under the memory-efficient kernel only",
          "one attention layer: fused kernel vs the PyTorch path vs SDPA, forward + backward; every position mode "
          "vs SDPA; t5 and alibi on SDPA's memory-efficient kernel"),
    Stage("step", 125, "1 process; 2 eager + 2 compiled base configurations (2 inductor compiles), 20+20 steps "
          "each, host syncs counted; then t5, alibi, rope eager, 10+10 steps each",
          "base training step relative / absolute, eager and compiled; MFU; host syncs per update; the "
          "descendants' eager step / absolute"),
    Stage("decode", 35, "1 process; greedy + beam 4 on 500 sentences in fp32 and in bf16, 50 cached steps",
          "decoding fp32 vs bf16 autocast (what translate precision=auto picks on a GPU)"),
    Stage("tests", 35, "1 pytest process; the kernel and attention tests compiled for CUDA",
          "the kernel and attention test files on CUDA"),
    Stage("resources", 25, "96 kernel compiles over 16 processes (ptxas)",
          "registers, spills and shared memory on this machine's triton"),
)


def run_stage(argv: list[str], limit_s: float, log, env: dict | None = None) -> tuple[str, float, str | None]:
    """Run argv in a process group of its own, its output appended to `log` as it comes; kill the whole group
    (the trainer's own child processes included) at the limit. (status, seconds, error): ok | failed | timeout."""
    start = time.monotonic()
    process = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        code = process.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return "timeout", time.monotonic() - start, f"stopped at its limit of {limit_s:.0f} s"
    seconds = time.monotonic() - start
    return ("ok", seconds, None) if code == 0 else ("failed", seconds, f"exit code {code}")


def stage_error(answers: dict, fallback: str | None) -> str | None:
    """The stage's own last error line (recorded by gpu_stages), else what the driver saw."""
    return answers.get("error") or fallback


def targets(results: dict) -> list[str]:
    """The issue's targets on one H200, against what the stages answered."""
    def answer(stage, key, default=None):
        return results.get(stage, {}).get("answers", {}).get(key, default)

    def verdict(ok: bool) -> str:
        return "met" if ok else "NOT met"

    lines = []
    layers = [answer("layer", f"n={n}", {}) for n in (48, 96, 192)]
    ratios = [row["ours_over_sdpa"] for row in layers if "ours_over_sdpa" in row]
    lines.append("layer <= 1.25x SDPA (goal 1.15): " + (
        f"{', '.join(f'{r:.2f}' for r in ratios)}: {verdict(max(ratios) <= 1.25)}" if ratios else "no answer"))
    for mode in ("eager", "compiled"):
        ratio = answer("step", f"relative_over_absolute_{mode}")
        lines.append(f"base step relative/absolute {mode} <= 1.10 (goal 1.05): "
                     + (f"{ratio:.3f}: {verdict(ratio <= 1.10)}" if ratio else "no answer"))
    rate = answer("trainer", "target_tokens_per_s")
    lines.append("the real trainer >= 300k target tokens/s: "
                 + (f"{rate:,.0f}: {verdict(rate >= 300_000)}" if rate else "no answer"))
    speeds = [(answer("decode", p, {}).get("beam4") or {}).get("sentences_per_s") for p in ("fp32", "bf16")]
    lines.append("decoding bf16 faster than fp32 (beam 4): "
                 + (f"{speeds[1]} vs {speeds[0]} sentences/s: {verdict(speeds[1] > speeds[0])}" if all(speeds)
                    else "no answer"))
    return lines


def summary(meta: dict, results: dict) -> str:
    lines = [f"# GPU check {'(dry run, CPU) ' if meta['dry_run'] else ''}{meta['started']}", "",
             f"`{meta['command']}`: stage limits {sum(s.limit_s for s in STAGES)} s in all "
             f"(basis in benchmarks/gpu_check.py)", "",
             "| stage | status | seconds (limit) | answer |", "|---|---|---|---|"]
    for stage in STAGES:
        result = results.get(stage.name)
        if result is None:
            lines.append(f"| {stage.name} | not run | - ({stage.limit_s}) | {stage.question} |")
            continue
        status = result["status"] + (f": {result['error']}" if result.get("error") else "")
        headline = result["answers"].get("headline", "")
        lines.append(f"| {stage.name} | {status} | {result['seconds']:.0f} ({result['limit_s']}) | {headline} |")
    lines += ["", "## Targets (one H200)" + (": a dry run's figures are the CPU's, at tiny sizes; they judge nothing"
                                             if meta["dry_run"] else ""), ""] + [f"- {line}" for line in targets(results)]
    missing = [f"- {name}: {result['status']}: {result.get('error')} ({result['answers'].get('headline', '')})"
               for name, result in results.items() if result["status"] != "ok"]
    missing += [f"- {name}: {why}" for name, result in results.items()
                for why in result["answers"].get("not_done", [])]
    lines += ["", "## Not answered", ""] + (missing or ["- nothing: every stage ran to its end"])
    return "\n".join(lines) + "\n"


def pack(out: Path, work: Path) -> None:
    """The stages' own small files into one archive (checkpoints and compile caches stay out)."""
    tmp = out / ".archive.tar.gz.tmp"
    with tarfile.open(tmp, "w:gz") as archive:
        for path in sorted(work.rglob("*")):
            if path.is_file() and path.suffix not in (".pt", ".tmp") and "cache" not in path.parts \
                    and "tensorboard" not in path.parts and path.stat().st_size < 4 << 20:
                archive.add(path, arcname=str(path.relative_to(work)))
    tmp.replace(out / "archive.tar.gz")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="every stage on the CPU at tiny sizes (CI)")
    parser.add_argument("--output", type=Path, default=ROOT / "results" / "gpu")
    parser.add_argument("--work", type=Path, help="scratch folder (default: OUT/../<OUT name>.work)")
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STAGES], help="run these stages only")
    args = parser.parse_args(argv)
    out = args.output.resolve()
    work = (args.work or out.parent / f".{out.name}.work").resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES:  # a previous run's answers must not pass for this one's
        (out / name).unlink(missing_ok=True)
    meta = {"started": datetime.datetime.now().isoformat(timespec="seconds"), "dry_run": args.dry_run,
            "command": " ".join(["scripts/gpu_check.sh", *(["--dry-run"] if args.dry_run else []), str(args.output)])}
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TRITON_CACHE_DIR": str(work / "triton_cache")}
    if args.dry_run:  # one thread: two cores shared with whatever else runs (a test suite) stay usable
        env.update(TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    results: dict = {}
    with open(out / "log.txt", "a", buffering=1) as log:
        for stage in STAGES:
            if args.only and stage.name not in args.only:
                continue
            print(f"== {stage.name} (limit {stage.limit_s} s, {datetime.datetime.now():%H:%M:%S}): {stage.question}",
                  file=log, flush=True)
            print(f"== {stage.name} ...", flush=True)
            answers_file = work / f"{stage.name}.json"
            answers_file.unlink(missing_ok=True)
            limit = stage.limit_s * (3 if args.dry_run else 1)  # 2 CPU cores in the interpreter
            argv = [sys.executable, "-m", "benchmarks.gpu_stages", stage.name, "--work", str(work),
                    *(["--dry-run"] if args.dry_run else [])]
            status, seconds, error = run_stage(argv, limit, log, env)
            answers = json.loads(answers_file.read_text()) if answers_file.is_file() else {}
            results[stage.name] = {"status": status, "seconds": round(seconds, 1), "limit_s": limit,
                                   "error": stage_error(answers, error), "answers": answers}
            print(f"   {status} in {seconds:.0f} s{': ' + results[stage.name]['error'] if status != 'ok' else ''}",
                  flush=True)
            write_json(out / "answers.json", {"meta": meta, "stages": results}, indent=1)
            (out / "summary.md").write_text(summary(meta, results))
            pack(out, work)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
