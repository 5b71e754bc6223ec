"""Where a whole relnmt decode's time goes, and how much work its search does.

    python -m benchmarks.decode_profile CHECKPOINT [--sentences 1000] [--beam 4] [--threads 1]
        [--output results/decode_profile.json]

In one fresh process, as `relnmt-translate` runs them (the first --sentences of test_2016_flickr, --threads threads):
1. its phases' wall seconds: importing torch, importing nmt.translate, loading the checkpoint
   (nmt.decoding.decode.load_translator), encoding the lines, the search (nmt.decoding.decode.search_ids);
2. the search again under torch.profiler: each op's self CPU seconds, grouped (GROUPS: the linear layers and the
   output projection; attention; the search's log-softmax and top-k; the cache's copies; the rest), and the Python
   between them (the profiled search's wall time less its ops' self time, on one thread);
3. the search's work: the hypothesis rows the decoder ran (one row: one hypothesis, one step) under relnmt's exact
   rule (a sentence ends only when no live beam can still win, nmt/decoding/search.py), and under stop=finished
   (CTranslate2's and fairseq's rule: it ends once beam hypotheses have), counted in one more search;
4. then a whole `python -m nmt.translate` process over the same lines (what benchmarks.decode_ratio times): its wall
   seconds, against the phases above.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()

# torch.profiler op names (a substring) -> what they are, first match wins
GROUPS = [("linear layers and output projection", ("linear", "addmm", "aten::mm", "matmul")),
          ("attention", ("scaled_dot_product", "bmm", "aten::_softmax", "masked_fill")),
          ("search: log-softmax, top-k", ("log_softmax", "topk")),
          ("cache: reorder and append", ("index_select", "aten::cat", "copy_", "slice_scatter"))]


def group_of(name: str) -> str:
    return next((group for group, parts in GROUPS if any(part in name for part in parts)), "other ops")


def translate_process_seconds(args) -> float:
    """Wall seconds of one `python -m nmt.translate` over the same lines and search, with OMP_NUM_THREADS=threads."""
    from benchmarks.deploy import TEST, test_lines

    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "source.en"
        source.write_text("".join(f"{line}\n" for line in test_lines(str(TEST), "en", args.sentences)), encoding="utf-8")
        clock = time.perf_counter()
        subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={args.checkpoint}", f"input={source}",
                        f"output={Path(folder) / 'out.de'}", f"beam={args.beam}", "device=cpu"], check=True,
                       env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}, capture_output=True)
        return time.perf_counter() - clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=Path("results/decode_profile.json"))
    args = parser.parse_args()
    phases = {"import torch": -time.perf_counter()}
    import torch
    phases["import torch"] += time.perf_counter()
    phases["import nmt.translate"] = -time.perf_counter()
    import nmt.translate  # noqa: F401 (what relnmt-translate imports)
    from dataclasses import replace

    from nmt.config import SearchConfig
    from nmt.modes import Stop
    from nmt.decoding.decode import encode_lines, input_limit, load_translator, search_ids
    from nmt.runtime.memory import retain_freed_memory
    phases["import nmt.translate"] += time.perf_counter()

    from benchmarks.deploy import TEST, test_lines
    from benchmarks.report import write_report
    from nmt.machine import machine

    torch.set_num_threads(args.threads)
    retain_freed_memory()  # as nmt.translate
    cpu = torch.device("cpu")
    clock = time.perf_counter()
    model, vocab = load_translator(str(args.checkpoint), cpu)
    phases["load"] = time.perf_counter() - clock
    search = SearchConfig(beam=args.beam)
    lines = test_lines(str(TEST), "en", args.sentences)
    clock = time.perf_counter()
    ids = encode_lines(vocab, lines, input_limit(model, search.max_extra))
    phases["encode"] = time.perf_counter() - clock

    rows = []
    decode = model.decode

    def counting(into: list[int]):
        def counted(tokens, cache):
            into.append(tokens.shape[0])
            return decode(tokens, cache)
        return counted
    model.decode = counting(rows)
    clock = time.perf_counter()
    search_ids(model, ids, search, cpu)
    phases["search"] = time.perf_counter() - clock
    phases["process so far"] = time.perf_counter() - START
    model.decode = decode

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        clock = time.perf_counter()
        search_ids(model, ids, search, cpu)
        profiled = time.perf_counter() - clock
    by_group: dict[str, float] = {}
    for event in profile.key_averages():
        by_group[group_of(event.key)] = by_group.get(group_of(event.key), 0.0) + event.self_cpu_time_total / 1e6
    by_group["Python between ops (wall less ops)"] = profiled - sum(by_group.values())
    finished_rows: list[int] = []
    model.decode = counting(finished_rows)
    search_ids(model, ids, replace(search, stop=Stop.finished), cpu)
    model.decode = decode
    whole = translate_process_seconds(args)
    report = {"checkpoint": str(args.checkpoint), "sentences": args.sentences, "beam": args.beam,
              "threads": args.threads, "machine": machine(cpu), "torch": torch.__version__,
              "translate_process_s": round(whole, 3), "phases_s": {k: round(v, 3) for k, v in phases.items()},
              "profiled_search_s": round(profiled, 3),
              "search_by_group_s": {k: round(v, 3) for k, v in sorted(by_group.items(), key=lambda kv: -kv[1])},
              "hypothesis_rows": sum(rows), "steps": len(rows), "hypothesis_rows_stop_finished": sum(finished_rows),
              "rows_exact_over_finished": round(sum(rows) / sum(finished_rows), 3)}
    print(f"{report['machine']}; {args.sentences} sentences, beam {args.beam}, {args.threads} thread(s)")
    print(f"python -m nmt.translate: {whole:.2f} s")
    print("phases (s): " + ", ".join(f"{k} {v:.2f}" for k, v in report["phases_s"].items()))
    print(f"search under the profiler {profiled:.2f} s: " +
          ", ".join(f"{k} {v:.2f}" for k, v in report["search_by_group_s"].items()))
    print(f"hypothesis rows {sum(rows)} over {len(rows)} steps; under stop=finished {sum(finished_rows)}: the exact "
          f"rule runs {report['rows_exact_over_finished']:.3f}x as many")
    write_report(args.output, report)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
