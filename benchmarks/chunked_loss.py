"""A `base` update's peak memory and time with the whole logits, with the chunked output layer and loss, and with
the layers' activations recomputed in the backward as well.

    python -m benchmarks.chunked_loss [--device cpu|cuda] [--precision fp32|bf16]
        [--variants 0 1024 1024+recompute] [--repeats 3] [--length 32] [--preset base] [--max-tokens 4096]
        [--output results/bench_chunked_loss.json]

The recipe's update (configs/experiment/paper_base.yaml: model=base, data=wmt14_en_de's 32,768-token vocabulary,
train.max_tokens=4,096 padded tokens per micro-batch; --preset and --max-tokens shrink it for a test) on a synthetic
micro-batch of max_tokens // --length sentences of --length random tokens each side (every fourth shorter, padded),
so no corpus is needed: forward, the loss
(nmt.training.loss.batch_loss, as the trainer calls it) normalized by the target tokens, backward, Adam's step.
Each --variants value is a train.loss_chunk_tokens (0: the whole (tokens, vocabulary) logits at once, the path before
chunking), with "+recompute" for train.checkpoint_activations=true (each encoder and decoder layer recomputed in the
backward); the first is the reference.

- Memory: each value in a fresh process (its own peak), after a first update (the gradients and Adam's state exist):
  the update's peak above what the process held before it (CUDA: torch.cuda.max_memory_allocated; CPU: the
  allocations and frees torch's profiler records, in their order), and the process's peak (CUDA: the same counter
  from zero; CPU: peak RSS, with the trainer's heap settings, nmt.runtime.memory.retain_freed_memory). Of the
  update's peak, "activations" is what the forward up to the decoder's output states keeps for the backward (the
  same for every chunk size; with recomputation, the layers' inputs only), and "above activations" the rest: the
  output layer and loss, the parameters' gradients, and with recomputation one layer's activations at a time.
- Time: the values side by side in one process, medians of --repeats interleaved updates (nmt.timing).
- Identity: the loss and every parameter's gradient of one update for each value against the first's, on the same
  batch and dropout masks: the largest difference, relative to the loss and to the largest gradient of any
  parameter (a gradient that is 0 up to rounding, a key projection's bias, has no scale of its own).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import torch

from benchmarks.report import write_report

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ["data=wmt14_en_de", "+experiment=paper_base"]  # and model=--preset (the recipe's: base)
RECOMPUTE = "+recompute"


class Variant(NamedTuple):
    """What an update is measured with: train.loss_chunk_tokens and train.checkpoint_activations."""

    chunk_tokens: int
    recompute: bool

    @classmethod
    def parse(cls, text: str) -> "Variant":
        """"1024+recompute" -> Variant(1024, True); "0" -> Variant(0, False)."""
        chunks = text.removesuffix(RECOMPUTE)
        if not chunks.isdigit():
            raise argparse.ArgumentTypeError(f"{text!r}: a train.loss_chunk_tokens (0, 1024, ...), then optionally "
                                             f"{RECOMPUTE}")
        return cls(int(chunks), text.endswith(RECOMPUTE))

    def __str__(self) -> str:
        return f"{self.chunk_tokens}{RECOMPUTE if self.recompute else ''}"


def setup(device: str, precision: str, length: int, preset: str, max_tokens: int | None):
    """The recipe's model, Adam and one synthetic micro-batch of its size on the device; the job."""
    from nmt.data.batching import Batch
    from nmt.data.vocab import BOS
    from nmt.compose import compose_job
    from nmt.kernels.dispatch import AttentionBackend
    from nmt.modeling.transformer import Transformer
    from nmt.runtime.precision import autocast_dtype
    from nmt.runtime.process import setup_env
    from nmt.training.optim import make_optimizer
    from nmt.training.trainer import check_attention

    job, _ = compose_job([f"model={preset}", *RECIPE, f"train.device={device}", f"train.precision={precision}",
                          f"train.output_dir={tempfile.mkdtemp()}",
                          *([f"train.max_tokens={max_tokens}"] if max_tokens else [])])
    env = setup_env(job.train.device, job.train.threads)  # CPU: the trainer's threads and heap settings
    amp_dtype = autocast_dtype(job.train.precision, env.device)
    attention = AttentionBackend(job.train.attention, lazy=True)
    torch.manual_seed(0)
    model = Transformer(job.model, job.data.vocab_size, attention).to(env.device).train()
    check_attention(attention, job.model, amp_dtype, env.device)
    optimizer = make_optimizer(model, job.optim)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4
    rows, vocab = job.train.max_tokens // length, job.data.vocab_size
    g = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, vocab, (rows, length), generator=g), torch.randint(4, vocab, (rows, length + 1), generator=g)
    tgt[:, 0] = BOS
    for i in range(0, rows, 4):  # every fourth sentence shorter, padded as a length bucket would leave it
        src[i, length - 1 - i % length:] = 0
        tgt[i, length - i % length:] = 0
    tgt_out = tgt[:, 1:]
    batch = Batch(src, tgt[:, :-1], tgt_out, int(tgt_out.ne(0).sum())).to(env.device)
    return job, env, amp_dtype, model, optimizer, batch


