"""Every command the docs show, run as written on a copy of the checkout, in one order: README.md, then docs/*.md
(sorted), then results/README.md, each doc top to bottom (a later command may need an earlier one's files, e.g. the
data and checkpoint of `make demo`). Commands are the lines of their ```sh blocks and the inline code spans that
start with a command and have arguments, read from the docs themselves: a command written tomorrow is run tomorrow.

Where a command trains, decodes or benchmarks, the rules below append the flags or overrides the command documents
to make it small (the last value of an option wins); commands that need a GPU, the hub, a cluster or hours are
skipped, each for its reason. Any other command runs exactly as written. A command fails the test on a non-zero
exit or on a traceback in its output, whatever its exit code. The fast tests check that every command has a plan,
that every relative Markdown link in the docs points to a file or folder that exists, and the README's length.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

COMMAND = re.compile(r"^(?:[A-Z_]+=\S+ )*(?:python|relnmt-(?:prepare|train|average|translate|score|export|experiment|table)\b|make|\.venv/bin/|sacrebleu|scripts/|echo |tensorboard|pip |\. )")
SMALL_TRAIN = ("train.max_steps=2 train.save_every_steps=2 train.valid_every=0 train.valid_bleu_sentences=0 "
               "train.score_lines=5")  # score_lines: a -m sweep's cells score 5 sentences
GPU = "needs GPUs (the paper's WMT14 recipes; tests/test_launch.py rehearses them at toy size)"
HUB = "downloads WMT14 from the Hugging Face hub (tests/test_launch.py prepares it from a local copy)"
HOURS = "hours on a CPU (its code runs at small size in tests/test_experiments.py)"
README_MAX_LINES = 250
LINK = re.compile(r"\[(?:[^\]]|\][^(])*\]\(([^)\s]+)\)")

# (pattern, what to do): "skip: why", "mention: why" (a name in prose, not a command to run), or text to append.
RULES = [
    (r"^make (test|test-all)$", "skip: the test suite this test belongs to"),
    (r"^make install$", "skip: the environment this test runs in (CI ran it first)"),
    (r"^\. \.venv/bin/activate$", "skip: changes the calling shell only (every command here runs in the venv)"),
    (r"^make demo", " UPDATES=4 LINES=10 DEMO_OUT=outputs/demo"),  # the folder the docs' later commands read
    (r"^make prepare-wmt14", f"skip: {HUB}"),
    (r"^make (train-base|train-big|ablate-k|ablate-kv)", f"skip: {GPU}"),
    (r"^make (decode|score) (CKPT|SRC|REF)=", f"skip: {GPU} and sacrebleu's newstest2014 download"),
    (r"^make train-\*$", "mention: the make train-* targets"),
    (r"^python -m torch.distributed.run --nnodes=2", "skip: several GPU nodes"),
    (r"^relnmt-train (-m )?model=base data=wmt14_en_de", f"skip: {HUB}; {GPU}"),
    (r"^relnmt-table multirun/base_wmt14_en_de", f"skip: reads the cells of make ablate-k ({GPU})"),
    (r"^(relnmt-train|python -m nmt.train)$", "mention: the command's name"),
    (r"^relnmt-(export|translate)$", "mention: the module's name"),
    (r"^python -m nmt\.\*$", "mention: the modules' names"),
    (r"^python -m nmt\.<(name|stage)>$", "mention: the modules' names"),
    (r"^relnmt-train model=<TAB>$", "mention: a line typed up to TAB (tests/test_commands.py asks the completion)"),
    (r"^relnmt-train (-m )?model\.", f" {SMALL_TRAIN}"),
    (r"^relnmt-train model=tiny data=local .* train.output_dir=outputs/my_en_fr$",
     " train.max_steps=10 train.save_every_steps=2 train.valid_every=0 train.valid_bleu_sentences=0"),
    (r"^python -m torch.distributed.run --standalone --nproc_per_node=8 -m nmt.train model=base data=local",
     f"skip: {GPU}, on the user's own corpus"),
    # a whole test set from a model of a few updates: greedy and short, the search is tested elsewhere
    (r"^relnmt-translate checkpoint=outputs/(my_en_fr/last5.pt|tiny_multi30k_en_de/last3.pt|demo_shared/ct2|demo/averaged.pt)"
     r" input=",
     " beam=1 max_extra=5"),
    (r"^relnmt-train model=tiny data=local .* train.output_dir=outputs/my_en_fr.no_av train.score=true",
     " train.max_steps=4 train.save_every_steps=2 train.valid_every=0 train.valid_bleu_sentences=0"
     " train.score_lines=10"),
    (r"^relnmt-train model=tiny data=multi30k_en_de \+experiment=demo train.keep_last=5$",  # validated once: best
     " train.max_steps=6 train.save_every_steps=2 train.valid_every=6 train.valid_bleu_sentences=0"),
    (r"^relnmt-train model=tiny data=multi30k_en_de \+experiment=demo train.init_from=",
     " train.max_steps=4 train.save_every_steps=2 train.valid_every=2 train.valid_bleu_sentences=0"),
    (r"^relnmt-train model=tiny data=local data.train=corpus/dogs/train .* train.init_from=outputs/demo/averaged.pt ",
     " train.max_steps=4 train.save_every_steps=2 train.valid_every=2 train.valid_bleu_sentences=0 train.score_lines=10"),
    (r"^relnmt-prepare \.\.\. force=true$", "replace: relnmt-prepare data=multi30k_en_de force=true"),
    (r"^python -m nmt.kernels.resources$", ' --arch 90 --only "bfloat16 D=64 R=15 decode" --jobs 2'),
    (r"^python -m pytest ", "skip: part of the suite this test belongs to"),
    (r"^TRITON_INTERPRET=1 python -m benchmarks.attention --memory-only",
     "skip: about 5 minutes in Triton's interpreter (tests/test_kernels.py checks the kernel it measures)"),
    (r"^python -m benchmarks.attention", " --repeats 1 --model-repeats 1"),
    (r"^python -m benchmarks.train_parts", " --repeats 1 --threads 1 --max-tokens 1024 --output outputs/parts_test.json"),
    (r"^python -m benchmarks.train( |$)", " --steps 1 --rounds 1 --presets tiny --max-tokens 1024"),
    (r"^python -m benchmarks\.decode( |$)", " --sentences 20 --repeats 1"),
    (r"^python -m benchmarks.data$", " --pairs 20000"),
    (r"^python -m benchmarks.prepare$", " --pairs 2000 --vocab-size 500 --output outputs/bench_prepare_test.json"),
    (r"^python -m benchmarks.prepare --pairs \d+$",
     "skip: the record's WMT-size run, about 15 minutes; the command above runs the same code at small size"),
    (r"^python -m benchmarks.checkpoint_disk$", " --presets base --vocab-size 1000"),
    (r"^relnmt-train -m \+study=table3 ", "replace: relnmt-train -m +study=table3 +ablation=value,neither "
     "train.seed=3 hydra.sweep.dir=outputs/study_test train.max_steps=2 train.save_every_steps=1 train.valid_every=0 "
     "train.score_lines=3 train.precision=fp32"),  # not the page's cells; a precision chosen: any CPU
    (r"^relnmt-train -m \+study=", "skip: the study path, run above at small size (+study=table3); every study composes "
     "here and for SLURM in tests/test_studies.py"),
    (r"^relnmt-table results/README.md$", "skip: make plots, which runs before it, runs this very command"),
    (r"^make plots$", " SAMPLES=100"),
    (r"^python -m experiments.reach --report", ""),
    (r"^python -m experiments.extrapolate --report", ""),
    (r"^python -m experiments.extrapolate --task repeat( |$)", " --modes relative:2 none --seeds 1 --layers 1 --updates 5"
     " --jobs 1 --output outputs/extrapolate_repeat_test"),
    (r"^python -m experiments.extrapolate",
     " --modes relative:2 none --seeds 1 --layers 1 --updates 5 --jobs 1 --output outputs/extrapolate_test"),
    (r"^python -m experiments.edge_values --report", ""),
    (r"^python -m experiments.edge_values", " --seeds 1 --updates 5 --jobs 1 --output outputs/edge_values_test"),
    (r"^python -m experiments.length_positions --rows", "skip: reads make length-study's checkpoints (hours on a CPU)"),
    (r"^python -m experiments.reach", " --layers 1 --clips 3 --seeds 9 --updates 5 --jobs 1"),
    (r"^python -m benchmarks.decode_cost", " --sentences 16 --steps 5 --repeats 1"),
    (r"^python -m benchmarks.chunked_loss", " --preset tiny --max-tokens 256 --repeats 1 --output outputs/chunked_loss_test.json"),
    (r"^python -m benchmarks.suite", "skip: installs a fresh clone and runs make test, this suite's own command"),
    (r"^python -m benchmarks.positions", " --repeats 1 --model-repeats 1 --sizes 32 64"),
    (r"^python -m benchmarks.decode_ratio", " --sentences 20 --repeats 1 --output outputs/decode_ratio_test.json"
     " --exports outputs/decode_ratio_test"),
    (r"^python -m benchmarks.translate_pools", " --lines 5 --repeats 1 --busy 1 --output outputs/translate_pools_test.json"),
    (r"^python -m benchmarks.decode_profile", " --sentences 20 --output outputs/decode_profile_test.json"),
    (r"^python -m benchmarks.deploy",
     " --sentences 20 --repeats 1 --threads 1 --output outputs/bench_deploy_test --exports outputs/bench_deploy_test"),
    (r"^python scripts/demo.py", " --updates 4 --lines 10"),
    (r"^make (table1|table2|table3|beyond|descendants|lr_check|length-study)", f"skip: {HOURS}"),
    (r"^python -m experiments.plot_attention_distance results/cells/", "skip: needs the cells' checkpoints (relnmt-train -m "
     "+study=table2: hours; the committed cells hold no weights)"),
    (r"^relnmt-train model=tiny data=multi30k_en_de \+experiment=table1 .*train.output_dir=outputs/attention/",
     f" {SMALL_TRAIN}"),
    (r"^python -m experiments.plot_attention_distance --by-mode", " --sentences 20 --output outputs/attention_test.png"),
    (r"^tensorboard --logdir", "skip: a server that runs until stopped"),
    (r"^scripts/slurm_train.sh$", "skip: submits to SLURM"),
    (r"^scripts/gpu_check.sh( \[OUT\])?$", "skip: needs a GPU (tests/test_gpu_check.py runs its --dry-run)"),
    (r"^scripts/gpu_check.sh --dry-run", "skip: tests/test_gpu_check.py runs it"),
    (r"^pip install", "skip: installs into the environment (an optional extra or reference)"),
]


def readme_commands(text: str) -> list[str]:
    """The README's commands in order, each once: ```sh block lines (comments cut) and inline command spans (read
    per paragraph, so a span wrapped over two lines is one command)."""
    commands, in_block, paragraph, fence = [], None, [], re.compile(r"^\s*```(\w*)")

    def inline_spans():
        spans = re.findall(r"`([^`]+)`", " ".join(paragraph))
        paragraph.clear()
        return [" ".join(span.split()) for span in spans if COMMAND.match(span.strip()) and " " in span.strip()]

    for line in text.splitlines():
        opened = fence.match(line)
        if opened:
            commands += inline_spans()
            in_block = None if in_block is not None else opened.group(1)
            continue
        if in_block == "sh":
            command = " ".join(re.sub(r"\s+#.*$", "", line).split())
            if COMMAND.match(command):
                commands.append(command)
        elif in_block is None:
            if line.strip():
                paragraph.append(line.strip())
            else:
                commands += inline_spans()
    commands += inline_spans()
    return list(dict.fromkeys(commands))


def plan(command: str) -> tuple[str, str]:
    """("run", the command as it runs) or ("skip" | "mention", why)."""
    for pattern, action in RULES:
        if re.search(pattern, command):
            if action.startswith(("skip: ", "mention: ")):
                kind, why = action.split(": ", 1)
                return kind, why
            if action.startswith("replace: "):
                return "run", action.removeprefix("replace: ")
            return "run", command + action
    return "run", command


def doc_paths(root: Path) -> list[Path]:
    """The docs whose commands run, in their order: README.md, docs/*.md (sorted), results/README.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "results" / "README.md"]


def all_commands(root: Path) -> list[str]:
    """Every doc's commands in one ordered list, each once (its first place)."""
    commands = [command for path in doc_paths(root) for command in readme_commands(path.read_text())]
    return list(dict.fromkeys(commands))


def test_every_readme_command_has_a_plan_and_the_known_ones_are_found():
    commands = all_commands(ROOT)
    for wanted in ("make demo", "relnmt-train -m model.clip=0,1,2,4,16,64,256",
                   "relnmt-train model.rel_value=false", "python -m experiments.param_count",
                   "sacrebleu prepared/multi30k_en_de/test.de -i results/demo/test.hyp.de", "make demo UPDATES=400",
                   "make train-smoke", "python -m nmt.kernels.resources", "python -m benchmarks.checkpoint_disk",
                   "relnmt-export checkpoint=outputs/demo_shared/averaged.pt output=outputs/demo_shared/ct2",
                   "python -m benchmarks.data", "relnmt-table results/README.md",
                   "make plots", "python -m experiments.reach --report"):
        assert wanted in commands, wanted
    for command in commands:
        kind, what = plan(command)
        assert kind in ("run", "skip", "mention") and what, command
    assert commands.index("make demo") < commands.index(
        "sacrebleu prepared/multi30k_en_de/test.de -i results/demo/test.hyp.de") < commands.index("make plots")
    assert plan("make demo UPDATES=400") == ("run", "make demo UPDATES=400 UPDATES=4 LINES=10 DEMO_OUT=outputs/demo")
    assert plan("make train-base")[0] == "skip" and plan("python -m experiments.param_count")[0] == "run"
    assert plan("scripts/gpu_wheels.sh") == ("run", "scripts/gpu_wheels.sh")  # the package index is reachable


def test_every_relative_link_in_the_docs_exists():
    """[text](path) and ![alt](path) in README.md, docs/*.md and results/README.md, outside code blocks: each path,
    relative to its doc, names a file or folder of the checkout (http(s) links and #anchors are not checked)."""
    missing = []
    for path in doc_paths(ROOT):
        text = re.sub(r"(?ms)^\s*```.*?^\s*```", "", path.read_text())
        for target in LINK.findall(text):
            if re.match(r"^(https?:|mailto:|#)", target):
                continue
            file = target.split("#", 1)[0]
            if not (path.parent / file).exists():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
    assert not missing, missing
    assert len(doc_paths(ROOT)) >= 7 and all(p.exists() for p in doc_paths(ROOT))


def test_readme_has_at_most_250_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the detail goes to docs/ or results/README.md"


def checkout_copy(tmp_path: Path) -> Path:
    """The tracked and untracked-but-not-ignored files, mtimes kept (make must find .venv up to date)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    copy = tmp_path / "checkout"
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, copy / name)
    venv = (ROOT / ".venv").resolve() if (ROOT / ".venv").exists() else Path(sys.prefix)
    (copy / ".venv").symlink_to(venv)
    stamp = venv / "installed"
    if stamp.exists():  # the environment is this one, installed: make must not rebuild it for a newer pyproject
        os.utime(copy / "pyproject.toml", (stamp.stat().st_mtime - 1,) * 2)
    return copy


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path):
    copy = checkout_copy(tmp_path)
    venv_bin = copy / ".venv" / "bin"
    env = {**os.environ, "PYTHONPATH": str(copy), "PATH": f"{venv_bin}:{os.environ['PATH']}"}
    env.pop("TRITON_INTERPRET", None)  # as a user's shell has it
    ran, skipped, failed = [], [], []
    for command in all_commands(copy):
        kind, what = plan(command)
        if kind != "run":
            skipped.append((command, what))
            continue
        try:
            done = subprocess.run(["bash", "-c", what], cwd=copy, env=env, capture_output=True, text=True,
                                  timeout=900, check=False)
        except subprocess.TimeoutExpired as late:  # named with the others: the rest still run
            failed.append(f"doc command ran past 900 s: {command}\nran: {what}\n{str(late.output or '')[-3000:]}")
            continue
        output = done.stdout + done.stderr
        if done.returncode != 0 or "Traceback (most recent call last)" in output:  # the rest still run: CI names all
            failed.append(f"doc command failed: {command}\nran: {what}\nexit {done.returncode}\n{output[-3000:]}")
        ran.append(command)
    assert not failed, "\n\n".join(failed)
    assert len(ran) >= 20, ran
    print(f"ran {len(ran)} doc commands; skipped {len(skipped)}:", *(f"  {c}: {w}" for c, w in skipped), sep="\n")


HISTORY = re.compile(r"(?i)\bissue \d+|\bissue's|\bsessions?\b|\btoday\b|tried once|\b(?:older|later|earlier|newer) "
                     r"(?:version|code|decoder)|issue author|\bno longer\b|\bused to\b")


def test_the_docs_state_facts_not_their_history():
    """A doc says what is, with dates where a figure needs one; who changed what when is the git log's. (A grep is
    no proof of absence: it catches the words that gave history away before.)"""
    docs = [*doc_paths(ROOT), *sorted((ROOT / "results").glob("*/README.md"))]
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}" for path in docs
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if HISTORY.search(line)]
    assert not found, found
