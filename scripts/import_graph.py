"""The import graph of the house, the packages nmt, experiments and benchmarks, read from their source (AST, no
import runs):

    python scripts/import_graph.py [--edges] [--json] [--root PACKAGE ...]

Prints the package's modules, the import edges between them (an import inside a function counts like one at the
top: a lazy import still ties the two modules together), the circles (strongly connected components of more than
one module) and the edges that point up the layer order below. Exit 1 when there is a circle or an upward edge.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

# The house, lowest floor first: a module may import its own floor and those below, never one above. A name is a
# module or a package (its modules); "pkg.*" is every module of pkg that no longer name holds, and a top package's
# own name only its __init__. A module's floor is that of the longest name that holds it. The NMT library (nmt/ less
# nmt.lab), then the benchmarks that measure it, then the lab (nmt.lab: a run's lifecycle and record, collection,
# statistics, the page), the commands over runs, and the studies (experiments/) on top.
LAYERS = [
    ["nmt.errors", "nmt.modes", "nmt.roles", "nmt.machine", "nmt.timing", "nmt.progress", "nmt.cluster",
     "nmt.workers"],  # leaves: user errors, switches, the machine, small helpers of no stage
    ["nmt.config", "nmt.recorded_config", "nmt.batch", "nmt.run_names", "nmt.outputs",
     "nmt.runtime", "nmt.checkpoints.checkpoint"],  # the schemas and their one rule (Role), the process, the
    # checkpoint file (data reads the vocabulary one carries)
    ["nmt.compose"],  # configs/ composed over the schemas: a job or a preset's values, for any code above
    ["nmt.fields", "nmt.overrides"],  # a job's fields for --help and completion, and its overrides checked
    ["nmt.data"],  # readers, vocabulary and its special ids, shards, batching: text and tokens, no model
    ["nmt.kernels"],  # attention kernels: the PyTorch path and the fused op
    ["nmt.modeling"],  # the Transformer, its positions and edges
    ["nmt.checkpoints", "nmt.decoding"],  # checkpoint files and checks, search
    ["nmt.training"],  # the trainer and its parts
    ["nmt.cli", "nmt.commands"],  # the Hydra entry every command shares
    ["nmt.prepare", "nmt.average", "nmt.translate", "nmt.score", "nmt.export"],  # the stages' commands
    ["benchmarks.report"],  # the benchmarks' one timing and record helper
    ["benchmarks.*"],  # speed measurements and the GPU check: they measure the library, never the lab
    ["nmt.lab.stats", "nmt.lab.record"],  # the lab: statistics; a run's record (decode and score a checkpoint)
    ["nmt.lab.run", "nmt.lab.collect"],  # a run's one lifecycle; the collector that reads records into rows
    ["nmt.lab.page", "nmt.lab.claims"],  # the page of tables and verdicts; the check of its sentences
    ["nmt.lab"],  # the lab package itself (__init__)
    ["nmt.train", "nmt.experiment", "nmt.table"],  # commands over a run or a sweep
    ["nmt"],  # the package itself (__init__)
    ["experiments.modes", "experiments.grid", "experiments.shortcuts"],  # the studies' switches, runner, chance
    ["experiments.reach"],  # the reach task, which the other synthetic studies build on
    ["experiments.edge_values", "experiments.extrapolate"],  # studies over the reach task's parts
    ["experiments.*"],  # every other study, table and plot
]
ROOTS = ("nmt", "experiments", "benchmarks")  # the packages of the house (scripts/ and tests/ import, none imports them)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its source (top level, functions, TYPE_CHECKING)."""
    found = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from nmt.x import y`: y is a module when one exists by that name, else a name inside nmt.x
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import nmt.a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(roots: list[Path]) -> dict[str, set[str]]:
    files = {module_name(path, root): path for root in roots for path in sorted(root.rglob("*.py"))}
    return {name: imported_modules(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py",
                                   set(files))
            for name, path in files.items()}


def holds(prefix: str, name: str) -> bool:
    if prefix.endswith(".*"):
        return name.startswith(prefix[:-1])
    return name == prefix or ("." in prefix and name.startswith(prefix + "."))


def layer_of(name: str) -> int:
    best, layer = -1, None
    for index, names in enumerate(LAYERS):
        for prefix in names:
            if holds(prefix, name) and len(prefix) > best:
                best, layer = len(prefix), index
    if layer is None:
        raise SystemExit(f"{name} is in no layer of scripts/import_graph.py's LAYERS: give it one")
    return layer


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def report(roots: list[Path]) -> dict:
    graph = import_graph(roots)
    edges = sorted((a, b) for a, targets in graph.items() for b in targets)
    upward = [(a, b) for a, b in edges if layer_of(b) > layer_of(a)]
    return {"modules": len(graph), "edges": edges, "upward": upward, "circles": circles(graph)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, action="append", help="a package to read (default: every one of "
                        "ROOTS); repeat for more")
    parser.add_argument("--edges", action="store_true", help="list every edge too")
    parser.add_argument("--json", action="store_true", help="the whole report as JSON on stdout")
    args = parser.parse_args()
    house = Path(__file__).resolve().parent.parent
    found = report(args.root or [house / name for name in ROOTS])
    if args.json:
        print(json.dumps(found, indent=1))
    else:
        print(f"modules: {found['modules']}  edges: {len(found['edges'])}  upward edges: {len(found['upward'])}  "
              f"circles: {len(found['circles'])}")
        for a, b in found["edges"] if args.edges else []:
            print(f"edge: {a} -> {b}")
        for a, b in found["upward"]:
            print(f"upward: {a} (layer {layer_of(a)}) -> {b} (layer {layer_of(b)})")
        for circle in found["circles"]:
            print("circle: " + " <-> ".join(circle))
    sys.exit(1 if found["upward"] or found["circles"] else 0)


if __name__ == "__main__":
    main()
