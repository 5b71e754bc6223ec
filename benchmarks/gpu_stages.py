"""The GPU check's stages (benchmarks/gpu_check.py runs each in its own process, under its own limit):

    python -m benchmarks.gpu_stages STAGE --work DIR [--dry-run]

Each stage writes DIR/STAGE.json again after every answer, so a stage killed at its limit keeps what it had; one
question that raises is recorded with its error and the stage goes on. --dry-run: the same code on the CPU at tiny
sizes, the kernel through Triton's interpreter (TRITON_INTERPRET=1, set by the driver).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu_check import ROOT, write_json
from nmt.modes import Position

DESCENDANT_BIASES = tuple(p.value for p in (Position.t5, Position.alibi, Position.rope))  # Shaw's descendants

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, from the vendors' data sheets
MICRO_MODEL = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.heads=2",
               "model.ffn_dim=64", "model.clip=3"]  # the dry run's model: head size 16, what the interpreter tests use


def one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"[:300]


class Answers:
    """A stage's answers, on disk after every one."""

    def __init__(self, path: Path):
        self.path, self.values = path, {}

    def __setitem__(self, key: str, value) -> None:
        self.values[key] = value
        write_json(self.path, self.values)
        print(f"  {key}: {value}", flush=True)

    def __getitem__(self, key: str):
        return self.values[key]

    def attempt(self, key: str, question, *args):
        """The answer of question(*args), or its error: one failing question does not cost the others."""
        try:
            value = question(*args)
        except Exception as err:  # the point is to record what the device could not do
            value = {"error": one_line(err)}
            empty_cache()
        self[key] = value
        return value

    def not_done(self, why: str) -> None:
        self["not_done"] = [*self.values.get("not_done", []), why]


def empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def device_of(dry: bool):
    import torch

    if dry:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible (a GPU check needs one; --dry-run runs on the CPU)")
    return torch.device("cuda")


