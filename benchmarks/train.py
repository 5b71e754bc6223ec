"""Training throughput: tokens/s and peak memory per preset, relative vs absolute positions.

    python -m benchmarks.train [--steps 30] [--device cpu|cuda] [--precision fp32|bf16] [--compile]
        [--presets tiny base big] [--max-tokens 4096] [--peak-tflops 989]

Each (preset, position) trains in its own process (so peak RSS / CUDA peak memory is its own) on
real Multi30k batches of --max-tokens with Adam, through nmt.train's own Trainer: first the isolated
step (forward, loss, backward, Adam on batches already on the device; median step time), then the
trainer's `update` over its own prefetched batch stream (host syncs, accumulation and bookkeeping
included), so "trainer/step" shows what the loop around the step costs. The two positions of a preset
run alternately, `--rounds` times (medians over rounds). FLOPs per step are counted once with
torch.utils.flop_counter (forward + backward of one real batch); achieved TFLOP/s is that over the
median step time, and MFU that over --peak-tflops (the accelerator's dense bf16 peak; H100/H200: 989).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import write_report
from nmt.modes import Position

ROOT = Path(__file__).resolve().parent.parent


def measure(preset: str, position: str, steps: int, device: str, precision: str, max_tokens: int,
            compile_model: bool, threads: int = 0) -> dict:
    """Median step time of the model alone, then the trainer's own updates over its own batch stream."""
    import tempfile

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from nmt.data.batching import Prefetcher, training_stream
    from nmt.compose import compose_job
    from nmt.runtime.process import setup_env
    from nmt.training.trainer import Trainer, check_attention

    job, _ = compose_job([f"model={preset}", "data=multi30k_en_de", f"model.position={position}",
                          f"train.device={device}", f"train.precision={precision}", f"train.max_tokens={max_tokens}",
                          "train.update_freq=1", f"train.compile={str(compile_model).lower()}", "train.seed=0",
                          f"train.max_steps={10 * steps}", f"train.threads={threads}",
                          f"train.output_dir={tempfile.mkdtemp()}"])
    from nmt.kernels.dispatch import TRITON_INSTALLED

    if TRITON_INSTALLED:  # the fused op's FLOP formula, registered before the counter copies the registry
        import nmt.kernels.relative_attention  # noqa: F401

    trainer = Trainer(job, setup_env(job.train.device, job.train.threads))  # CPU: its threads and heap settings
    check_attention(trainer.attention, trainer.job.model, trainer.amp_dtype, trainer.env.device)  # as nmt.train does
    dev = trainer.env.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)  # several configurations may run in one process (the GPU check)
    stream = Prefetcher(training_stream(trainer.data.train, job.train.max_tokens, job.train.seed, 0, 1, 0, 0), depth=2,
                        pin_memory=dev.type == "cuda")

    # (1) the isolated step: batches already on the device, no data, no bookkeeping
    batches = [trainer.next_micro_batches(stream)[0].to(dev) for _ in range(steps + 3)]
    with FlopCounterMode(display=False) as counter:
        trainer.forward_loss(trainer.model, batches[0])[0].backward()
    trainer.optimizer.zero_grad(set_to_none=True)
    times, tokens = [], 0
    for i, batch in enumerate(batches):
        sync()
        start = time.perf_counter()
        loss, _ = trainer.forward_loss(trainer.train_model, batch)
        loss.backward()
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        sync()
        if i >= 3:  # warm-up (and, compiled, the compilation)
            times.append(time.perf_counter() - start)
            tokens += batch.target_tokens
    step = statistics.median(times)
    peak = (torch.cuda.max_memory_allocated() / 2**20 if dev.type == "cuda"
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

    # (2) the trainer's update over its prefetched stream: what a run pays per update, host syncs included
    for _ in range(3):
        trainer.train_step(trainer.next_micro_batches(stream), False)
    sync()
    start, trainer_tokens = time.perf_counter(), 0
    for _ in range(steps):
        trainer_tokens += trainer.train_step(trainer.next_micro_batches(stream), False).tokens
    sync()
    trainer_seconds = time.perf_counter() - start
    syncs = host_syncs_per_update(trainer, stream) if dev.type == "cuda" else None
    stream.close()
    flops = counter.get_total_flops() / 1e12
    return {"step_s": step, "target_tokens_per_s": tokens / sum(times), "peak_mib": peak,
            "tflops_per_step": flops, "tflop_s": flops / step,
            "tflops_per_target_token": flops / batches[0].target_tokens,
            "trainer_update_s": trainer_seconds / steps, "trainer_tokens_per_s": trainer_tokens / trainer_seconds,
            "host_syncs_per_update": syncs}


def host_syncs_per_update(trainer, stream, updates: int = 3) -> float:
    """CUDA's count of synchronizing calls (torch.cuda.set_sync_debug_mode) over a few of the trainer's updates."""
    import warnings

    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(updates):
                trainer.train_step(trainer.next_micro_batches(stream), False)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught) / updates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--presets", nargs="+", default=["tiny", "base"])
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch (25000: the paper's per update)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model (dynamic shapes)")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="dense bf16 peak for MFU; 0 = no MFU")
    parser.add_argument("--output", default="results/bench_train.json")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(*args.worker, args.steps, args.device, args.precision, args.max_tokens,
                                 args.compile)))
        return
    report = {"args": vars(args), "rows": []}
    print(f"{args.device} {args.precision}{' compiled' if args.compile else ''}, {args.steps} steps x "
          f"{args.rounds} rounds, max_tokens {args.max_tokens}")
    print("preset  position   step s   target tok/s   peak MiB   TFLOP/s    MFU   trainer tok/s  trainer/step")
    for preset in args.presets:
        runs = {Position.relative.value: [], Position.absolute.value: []}
        for _ in range(args.rounds):
            for position in runs:
                done = subprocess.run([sys.executable, "-m", "benchmarks.train", "--worker", preset, position, "--steps",
                                       str(args.steps), "--device", args.device, "--precision", args.precision,
                                       "--max-tokens", str(args.max_tokens), *(["--compile"] if args.compile else [])],
                                      cwd=ROOT, capture_output=True, text=True)
                if done.returncode != 0:  # one failing configuration costs its row, not the report
                    error = (done.stderr.strip().splitlines() or ["no output"])[-1]
                    print(f"{preset} {position}: worker failed (exit {done.returncode}): {error}", flush=True)
                    report["rows"].append({"preset": preset, "position": position, "error": error})
                    continue
                runs[position].append(json.loads(done.stdout.strip().splitlines()[-1]))
        if not all(runs.values()):
            continue
        summary = {}
        for position, results in runs.items():
            summary[position] = {key: statistics.median(r[key] for r in results) for key in results[0]
                                 if results[0][key] is not None}
            s = summary[position]
            if args.peak_tflops:
                s["mfu"] = s["tflop_s"] / args.peak_tflops
            print(f"{preset:6s}  {position:9s} {s['step_s']:7.3f} {s['target_tokens_per_s']:13.0f} "
                  f"{s['peak_mib']:10.0f} {s['tflop_s']:9.2f} {s.get('mfu', float('nan')):6.1%} "
                  f"{s['trainer_tokens_per_s']:14.0f} {s['trainer_tokens_per_s'] / s['target_tokens_per_s']:12.3f}")
        relative, absolute = summary[Position.relative.value], summary[Position.absolute.value]
        ratio, memory = relative["step_s"] / absolute["step_s"], relative["peak_mib"] / absolute["peak_mib"]
        print(f"{preset:6s}  relative/absolute: time {ratio:.3f}, peak memory {memory:.3f}")
        report["rows"].append({"preset": preset, **summary, "time_ratio": ratio, "memory_ratio": memory})
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        write_report(args.output, report)  # each preset's rows as they exist
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