def update(model, optimizer, batch, variant: Variant, job, env, amp_dtype) -> torch.Tensor:
    """One update of the trainer's arithmetic: loss sum / target tokens, backward, Adam; returns the loss sum."""
    from nmt.training.loss import batch_loss

    model.recompute_layers = variant.recompute  # as the trainer sets train.checkpoint_activations
    loss, _ = batch_loss(model, model.output_weight, batch, job.optim.label_smoothing, variant.chunk_tokens,
                         env.device, amp_dtype)
    (loss / batch.target_tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def cpu_peak_above_start(run) -> int:
    """Bytes: the most that torch held during run() above what it held before (profiler memory events in order)."""
    from torch.profiler import profile

    with profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def activations_bytes(model, batch, env, amp_dtype) -> int:
    """What the forward up to the decoder's output states holds for the backward (with model.recompute_layers as it
    is set)."""
    from torch.profiler import profile

    from nmt.runtime.precision import autocast

    if env.device.type == "cuda":
        held = torch.cuda.memory_allocated(env.device)
        with autocast(env.device, amp_dtype):
            hidden = model(batch.src, batch.tgt_in, features_only=True)
        return torch.cuda.memory_allocated(env.device) - held
    with profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof, \
            autocast(env.device, amp_dtype):
        hidden = model(batch.src, batch.tgt_in, features_only=True)  # noqa: F841 (held until the count)
    return sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")


def measure_memory(variant: Variant, args) -> dict:
    """Peak memory of an update (after a first) with this variant; MiB."""
    job, env, amp_dtype, model, optimizer, batch = setup(args.device, args.precision, args.length, args.preset,
                                                         args.max_tokens)
    step = lambda: update(model, optimizer, batch, variant, job, env, amp_dtype)  # noqa: E731
    step()  # the gradients and Adam's state are allocated by the first
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
        held = torch.cuda.memory_allocated(env.device)
        torch.cuda.reset_peak_memory_stats(env.device)
        step()
        torch.cuda.synchronize(env.device)
        peak = torch.cuda.max_memory_allocated(env.device)
        update_peak, process_peak = (peak - held) / 2**20, peak / 2**20
    else:
        step()
        process_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        update_peak = cpu_peak_above_start(step) / 2**20
    activations = activations_bytes(model, batch, env, amp_dtype) / 2**20
    return {"update_peak_mib": update_peak, "process_peak_mib": process_peak, "activations_mib": activations,
            "above_activations_mib": update_peak - activations}


def differences(model, batch, variants: list[Variant], job, env, amp_dtype) -> dict:
    """The loss and gradients of one update's loss with each variant against the first's: the largest difference
    relative to the loss and, over the parameters, to the largest gradient of any."""
    from nmt.training.loss import batch_loss

    results = []
    for variant in variants:
        model.zero_grad(set_to_none=True)
        model.recompute_layers = variant.recompute
        torch.manual_seed(1)  # the same dropout masks
        loss, nll = batch_loss(model, model.output_weight, batch, job.optim.label_smoothing, variant.chunk_tokens,
                               env.device, amp_dtype)
        (loss / batch.target_tokens).backward()
        results.append((loss.item(), nll.item(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    model.zero_grad(set_to_none=True)
    (loss0, nll0, grads0), rows = results[0], {}
    scale = max(g.abs().max().item() for g in grads0.values())
    for variant, (loss, nll, grads) in zip(variants[1:], results[1:]):
        worst = max((((grads[n] - g).abs().max()).item() / scale, n) for n, g in grads0.items())
        rows[str(variant)] = {"loss": loss, "nll": nll, "loss_relative_difference": abs(loss - loss0) / abs(loss0),
                                   "nll_relative_difference": abs(nll - nll0) / abs(nll0),
                                   "gradient_relative_difference": worst[0], "worst_parameter": worst[1]}
    return {"reference": str(variants[0]), "loss": loss0, "nll": nll0, "against_reference": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    parser.add_argument("--variants", type=Variant.parse, nargs="+",
                        default=[Variant(0, False), Variant(1024, False), Variant(1024, True)],
                        help="train.loss_chunk_tokens values (0: the whole logits), each with +recompute for "
                             "train.checkpoint_activations=true; the first is the reference")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed updates of each value")
    parser.add_argument("--length", type=int, default=32, help="tokens per sentence of the synthetic micro-batch")
    parser.add_argument("--preset", default="base", help="the model preset (the recipe's: base)")
    parser.add_argument("--max-tokens", type=int, help="padded tokens per micro-batch (default: the recipe's)")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench_chunked_loss.json")
    parser.add_argument("--worker", type=Variant.parse, help=argparse.SUPPRESS)  # one value's memory, as JSON
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(measure_memory(args.worker, args)))
        return

    from nmt.machine import machine
    from nmt.timing import interleaved_samples

    variants = args.variants
    memory = {}
    for variant in variants:
        done = subprocess.run([sys.executable, "-m", "benchmarks.chunked_loss", "--worker", str(variant),
                               *sys.argv[1:]], cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"{variant}: the memory worker failed (exit {done.returncode}): "
                     f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
        memory[str(variant)] = {"loss_chunk_tokens": variant.chunk_tokens,
                                "checkpoint_activations": variant.recompute,
                                **json.loads(done.stdout.strip().splitlines()[-1])}

    job, env, amp_dtype, model, optimizer, batch = setup(args.device, args.precision, args.length, args.preset,
                                                         args.max_tokens)
    identity = differences(model, batch, variants, job, env, amp_dtype)
    steps = {str(v): (lambda v=v: update(model, optimizer, batch, v, job, env, amp_dtype)) for v in variants}
    seconds = {name: statistics.median(t)
               for name, t in interleaved_samples(steps, args.repeats, env.device, warmup=1).items()}

    reference = str(variants[0])
    rows = {name: {**memory[name], "update_s": seconds[name],
                   "update_peak_ratio": memory[reference]["update_peak_mib"] / memory[name]["update_peak_mib"],
                   "process_peak_ratio": memory[reference]["process_peak_mib"] / memory[name]["process_peak_mib"],
                   "above_activations_ratio": (memory[reference]["above_activations_mib"]
                                               / memory[name]["above_activations_mib"]),
                   "time_ratio": seconds[name] / seconds[reference]} for name in memory}
    report = {"machine": machine(env.device), "torch": torch.__version__, "recipe": [f"model={args.preset}", *RECIPE],
              "precision": args.precision, "model": args.preset, "vocab": job.data.vocab_size, "micro_batch": {
                  "sentences": batch.src.shape[0], "padded_tokens": batch.src.numel(),
                  "target_tokens": batch.target_tokens, "max_tokens": job.train.max_tokens},
              "repeats": args.repeats, "by_variant": rows, "identity": identity}
    print(f"{report['machine']}; {args.preset} {args.precision}, vocabulary {job.data.vocab_size}, micro-batch "
          f"{batch.src.shape[0]} x {args.length} tokens ({batch.target_tokens} target tokens)")
    print("variant (loss_chunk_tokens[+recompute])  MiB: update peak (activations + above)  process peak  update s"
          "  peak ratios: update, above activations, process  time")
    for name, row in rows.items():
        print(f"{name:>38s} {row['update_peak_mib']:16.0f} ({row['activations_mib']:.0f} + "
              f"{row['above_activations_mib']:.0f}) {row['process_peak_mib']:13.0f} {row['update_s']:9.2f}"
              f"   {row['update_peak_ratio']:6.2f}x {row['above_activations_ratio']:6.2f}x "
              f"{row['process_peak_ratio']:6.2f}x {row['time_ratio']:7.3f}")
    for name, row in identity["against_reference"].items():
        print(f"{name} against {reference}: loss {row['loss_relative_difference']:.1e}, gradients "
              f"{row['gradient_relative_difference']:.1e} (relative to the largest; worst {row['worst_parameter']})")
    write_report(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