def python(*args: str, timeout: float | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """A child Python (nmt.train): its output goes to the stage's log as it comes."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, timeout=timeout, env=env)


def streamed(args: list[str], copy: Path, env: dict | None = None) -> tuple[int, list[str]]:
    """A child Python whose output goes to the stage's log line by line (kept if the stage is killed) and to
    `copy`; returns its exit code and its lines."""
    lines = []
    with open(copy, "w") as kept, subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, text=True,
                                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as child:
        for line in child.stdout:
            print(line, end="", flush=True)
            kept.write(line)
            kept.flush()
            lines.append(line.rstrip("\n"))
    return child.returncode, lines


# ---------------------------------------------------------------------------------------------------- inputs
REQUIRED = ("torch", "numpy", "yaml", "tqdm", "hydra", "omegaconf", "antlr4", "sentencepiece", "sacrebleu",
            "tensorboard", "triton")
OPTIONAL = ("sacremoses", "pytest")  # scoring (compound-split BLEU) and the tests stage


def inputs(a: Answers, dry: bool, work: Path) -> None:
    import platform

    modules = {}
    for name in (*REQUIRED, *OPTIONAL):
        try:
            modules[name] = getattr(importlib.import_module(name), "__version__", "present")
        except Exception as err:
            modules[name] = f"missing ({one_line(err)})"
    a["python"] = platform.python_version()
    a["modules"] = modules
    missing = [name for name in REQUIRED if modules[name].startswith("missing")]
    if missing:
        raise RuntimeError(f"not importable: {', '.join(missing)}: put their wheels in .whl/ "
                           "(scripts/gpu_wheels.sh on a machine with the package index) and carry it")
    for name in OPTIONAL:
        if modules[name].startswith("missing"):
            a.not_done(f"{name} is missing: the stage that needs it reports it (scripts/gpu_wheels.sh brings it)")
    import torch

    device = device_of(dry)
    a["device"] = describe(device)
    if not dry and shutil.which("nvidia-smi"):
        a["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout.strip()
    a["torch_cuda"] = torch.version.cuda
    a["prepared"] = prepared_data()
    a["headline"] = (f"{a['device']['name']}; torch {modules['torch']}, CUDA {torch.version.cuda}, triton "
                     f"{modules['triton']}; {'prepared data built' if a['prepared']['built'] else 'prepared data found'}")


def describe(device) -> dict:
    import os

    import torch

    if device.type == "cpu":
        from nmt.machine import machine

        return {"name": machine(device), "cores": os.cpu_count()}
    props = torch.cuda.get_device_properties(device)
    return {"name": props.name, "capability": f"sm_{props.major}{props.minor}", "memory_gib": round(
        props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count, "cpu_cores": os.cpu_count(),
        "native_bf16": torch.cuda.is_bf16_supported(including_emulation=False)}


def prepared_data() -> dict:
    """The bundled Multi30k prepared (it travels with the checkout; preparing takes seconds)."""
    from nmt.data.pipeline import prepare, prepared_dir
    from nmt.compose import preset_job

    data = preset_job("data=multi30k_en_de").data
    folder = prepared_dir(data)
    built = not (folder / "manifest.json").is_file()
    start = time.monotonic()
    prepare(data)  # a no-op when up to date
    return {"folder": str(folder), "built": built, "seconds": round(time.monotonic() - start, 1)}


# ---------------------------------------------------------------------------------------------------- kernel
def layer_against_torch_path(device, b, h, n, d, dtype, clip=16) -> dict:
    """Forward + backward forced through the kernel (attention=triton) and on the PyTorch path: the largest
    difference of the output and each gradient, relative to the PyTorch path's largest value."""
    import torch

    from nmt.kernels.dispatch import AttentionBackend
    from nmt.modeling.attention import relation_aware_attention

    g = torch.Generator(device=device).manual_seed(0)
    shapes = [(b, h, n, d)] * 3 + [(h, 2 * clip + 1, d)] * 2
    base = [torch.randn(*s, generator=g, device=device, dtype=torch.float32) for s in shapes]
    pad = torch.zeros(b, n, dtype=torch.bool, device=device)
    pad[0, n // 2:] = True
    results = {}
    for mode in ("triton", "torch"):
        leaves = [t.to(dtype).requires_grad_(True) for t in base]
        out = relation_aware_attention(*leaves, clip, key_padding_mask=pad, backend=AttentionBackend(mode))
        out.float().pow(2).sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        results[mode] = [out.detach().float()] + [t.grad.float() for t in leaves]
    names = ["out", "dq", "dk", "dv", "drk", "drv"]
    return {name: float((x - y).abs().max() / y.abs().max().clamp_min(1e-30))
            for name, x, y in zip(names, results["triton"], results["torch"])}


def training_step_against_torch_path(device, model_overrides: list[str], amp_dtype, backend_kwargs: dict,
                                     shape=(64, 40)) -> dict:
    """One training step through auto (self-checked: the kernel where its self-test passed) and through the
    PyTorch path, same weights and batch of `shape` (rows, source tokens): losses, the worst gradient difference
    relative to the largest gradient, the verdicts."""
    import torch

    from nmt.compose import preset_job
    from nmt.kernels.dispatch import AttentionBackend
    from nmt.modeling.transformer import Transformer, model_cases
    from nmt.runtime.precision import autocast

    cfg = preset_job(*model_overrides, "model.dropout=0.0").model
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, 8000, shape, generator=g).to(device)
    tgt = torch.randint(4, 8000, (shape[0], shape[1] + 1), generator=g).to(device)
    results, backends = {}, {}
    for mode in ("auto", "torch"):
        torch.manual_seed(0)
        backends[mode] = AttentionBackend(mode, **backend_kwargs)
        model = Transformer(cfg, 8000, backends[mode]).to(device)
        start = time.monotonic()
        backends[mode].check(model_cases(cfg, amp_dtype or torch.float32, device, training=True), device)
        check_seconds = time.monotonic() - start
        with autocast(device, amp_dtype):
            logits = model(src, tgt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tgt[:, 1:].flatten())
        loss.backward()
        results[mode] = (loss.item(), [p.grad.float() for p in model.parameters()], check_seconds)
    # against the largest gradient, not each tensor's own: a key bias's gradient is zero in exact arithmetic (the
    # softmax ignores a constant per row), so its own scale is rounding noise and a ratio of two noises says nothing
    scale = max(float(b.abs().max()) for b in results["torch"][1])
    worst = max(float((a - b).abs().max()) for a, b in zip(results["auto"][1], results["torch"][1])) / max(scale, 1e-30)
    verdicts = {str(case): ok for case, ok in backends["auto"].verdicts.items()}
    return {"loss_auto": results["auto"][0], "loss_torch": results["torch"][0], "worst_grad_rel_diff": worst,
            "self_test_seconds": round(results["auto"][2], 1), "cases": len(verdicts),
            "passed": sum(verdicts.values()), "verdicts": verdicts}


def compiled_kernels() -> list[dict]:
    """Registers, spills and shared memory of every kernel compiled so far, as the driver reports them."""
    from nmt.kernels import relative_attention_triton as device_code

    rows = []
    for name in ("forward_kernel", "backward_kv_kernel", "backward_q_kernel"):
        kernel = getattr(device_code, name)
        for cache in getattr(kernel, "device_caches", {}).values():
            for compiled in cache[0].values():
                try:
                    compiled._init_handles()
                    rows.append({"kernel": name, "registers": compiled.n_regs, "spills": compiled.n_spills,
                                 "shared": compiled.metadata.shared, "num_warps": compiled.metadata.num_warps})
                except Exception as err:  # e.g. over the shared-memory limit: it failed before, it fails again
                    rows.append({"kernel": name, "error": one_line(err)})
    return rows


def kernel(a: Answers, dry: bool, work: Path) -> None:
    import torch

    device = device_of(dry)
    if dry:  # the interpreter: head 16, fp32, small shapes
        layers = [(16, torch.float32, (2, 2, 20), 3)]
        grid = (3, 2, 4, 16)
        step = (MICRO_MODEL, None, dict(devices=("cpu",), dtypes=(torch.float32,), head_dims=(16,)), (8, 20))
    else:
        layers = [(d, dtype, (4, 8, 96), 16) for d in (64, 128, 256) for dtype in (torch.bfloat16, torch.float32)]
        grid = (8200, 8, 4, 64)  # B * H = 65,600 > 65,535: the grid's axis 0 (limit 2^31 - 1)
        step = (["model=base"], torch.bfloat16, {}, (64, 40))
    worst = []
    for d, dtype, (b, h, n), clip in layers:
        key = f"forced D={d} {str(dtype).removeprefix('torch.')}"
        result = a.attempt(key, layer_against_torch_path, device, b, h, n, d, dtype, clip)
        worst.append((key, result.get("error") or max(result.values())))
    a.attempt(f"grid B*H={grid[0] * grid[1]:,}", layer_against_torch_path, device, *grid, torch.bfloat16
              if not dry else torch.float32, 3)
    result = a.attempt("base step auto vs torch" if not dry else "micro step auto vs torch",
                       training_step_against_torch_path, device, *step)
    a["compiled_kernels"] = compiled_kernels() if not dry else []
    if dry:
        a.not_done("registers and spills as the driver reports them: the interpreter compiles nothing")
    ran = [f"{key.removeprefix('forced ')} {value if isinstance(value, str) else f'{value:.1e}'}"
           for key, value in worst]
    verdicts = (f"self-test {result['passed']}/{result['cases']} passed, worst grad diff "
                f"{result['worst_grad_rel_diff']:.1e}" if "cases" in result else f"step: {result.get('error')}")
    a["headline"] = f"forced kernel vs PyTorch path (worst rel. diff): {'; '.join(ran)}. {verdicts}"


# ---------------------------------------------------------------------------------------------------- trainer
TRAIN_LOG = re.compile(r"train update (\d+): .*tokens_per_s ([0-9.e+]+)")


def trainer(a: Answers, dry: bool, work: Path) -> None:
    out = work / "trainer_base"
    shutil.rmtree(out, ignore_errors=True)
    if dry:
        overrides = ["model=tiny", *MICRO_MODEL, "train.device=cpu", "train.precision=fp32", "train.max_tokens=1024",
                     "train.max_steps=4", "train.log_every=1", "train.compile=false", "train.threads=1"]
    else:  # the paper's batch in one micro-batch; compiled (the default on CUDA), bf16, the fused kernel under auto
        overrides = ["model=base", "train.device=cuda", "train.precision=bf16", "train.max_tokens=25000",
                     "train.max_steps=150", "train.log_every=25"]
    overrides += ["data=multi30k_en_de", "train.update_freq=1", "train.save_every_steps=100000", "train.valid_every=0",
                  "train.valid_bleu_sentences=0", "train.keep_last=1", f"train.output_dir={out}"]
    a["command"] = "python -m nmt.train " + " ".join(overrides)
    start = time.monotonic()
    done = python("-m", "nmt.train", *overrides)
    a["seconds"] = round(time.monotonic() - start, 1)
    a["exit_code"] = done.returncode
    log = (out / "train.log").read_text() if (out / "train.log").is_file() else ""
    windows = [(int(step), float(rate)) for step, rate in TRAIN_LOG.findall(log)]
    a["tokens_per_s_by_log_window"] = windows
    a["kernel_fallbacks"] = [line for line in log.splitlines() if "fused relative attention off" in line]
    steady = [rate for _, rate in windows[1:]] or [rate for _, rate in windows]  # the first window compiles
    if not steady:
        raise RuntimeError(f"no training log lines (exit code {done.returncode})")
    a["target_tokens_per_s"] = statistics.median(steady)
    a["headline"] = (f"{a['target_tokens_per_s']:,.0f} target tokens/s (median of the log windows after the first); "
                     f"{len(a['kernel_fallbacks'])} kernel fallbacks; exit {done.returncode}")
    if done.returncode != 0:
        raise RuntimeError(f"nmt.train exited {done.returncode}")


# ---------------------------------------------------------------------------------------------------- layer
def layer(a: Answers, dry: bool, work: Path) -> None:
    import torch

    from benchmarks import attention as bench
    from benchmarks import positions as modes
    from nmt.timing import time_interleaved

    device = device_of(dry)
    dtype = torch.float32 if dry else torch.bfloat16
    ratios = []
    for n in (48,) if dry else (48, 96, 192):  # the dry run: each code path once
        def measure(n=n):
            times = time_interleaved(bench.layer_steps(n, device, dtype, None), 1 if dry else 30, device,
                                     warmup=0 if dry else 2)  # the dry run's figures judge nothing: run each once
            row = {f"{name}_ms": round(t * 1e3, 3) for name, t in times.items()}
            row["ours_over_sdpa"] = times["ours_relative"] / times["sdpa"]
            if "ours_torch" in times:
                row["torch_path_over_sdpa"] = times["ours_torch"] / times["sdpa"]
                row["ours_over_torch_path"] = times["ours_relative"] / times["ours_torch"]
            return row

        row = a.attempt(f"n={n}", measure)
        if "ours_over_sdpa" in row:
            ratios.append(f"n={n} {row['ours_over_sdpa']:.2f}x SDPA"
                          + (f" (PyTorch path {row['torch_path_over_sdpa']:.2f}x)" if "torch_path_over_sdpa" in row
                             else ""))
    for n in (128,) if dry else (128, 512):  # every position mode's layer against SDPA (its positions built as a stack does)
        def measure_modes(n=n):
            times = time_interleaved(modes.layer_steps(n, device, dtype), 1 if dry else 20, device,
                                     warmup=0 if dry else 2)
            return {mode: times[mode] / times["sdpa"] for mode in times if mode != "sdpa"}

        row = a.attempt(f"modes n={n}", measure_modes)
        if Position.t5.value in row:
            ratios.append(f"n={n} modes/SDPA " + " ".join(f"{m} {r:.2f}" for m, r in row.items()))
    a.attempt("bias modes reach the memory-efficient kernel", efficient_kernel_reached, device, dry)
    a["headline"] = "layer fwd+bwd, d 512, 8 heads, k 16, 1,536 tokens: " + "; ".join(ratios)


def efficient_kernel_reached(device, dry: bool) -> dict:
    """t5 and alibi, forward + backward in bf16 with only SDPA's memory-efficient kernel allowed: an error where
    SDPA would have needed its math fallback. The dry run has no such kernel on a CPU: it runs the math path."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from nmt.compose import preset_job
    from nmt.modeling.transformer import Transformer

    allowed = [SDPBackend.MATH] if dry else [SDPBackend.EFFICIENT_ATTENTION]
    reached = {}
    for position in (Position.t5.value, Position.alibi.value):
        model = Transformer(preset_job("model=base", f"model.position={position}").model, 8000).to(device)
        src = torch.randint(4, 8000, (16, 37), device=device)
        src[3, 20:] = 0  # padding: the encoder's bias is (B, H, N, N)
        tgt = torch.randint(4, 8000, (16, 30), device=device)
        try:
            with sdpa_kernel(allowed), torch.autocast(device.type, torch.bfloat16):
                model(src, tgt).float().mean().backward()
            reached[position] = True
        except RuntimeError as err:
            reached[position] = one_line(err)
    return reached


# ---------------------------------------------------------------------------------------------------- step
def step(a: Answers, dry: bool, work: Path) -> None:
    import gc

    import torch

    from benchmarks import train as bench
    device = device_of(dry)
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in torch.cuda.get_device_name()), None) \
        if not dry else None
    preset, precision, tokens, steps = ("tiny", "fp32", 512, 2) if dry else ("base", "bf16", 25000, 20)
    configs = [(position, compiled) for compiled in (False, True) for position in (Position.relative.value, Position.absolute.value)]
    if dry:
        a.not_done("compiled configurations ran eager in the dry run (an inductor compile takes minutes on 2 cores)")
    rows = {}
    for position, compiled in configs:
        key = f"{preset} {position} {'compiled' if compiled else 'eager'}"
        row = a.attempt(key, bench.measure, preset, position, steps, device.type, precision, tokens,
                        compiled and not dry, 1 if dry else 0)
        if "step_s" in row and peak:
            row["mfu"] = row["tflop_s"] / peak
            row["trainer_mfu"] = row["trainer_tokens_per_s"] * row["tflops_per_target_token"] / peak
            a[key] = row
        rows[key] = row
        torch._dynamo.reset()  # a compiled model's graphs hold its memory
        gc.collect()
        empty_cache()
    for position in DESCENDANT_BIASES:  # Shaw's descendants, eager: last, so a stage at its limit loses only them
        row = a.attempt(f"{preset} {position} eager", bench.measure, preset, position, steps if dry else 10,
                        device.type, precision, tokens, False, 1 if dry else 0)
        absolute = rows.get(f"{preset} absolute eager", {})
        if "step_s" in row and "step_s" in absolute:
            a[f"{position}_over_absolute_eager"] = row["step_s"] / absolute["step_s"]
        empty_cache()
    parts = []
    for mode in ("eager", "compiled"):
        rel, ab = rows.get(f"{preset} relative {mode}", {}), rows.get(f"{preset} absolute {mode}", {})
        if "step_s" in rel and "step_s" in ab:
            a[f"relative_over_absolute_{mode}"] = rel["step_s"] / ab["step_s"]
            parts.append(f"{mode} rel/abs {rel['step_s'] / ab['step_s']:.3f} ({rel['step_s'] * 1e3:.0f} ms"
                         + (f", MFU {rel['mfu']:.0%}" if "mfu" in rel else "")
                         + (f", {rel['host_syncs_per_update']:g} host syncs/update"
                            if rel.get("host_syncs_per_update") is not None else "") + ")")
    parts += [f"{p}/abs eager {a.values[f'{p}_over_absolute_eager']:.3f}" for p in DESCENDANT_BIASES
              if f"{p}_over_absolute_eager" in a.values]
    a["headline"] = f"{preset} step at {tokens:,} tokens: " + "; ".join(parts)


# ---------------------------------------------------------------------------------------------------- decode
def decode(a: Answers, dry: bool, work: Path) -> None:
    import torch

    from benchmarks import decode as bench
    device = device_of(dry)
    checkpoints = sorted((work / "trainer_base").glob("checkpoint_[0-9]*.pt"))
    model, vocab, source = bench.load_model(str(checkpoints[-1]) if checkpoints else None, device,
                                            "tiny" if dry else "base")
    a["model"] = source
    lines = bench.test_sentences(16 if dry else 500)
    for name, dtype in (("fp32", None), ("bf16", torch.bfloat16)):
        a.attempt(name, bench.measure, model, vocab, lines, device, dtype, 1 if dry else 3)
    parts = []
    for mode in ("greedy", "beam4"):
        fp32, bf16 = a.values.get("fp32", {}).get(mode), a.values.get("bf16", {}).get(mode)
        if fp32 and bf16:
            parts.append(f"{mode} bf16/fp32 speed {bf16['sentences_per_s'] / fp32['sentences_per_s']:.2f}x "
                         f"({bf16['sentences_per_s']:.0f} vs {fp32['sentences_per_s']:.0f} sentences/s)")
    a["headline"] = f"{'; '.join(parts)}; model: {source}"


# ---------------------------------------------------------------------------------------------------- tests
def tests(a: Answers, dry: bool, work: Path) -> None:
    if importlib.util.find_spec("pytest") is None:
        raise RuntimeError("pytest is not importable: scripts/gpu_wheels.sh puts its wheels in .whl/")
    files = ["tests/test_kernels.py", "tests/test_attention.py", "tests/test_kernel_dispatch.py", "tests/test_positions.py"]
    select = ["-k", "flop_counter or literal_equations"] if dry else []
    code, lines = streamed(["-m", "pytest", "-p", "no:cacheprovider", "-rfE", "-v", *files, *select],
                           work / "pytest.txt")
    tail = next((line for line in reversed(lines) if line.strip()), "no output")
    a["result"] = tail
    a["failed"] = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    a["headline"] = f"{' '.join(files)}{' (a selection)' if dry else ''}: {tail}"
    if code != 0:
        raise RuntimeError(f"pytest: {tail}")


# ---------------------------------------------------------------------------------------------------- resources
def resources(a: Answers, dry: bool, work: Path) -> None:
    import os

    from nmt.kernels.resources import nvidia_backend_available

    if not nvidia_backend_available():
        raise RuntimeError("this triton has no nvidia backend with ptxas")
    args = ["--arch", "90", "--only", "bfloat16 D=64 R=15 decode", "--jobs", "1"] if dry else \
        ["--jobs", str(os.cpu_count() or 1)]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # ptxas, not the interpreter
    code, lines = streamed(["-m", "nmt.kernels.resources", *args, "--output", str(work / "kernel_resources.json")],
                           work / "kernel_resources.txt", env)
    tail = next((line for line in reversed(lines) if line.strip()), "no output")
    a["result"] = tail
    a["headline"] = tail
    if code != 0:
        raise RuntimeError(tail)


STAGES = {f.__name__: f for f in (inputs, kernel, trainer, layer, step, decode, tests, resources)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=list(STAGES))
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    answers = Answers(args.work / f"{args.stage}.json")
    try:
        STAGES[args.stage](answers, args.dry_run, args.work)
    except Exception as err:
        import traceback

        traceback.print_exc()
        answers["error"] = one_line(err)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
