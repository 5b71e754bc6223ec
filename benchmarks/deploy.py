"""relnmt against CTranslate2 on the same model: the same translations, the BLEU of each, and the speed.

    python -m benchmarks.deploy CHECKPOINT [--sentences 1000] [--repeats 3] [--threads 1 2]
        [--output results/deploy] [--exports outputs/bench_deploy]

CHECKPOINT must be exportable (e.g. the demo trained with model.share_heads=true). It is exported to float32 and
int8 under EXPORTS/, then:
1. Agreement, in one process, on the first --sentences of test_2016_flickr: relnmt against the float32 export,
   greedy, beam 4 at alpha 0 (where the two searches are the same) and beam 4 at alpha 0.6 with relnmt's
   stop=finished (CTranslate2's rule): how many lines are token-identical, and of
   the others how many reach relnmt's length limit. BLEU (sacrebleu) of beam 4 with each engine's own length
   penalty at alpha 0.6 (relnmt: GNMT's ((5 + |Y|) / 6)^alpha; CTranslate2: |Y|^alpha), float32 and int8; the
   hypotheses are written beside the JSON.
2. Chunks (relnmt, in one process, greedy, the sentences twice): nmt.translate's chunks (8 lines, then sized by
   source tokens) against one chunk of everything: total seconds and when the first lines came out.
3. GEMM library (relnmt, in one process, one thread): the linear layers by PyTorch's BLAS (MKL) and by oneDNN
   (nmt.decoding.cpu_linear; the default on x86 CPUs not made by Intel): identical lines and medians of seconds.
4. Speed: whole `python -m nmt.translate` processes (model load included) per engine (relnmt, float32, int8) x
   search (greedy, beam 4) x threads, the engines interleaved, --repeats each; medians, sentences/s, and each
   engine's time over relnmt's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU

from benchmarks.report import write_report
from nmt.config import SearchConfig
from nmt.decoding.cpu_linear import onednn_preferred
from nmt.decoding.decode import encode_lines, load_translator, translate_ids
from nmt.export import export
from nmt.machine import machine
from nmt.modes import Stop
from nmt.timing import time_interleaved

ROOT = Path(__file__).resolve().parent.parent
TEST = ROOT / "data" / "multi30k" / "test_2016_flickr"
SEARCHES = {"greedy": ["beam=1"], "beam4": ["beam=4", "alpha=0.6"]}


def test_lines(name: str, lang: str, n: int) -> list[str]:
    with gzip.open(f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line, _ in zip(f, range(n))]


def agreement(checkpoint: str, exports: dict[str, Path], sources: list[str], refs: list[str], out: Path) -> dict:
    cpu = torch.device("cpu")
    model, vocab = load_translator(checkpoint, cpu)
    engines = {"relnmt": model, **{name: load_translator(path, cpu)[0] for name, path in exports.items()}}
    ids = encode_lines(vocab, sources, None)
    report = {}
    for name, search in (("greedy", SearchConfig(beam=1)), ("beam4_alpha0", SearchConfig(beam=4, alpha=0.0)),
                         ("beam4_finished", SearchConfig(beam=4, alpha=0.6, stop=Stop.finished))):
        ours, theirs = (translate_ids(engines[e], ids, search, cpu) for e in ("relnmt", "float32"))
        differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
        at_limit = [i for i in differ if len(ours[i]) >= len(ids[i]) + search.max_extra]
        report[name] = {"identical": len(ids) - len(differ), "of": len(ids), "differ": differ,
                        "differ_at_relnmt_length_limit": len(at_limit)}
    beam = SearchConfig(beam=4, alpha=0.6)
    for name, engine in engines.items():
        hyps = [vocab.decode(row) for row in translate_ids(engine, ids, beam, cpu)]
        (out / f"{name}.beam4.hyp.de").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        metric = BLEU()
        score = metric.corpus_score(hyps, [refs])
        report[f"bleu_beam4_{name}"] = {"score": round(score.score, 2), "signature": str(metric.get_signature()),
                                        "empty_lines": sum(not h for h in hyps)}
    return report


def chunking(checkpoint: str, sources: list[str], repeats: int) -> dict:
    from nmt.decoding import decode

    cpu = torch.device("cpu")
    model, vocab = load_translator(checkpoint, cpu)
    lines, search, first_chunk = sources * 2, SearchConfig(beam=1), decode.FIRST_CHUNK_LINES
    runs: dict[str, list[tuple[float, float]]] = {"token-sized chunks": [], "one chunk": []}
    try:
        for _ in range(repeats):
            for name in runs:
                decode.FIRST_CHUNK_LINES = first_chunk if name == "token-sized chunks" else len(lines)
                started, first = time.perf_counter(), None
                for _chunk in decode.translate_stream(model, vocab, lines, search, cpu, len(lines)):
                    first = first or time.perf_counter() - started
                runs[name].append((time.perf_counter() - started, first))
    finally:
        decode.FIRST_CHUNK_LINES = first_chunk
    return {name: {"lines": len(lines), "seconds": statistics.median(t for t, _ in r),
                   "first_lines_after_s": statistics.median(f for _, f in r)} for name, r in runs.items()}


def gemm_library(checkpoint: str, sources: list[str], repeats: int) -> dict:
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    torch.set_num_threads(1)
    models = {"blas": load_translator(checkpoint, cpu, onednn=False)[0],
              "onednn": load_translator(checkpoint, cpu, onednn=True)[0]}
    ids = encode_lines(load_translator(checkpoint, cpu)[1], sources, None)
    report = {"onednn_preferred_here": onednn_preferred(), "machine": machine(cpu)}
    try:
        for name, search in (("greedy", SearchConfig(beam=1)), ("beam4", SearchConfig(beam=4, alpha=0.6))):
            outputs = {}

            def run(library, search=search):
                outputs[library] = translate_ids(models[library], ids, search, cpu)

            times = time_interleaved({library: (lambda lib=library: run(lib)) for library in models}, repeats, cpu,
                                     warmup=0)
            blas, onednn = times["blas"], times["onednn"]
            report[name] = {"identical": sum(a == b for a, b in zip(outputs["blas"], outputs["onednn"])),
                            "of": len(ids), "blas_s": blas, "onednn_s": onednn, "speedup": blas / onednn}
    finally:
        torch.set_num_threads(threads)
    return report


def speed(engines: dict[str, str], source: Path, threads: list[int], repeats: int,
          checkouts: dict[str, Path] | None = None, searches: dict[str, list[str]] = SEARCHES,
          skip: frozenset[tuple[str, str]] = frozenset()) -> dict:
    """Whole `python -m nmt.translate` processes, engine x search x threads, interleaved, medians of `repeats`.
    checkouts: the source tree an engine's process runs (default: this one), e.g. an older commit's for a before and
    after; skip: (engine, search) pairs not run (a search an older tree does not have)."""
    cpu: dict[str, list[float]] = {}  # each process's CPU seconds (user + system): on a shared machine, what
    # its wall time cannot show

    def translate(key: str, name: str, args: list[str], n: int) -> None:
        root = (checkouts or {}).get(name, ROOT)
        env = {**os.environ, "OMP_NUM_THREADS": str(n), "PYTHONPATH": str(root)}
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-m", "nmt.translate", f"checkpoint={engines[name]}", f"input={source}",
                        "device=cpu", *args], env=env, cwd=root, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.setdefault(key, []).append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)

    # interleaved: each engine sees the same machine state
    times = time_interleaved({key: (lambda key=key, name=name, args=args, n=n: translate(key, name, args, n))
                              for n in threads for search, args in searches.items() for name in engines
                              if (name, search) not in skip for key in [f"{name} {search} {n}t"]}, repeats, "cpu",
                             warmup=0)
    lines = sum(1 for _ in open(source, encoding="utf-8"))
    rows = {key: {"seconds": t, "sentences_per_s": lines / t, "cpu_seconds": statistics.median(cpu[key])}
            for key, t in times.items()}
    for key, row in rows.items():
        name, rest = key.split(" ", 1)
        row["speed_over_relnmt"] = rows[f"relnmt {rest}"]["seconds"] / row["seconds"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--output", type=Path, default=Path("results/deploy"), help="the report and hypotheses")
    parser.add_argument("--exports", type=Path, default=Path("outputs/bench_deploy"), help="the exported models")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    exports = {"float32": export(args.checkpoint, args.exports / "float32"),
               "int8": export(args.checkpoint, args.exports / "int8", "int8")}
    sources, refs = test_lines(str(TEST), "en", args.sentences), test_lines(str(TEST), "de", args.sentences)
    source = args.output / "source.en"
    source.write_text("".join(line + "\n" for line in sources), encoding="utf-8")
    report = {"checkpoint": args.checkpoint, "sentences": len(sources), "torch": torch.__version__,
              "command": " ".join(["python", "benchmarks/deploy.py", *sys.argv[1:]])}
    report["agreement"] = agreement(args.checkpoint, exports, sources, refs, args.output)
    print(json.dumps(report["agreement"], indent=1, default=str)[:2000], flush=True)
    report["chunks"] = chunking(args.checkpoint, sources, args.repeats)
    print(json.dumps(report["chunks"], indent=1), flush=True)
    report["gemm_library"] = gemm_library(args.checkpoint, sources, args.repeats)
    print(json.dumps(report["gemm_library"], indent=1), flush=True)
    report["speed"] = speed({"relnmt": args.checkpoint, **{k: str(v) for k, v in exports.items()}}, source,
                            args.threads, args.repeats)
    for key, row in report["speed"].items():
        print(f"{key:22s} {row['seconds']:7.2f} s  {row['sentences_per_s']:7.1f} sentences/s  "
              f"{row['speed_over_relnmt']:5.2f}x relnmt")
    write_report(args.output / "deploy.json", report)
    print(f"wrote {args.output / 'deploy.json'}")


if __name__ == "__main__":
    main()
