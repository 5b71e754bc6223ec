"""What relative attention costs at inference: decoding with relative positions and Shaw's descendants against
absolute positions, same sizes.

    python -m benchmarks.decode_cost [--preset tiny] [--sentences 256] [--steps 60] [--repeats 5] [--threads 2]
                                        [--positions relative absolute t5 alibi rope] [--device cpu] [--output results/decode_cost.json]
    python -m benchmarks.decode_cost --report results/decode_cost.json   # its table, in Markdown

The paper reports training speed only. Here, for each position mode (every mode with positions inside attention, and absolute), the same preset (random
weights: a decoder step does the same work whatever the weights, and the output length is fixed here at --steps so
both models take the same number of steps) decodes the first --sentences test sources (this project's vocabulary):
- greedy and beam 4 (4 hypotheses per source, the cache reordered every step as nmt.decoding.search does), with the
  incremental cache: sentences per second;
- the time of each decoder step as the target grows (batch 64, greedy), to see whether the relative terms' cost
  grows with the prefix;
- the cache's memory after the last step (its K/V tensors; the edge tables are parameters, not cache).
The models alternate, medians of --repeats. Budget in steps, not time. Each mode's times over absolute's are in
"over_absolute"; the run ends with them as a Markdown table, and `--report JSON` prints that table again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.report import write_report
from nmt.modeling.transformer import BOS, EOS, Transformer
from nmt.modes import Position
from nmt.timing import time_interleaved

ABSOLUTE = Position.absolute.value  # the baseline every mode's decoding is compared with

ROOT = Path(__file__).resolve().parent.parent


def sources(n: int, device) -> tuple[torch.Tensor, int]:
    """The first n test sentences of the bundled Multi30k, encoded with the prepared vocabulary (built if absent),
    and the vocabulary's size."""
    import gzip

    from nmt.data.batching import pad_rows
    from nmt.data.pipeline import prepare
    from nmt.data.vocab import Vocab
    from nmt.compose import preset_job

    folder = prepare(preset_job("data=multi30k_en_de").data)
    with gzip.open(ROOT / "data/multi30k/test_2016_flickr.en.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(n)]
    vocab = Vocab(folder / "spm.model")
    ids = vocab.encode(lines)
    return pad_rows([torch.tensor(row).numpy() for row in ids], suffix=EOS).to(device), len(vocab)


def cache_bytes(cache) -> int:
    total = 0
    for layer in cache.layers:
        for kv in (layer.self_kv, layer.cross_kv):
            if kv is not None:
                total += sum(t.numel() * t.element_size() for t in (kv.k, kv.v))
    return total


@torch.no_grad()
def decode_steps(model: Transformer, src: torch.Tensor, steps: int, beam: int, step_times: list | None = None):
    """`steps` cached decoder steps for every source (beam > 1: beam hypotheses each, reordered every step)."""
    generator = torch.Generator().manual_seed(0)
    cache = model.start(model.encode(src), src)  # the source side once per sentence, as nmt.decoding.search keeps it
    token = torch.full((src.shape[0] * beam, 1), BOS, device=src.device)
    base = torch.arange(0, src.shape[0] * beam, beam, device=src.device).repeat_interleave(beam)
    for _ in range(steps):
        start = time.perf_counter()
        logits, cache = model.decode(token, cache)
        token = logits[:, -1:].argmax(-1)
        if beam > 1:  # as beam search re-ranks: each hypothesis continues one of its sentence's beam
            cache = model.reorder(cache, base + torch.randint(0, beam, base.shape, generator=generator).to(base))
        if step_times is not None:
            step_times.append(time.perf_counter() - start)
    return cache


def markdown(report: dict) -> str:
    """Sentences per second and milliseconds per decoder step as the target grows, each mode beside absolute."""
    steps = report["steps"]
    windows = [(1, 10), (steps // 2 - 4, steps // 2 + 5), (steps - 9, steps)]
    head = " | ".join(f"ms/step {lo}-{hi}" for lo, hi in windows)
    lines = [f"| mode | greedy sent/s (time × absolute) | beam 4 sent/s (time × absolute) | {head} | cache MiB |",
             "|---|---|---|" + "---|" * len(windows) + "---|"]
    for position in (p for p in report if isinstance(report[p], dict) and "step_ms_by_target_length" in report[p]):
        r, ab = report[position], report[ABSOLUTE]
        ms = [statistics.mean(r["step_ms_by_target_length"][lo - 1:hi]) for lo, hi in windows]
        lines.append(f"| {position} | {r['greedy_sentences_per_s']:.1f} "
                     f"({ab['greedy_sentences_per_s'] / r['greedy_sentences_per_s']:.2f}) | "
                     f"{r['beam4_sentences_per_s']:.1f} ({ab['beam4_sentences_per_s'] / r['beam4_sentences_per_s']:.2f}) | "
                     + " | ".join(f"{m:.1f}" for m in ms) + f" | {r['cache_mib_batch64_beam1']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--positions", nargs="+", choices=[p.value for p in Position],
                        default=[p.value for p in (Position.relative, Position.absolute, Position.t5, Position.alibi,
                                                   Position.rope)])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--output", default="results/decode_cost.json")
    parser.add_argument("--report", type=Path, help="print the table of this earlier run's JSON and stop")
    args = parser.parse_args()
    if args.report:
        try:
            print(markdown(json.loads(args.report.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as error:
            parser.error(f"--report {args.report}: not a JSON this script wrote ({type(error).__name__}: {error})")
        return
    from nmt.compose import preset_job
    from nmt.kernels.dispatch import AttentionBackend

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    src, vocab_size = sources(args.sentences, device)
    models = {}
    for position in dict.fromkeys([ABSOLUTE, *args.positions]):
        torch.manual_seed(0)
        cfg = preset_job(f"model={args.preset}", f"model.position={position}").model
        models[position] = Transformer(cfg, vocab_size, AttentionBackend("auto")).to(device).eval()
    def whole(model, beam):
        for chunk in src.split(64):
            decode_steps(model, chunk, args.steps, beam)

    seconds = time_interleaved({(p, beam): (lambda m=m, beam=beam: whole(m, beam)) for p, m in models.items()
                                for beam in (1, 4)}, args.repeats, device, warmup=1)
    per_step = {p: [[] for _ in range(args.steps)] for p in models}
    for _ in range(args.repeats + 1):  # the milliseconds of each decoder step, the first round a warm-up
        for position, model in models.items():
            times: list = []
            decode_steps(model, src[:64], args.steps, 1, times)
            for step, t in enumerate(times):
                per_step[position][step].append(t)
    report = {"preset": args.preset, "sentences": args.sentences, "steps": args.steps, "device": args.device,
              "threads": args.threads, "repeats": args.repeats, "command": "python -m benchmarks.decode_cost "
              f"--preset {args.preset} --sentences {args.sentences} --steps {args.steps} --repeats {args.repeats}"
              + ("" if args.positions == [Position.relative.value, ABSOLUTE] else " --positions " + " ".join(args.positions))}
    for position, model in models.items():
        report[position] = {
            "greedy_sentences_per_s": args.sentences / seconds[(position, 1)],
            "beam4_sentences_per_s": args.sentences / seconds[(position, 4)],
            "step_ms_by_target_length": [statistics.median(t[1:]) * 1e3 for t in per_step[position]],
            "cache_mib_batch64_beam1": cache_bytes(decode_steps(model, src[:64], args.steps, 1)) / 2**20,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    ab = report[ABSOLUTE]
    report["over_absolute"] = {position: {
        "greedy_time": ab["greedy_sentences_per_s"] / r["greedy_sentences_per_s"],
        "beam4_time": ab["beam4_sentences_per_s"] / r["beam4_sentences_per_s"],
        "step_time_first_10": statistics.mean(r["step_ms_by_target_length"][:10])
        / statistics.mean(ab["step_ms_by_target_length"][:10]),
        "step_time_last_10": statistics.mean(r["step_ms_by_target_length"][-10:])
        / statistics.mean(ab["step_ms_by_target_length"][-10:]),
        "cache_memory": r["cache_mib_batch64_beam1"] / ab["cache_mib_batch64_beam1"],
    } for position, r in ((p, report[p]) for p in models) if position != ABSOLUTE}
    for position in models:
        r = report[position]
        print(f"{position:8s} greedy {r['greedy_sentences_per_s']:7.1f} sent/s  beam4 {r['beam4_sentences_per_s']:7.1f} "
              f"sent/s  step 1 {r['step_ms_by_target_length'][0]:.2f} ms, step {args.steps} "
              f"{r['step_ms_by_target_length'][-1]:.2f} ms  cache {r['cache_mib_batch64_beam1']:.1f} MiB")
    for position, ratios in report["over_absolute"].items():
        print(f"{position} / absolute:", {k: round(v, 3) for k, v in ratios.items()})
    print(markdown(report))
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    write_report(args.output, report, indent=1)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
