"""One `tiny` fp32 training update on a CPU, whole and in its parts, at 1 and 2 threads.

    python -m benchmarks.train_parts [--repeats 10] [--threads 1 2] [--precision fp32|bf16] [--max-tokens 4096]
        [--output results/bench_train_parts.json]

Real Multi30k batches of the demo's micro-batch (4,096 tokens), the trainer's own model and Adam; fp32, the path
of a CPU without native bf16, forced where the CPU has it (--precision bf16: the autocast of one with it, the whole
update only). Each figure is a median of interleaved repeats (nmt.timing) in one process, the thread counts one
after the other:

1. The whole update (forward, loss, backward, Adam), one change at a time: PyTorch's dropout, composite loss and
   Adam loop (`pytorch`), relnmt's dropout and loss (nmt/kernels/dropout.py, nmt/training/loss.py), then Adam's fused step (today).
2. Its parts, each isolated at the batch's shapes: the GEMMs (from 3), the loss forward and backward, the dropout
   sites outside attention forward and backward, Adam's step; the rest is the whole less the parts. The data (a
   batch cut and collated on the host) is timed too; the trainer's prefetch thread does it off the step's path.
3. Each GEMM shape of the update and each direction (forward y = x W^T, input gradient dy W, weight gradient
   dy^T x) through MKL (torch.mm, PyTorch's float32 GEMM on a CPU) and through oneDNN
   (torch.ops.mkldnn._linear_pointwise, what nmt/decoding/cpu_linear.py uses for decoding), operands already in the layout
   each library wants (transposes not timed).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch
from torch import nn

from benchmarks.report import write_report
from nmt.timing import interleaved_samples

ROOT = Path(__file__).resolve().parent.parent


def pytorch_loss(logits, target, epsilon):
    """The composite label-smoothed loss nmt/training/loss.py replaced (log_softmax, gather, mean, masked sums)."""
    log_probs = logits.float().log_softmax(-1)
    keep = target.ne(0)
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    loss = (1.0 - epsilon) * nll + epsilon * -log_probs.mean(-1)
    return torch.where(keep, loss, 0.0).sum(), torch.where(keep, nll, 0.0).sum()


def pytorch_keep_mask(shape, p, device):
    """The attention-probability mask the fused-free path drew before nmt/kernels/dropout.py: one float per element."""
    return torch.empty(shape, device=device).uniform_() >= p, 1.0 / (1.0 - p)


class Variant:
    """Switches a model between PyTorch's dropout and loss and relnmt's, and Adam between its loops and its fused
    CPU step (the same parameters and state: only the implementation changes)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, amp_dtype: torch.dtype | None):
        import nmt.kernels.torch_attention as torch_attention
        from nmt.kernels.dropout import Dropout, keep_mask
        from nmt.runtime.precision import autocast
        from nmt.training.loss import smoothed_loss

        self.model, self.optimizer, self.attention, self.amp_dtype = model, optimizer, torch_attention, amp_dtype
        self.dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
        self.classes = {"pytorch": nn.Dropout, "relnmt": Dropout}
        self.losses = {"pytorch": pytorch_loss, "relnmt": smoothed_loss}
        self.masks = {"pytorch": pytorch_keep_mask, "relnmt": keep_mask}
        self.autocast = autocast

    def set(self, name: str) -> None:
        implementation, fused = VARIANTS[name]
        for module in self.dropouts:
            module.__class__ = self.classes[implementation]
        self.attention.keep_mask = self.masks[implementation]
        self.loss = self.losses[implementation]
        for group in self.optimizer.param_groups:
            group["fused"] = fused

    def update(self, batch, epsilon: float = 0.1) -> None:
        with torch.profiler.record_function("forward"), self.autocast(torch.device("cpu"), self.amp_dtype):
            logits = self.model(batch.src, batch.tgt_in)
        with torch.profiler.record_function("loss"):
            loss, _ = self.loss(logits, batch.tgt_out, epsilon)
        with torch.profiler.record_function("backward"):
            loss.backward()
        with torch.profiler.record_function("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


# one measured change at a time: (dropout and loss, fused Adam); the last is today's trainer
VARIANTS = {"pytorch": ("pytorch", False), "+ relnmt dropout, loss": ("relnmt", False),
            "+ fused adam": ("relnmt", True)}
TODAY = "+ fused adam"


def part_times(variant: Variant, batch, cfg, vocab: int, repeats: int, p: float = 0.1) -> dict[str, float]:
    """Seconds of the isolated parts of one update at this batch's shapes, PyTorch's and relnmt's side by side:
    the loss forward and backward from the logits, every dropout site of the model outside attention (embeddings,
    residuals, FFN hidden; forward and backward) and Adam's step over the model's parameters."""
    from torch.nn import functional as F

    from nmt.kernels.dropout import dropout
    from nmt.training.loss import smoothed_loss

    (b, ns), nt = batch.src.shape, batch.tgt_in.shape[1]
    d, f, enc, dec = cfg.d_model, cfg.ffn_dim, cfg.encoder_layers, cfg.decoder_layers
    sites = [(b, ns, d)] * (1 + 2 * enc) + [(b, ns, f)] * enc + [(b, nt, d)] * (1 + 3 * dec) + [(b, nt, f)] * dec
    inputs = {shape: torch.randn(shape, requires_grad=True) for shape in set(sites)}
    grads = {shape: torch.randn(shape) for shape in set(sites)}
    logits = torch.randn(b, nt, vocab, requires_grad=True)
    for param in variant.model.parameters():
        param.grad = torch.randn_like(param) * 1e-3

    def drop_all(fn):
        for shape in sites:
            fn(inputs[shape], p).backward(grads[shape])

    def adam(fused: bool):
        for group in variant.optimizer.param_groups:
            group["fused"], group["lr"] = fused, 1e-4
        variant.optimizer.step()

    steps = {"loss pytorch": lambda: pytorch_loss(logits, batch.tgt_out, 0.1)[0].backward(),
             "loss relnmt": lambda: smoothed_loss(logits, batch.tgt_out, 0.1)[0].backward(),
             "dropout pytorch": lambda: drop_all(lambda x, p: F.dropout(x, p)),
             "dropout relnmt": lambda: drop_all(dropout),
             "adam loop": lambda: adam(False), "adam fused": lambda: adam(True)}
    times = {k: statistics.median(v) for k, v in interleaved_samples(steps, repeats, "cpu").items()}
    variant.optimizer.zero_grad(set_to_none=True)
    return times


def parts_table(update_s: dict[str, float], parts: dict[str, float], gemms: list[dict]) -> dict[str, dict]:
    """Seconds per update of each part, before (PyTorch's dropout, loss, Adam loop) and today; the rest (attention,
    layer norms, embeddings, residual additions, the autograd engine) is the whole update less the parts."""
    def gemm_s(rows):
        return sum(r["uses"] * sum(r["ms"][f"{d} mkl"] for d in ("forward", "input grad", "weight grad"))
                   for r in rows) / 1e3

    table = {}
    for column, whole, implementation, adam in (("pytorch", update_s["pytorch"], "pytorch", "loop"),
                                                ("today", update_s[TODAY], "relnmt", "fused")):
        row = {"linear layer GEMMs (forward, both backward)": gemm_s(g for g in gemms if g["layer"] != "output projection"),
               "output projection GEMMs": gemm_s(g for g in gemms if g["layer"] == "output projection"),
               "loss (forward, backward)": parts[f"loss {implementation}"],
               "dropout outside attention (forward, backward)": parts[f"dropout {implementation}"],
               "optimizer step": parts[f"adam {adam}"]}
        row["the rest: attention, layer norms, embeddings, autograd"] = whole - sum(row.values())
        row["whole update"] = whole
        table[column] = row
    return table


def gemm_shapes(cfg, vocab: int, src_rows: int, tgt_rows: int) -> list[tuple[str, int, int, int, int]]:
    """(layer, rows, in, out, uses per update) of every linear layer of the tiny model and the output projection."""
    d, f = cfg.d_model, cfg.ffn_dim
    enc, dec = cfg.encoder_layers, cfg.decoder_layers
    return [("attention projections (encoder)", src_rows, d, d, 4 * enc),
            ("attention projections (decoder)", tgt_rows, d, d, 4 * dec + 2 * dec),  # self, cross q and out
            ("cross-attention k, v (memory)", src_rows, d, d, 2 * dec),
            ("FFN in (encoder)", src_rows, d, f, enc), ("FFN out (encoder)", src_rows, f, d, enc),
            ("FFN in (decoder)", tgt_rows, d, f, dec), ("FFN out (decoder)", tgt_rows, f, d, dec),
            ("output projection", tgt_rows, d, vocab, 1)]


def gemm_table(shapes, repeats: int) -> list[dict]:
    """MKL and oneDNN milliseconds of each direction of each shape (the current thread count)."""
    rows = []
    onednn = torch.ops.mkldnn._linear_pointwise
    for layer, n, d_in, d_out, uses in shapes:
        x, w, dy = torch.randn(n, d_in), torch.randn(d_out, d_in) * d_in**-0.5, torch.randn(n, d_out)
        b = torch.zeros(d_out)
        w_t, dy_t, x_t = w.t().contiguous(), dy.t().contiguous(), x.t().contiguous()
        steps = {
            "forward mkl": lambda: torch.addmm(b, x, w.t()), "forward onednn": lambda: onednn(x, w, b, "none", [], ""),
            "input grad mkl": lambda: torch.mm(dy, w), "input grad onednn": lambda: onednn(dy, w_t, None, "none", [], ""),
            "weight grad mkl": lambda: torch.mm(dy.t(), x),
            "weight grad onednn": lambda: onednn(dy_t, x_t, None, "none", [], ""),
        }
        times = {k: 1e3 * statistics.median(v) for k, v in interleaved_samples(steps, repeats, "cpu").items()}
        rows.append({"layer": layer, "rows": n, "in": d_in, "out": d_out, "uses": uses, "ms": times})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="interleaved rounds of each measurement")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: the autocast a CPU with native bf16 trains the demo in")
    parser.add_argument("--max-tokens", type=int, default=4096, help="the micro-batch (the demo's: 4096)")
    parser.add_argument("--output", type=Path, default=ROOT / "results/bench_train_parts.json")
    args = parser.parse_args()

    from nmt.data.batching import training_stream
    from nmt.data.pipeline import prepare
    from nmt.compose import compose_job
    from nmt.machine import machine
    from nmt.runtime.process import setup_env
    from nmt.training.trainer import Trainer

    job, _ = compose_job(["model=tiny", "data=multi30k_en_de", "train.device=cpu", f"train.precision={args.precision}",
                          f"train.max_tokens={args.max_tokens}", "train.update_freq=1", "train.compile=false",
                          "train.seed=0", f"train.output_dir={tempfile.mkdtemp()}"])
    prepare(job.data)  # reused when up to date
    trainer = Trainer(job, setup_env("cpu", 0))
    stream = training_stream(trainer.data.train, job.train.max_tokens, job.train.seed, 0, 1, 0, 0)
    batches = [next(stream)[2] for _ in range(args.repeats + 2)]
    vocab = trainer.model.embed.num_embeddings
    variant = Variant(trainer.model, trainer.optimizer, trainer.amp_dtype)
    data_s = statistics.median(interleaved_samples({"data": lambda: next(stream)}, args.repeats, "cpu")["data"])
    src_rows = round(statistics.median(b.src.numel() for b in batches))
    tgt_rows = round(statistics.median(b.tgt_in.numel() for b in batches))
    report = {"command": "python -m benchmarks.train_parts " + " ".join(
                  f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                  for k, v in vars(args).items() if k != "output"),
              "machine": machine(torch.device("cpu")),
              "torch": torch.__version__, "vocab": vocab, "padded_rows": {"source": src_rows, "target": tgt_rows},
              "data_s_per_batch": data_s, "threads": {}}
    print(f"{report['machine']}; tiny {args.precision}, micro-batch {args.max_tokens} tokens (median padded rows: source {src_rows}, target "
          f"{tgt_rows}), vocabulary {vocab}; data: {1e3 * data_s:.1f} ms per batch on the host")
    for threads in args.threads:
        torch.set_num_threads(threads)
        cycle = iter(batches * (len(VARIANTS) * 4))

        def step(name):
            return lambda: (variant.set(name), variant.update(next(cycle)))

        whole = interleaved_samples({name: step(name) for name in VARIANTS}, args.repeats, "cpu")
        medians = {name: statistics.median(t) for name, t in whole.items()}
        gemms, parts = [], {}
        if args.precision == "fp32":  # the parts are timed in fp32: under autocast they would not add up
            gemms = gemm_table(gemm_shapes(job.model, vocab, src_rows, tgt_rows), args.repeats)
            parts = parts_table(medians, part_times(variant, batches[0], job.model, vocab, args.repeats), gemms)
        report["threads"][str(threads)] = {"update_s": medians, "parts_s": parts, "gemm_ms": gemms}
        print(f"\n{threads} thread(s): one update, median of {args.repeats} interleaved")
        for name, seconds in medians.items():
            print(f"  {name:24s} {seconds:6.3f} s   {medians['pytorch'] / seconds:5.2f}x")
        if not parts:
            continue
        print("  parts, s per update (isolated, medians)                    pytorch    today")
        for key in parts["today"]:
            print(f"    {key:56s} {parts['pytorch'][key]:8.3f} {parts['today'][key]:8.3f}")
        print("  GEMMs, ms (MKL / oneDNN)          rows   in   out  uses   forward       input grad    weight grad")
        for row in gemms:
            ms = row["ms"]
            cells = "  ".join(f"{ms[d + ' mkl']:6.2f}/{ms[d + ' onednn']:6.2f}"
                              for d in ("forward", "input grad", "weight grad"))
            print(f"    {row['layer']:31s} {row['rows']:5d} {row['in']:4d} {row['out']:5d} {row['uses']:4d}  {cells}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_report(args.output, report)
    print(f"\nwrote {args.output}")


if __name__ == "__main__":
    main()
