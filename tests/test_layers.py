"""The house's imports point one way: across nmt/ (the library and its lab, nmt/lab/), experiments/ and benchmarks/,
no circle and no import up the floors of scripts/import_graph.py (a lazy import inside a function counts)."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def import_graph(*args):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py"), "--json", *args],
                            capture_output=True, text=True)
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def test_the_house_has_no_import_circle_and_no_upward_import():
    code, graph = import_graph()
    assert graph["circles"] == [] and graph["upward"] == [], graph["circles"] + graph["upward"]
    assert code == 0 and graph["modules"] > 100 and len(graph["edges"]) > 300  # it read the three packages
    read = {name.split(".")[0] for edge in graph["edges"] for name in edge}
    assert read == {"nmt", "experiments", "benchmarks"}
    assert not any(a.startswith("nmt.") and not a.startswith(("nmt.lab", "nmt.train", "nmt.experiment", "nmt.table"))
                   and b.startswith("nmt.lab") for a, b in graph["edges"])  # the library never reads the lab


def test_a_lazy_import_up_a_layer_and_a_circle_are_found(tmp_path):
    package = tmp_path / "nmt"
    for folder in ("modeling", "lab"):
        (package / folder).mkdir(parents=True)
    for name in ("__init__.py", "modeling/__init__.py", "lab/__init__.py", "lab/run.py"):
        (package / name).write_text("")
    (package / "config.py").write_text("def check():\n    from nmt.modeling.edges import rule\n")
    (package / "modeling" / "edges.py").write_text("from .positions import buckets\n")
    (package / "modeling" / "positions.py").write_text("import nmt.config\n")
    (package / "errors.py").write_text("def later():\n    import nmt.lab.run\n")
    studies = tmp_path / "experiments"
    studies.mkdir()
    (studies / "__init__.py").write_text("")
    (studies / "reach.py").write_text("def cite():\n    from experiments.shortcuts import shares\n")
    (studies / "shortcuts.py").write_text("from experiments.reach import cite\n")
    (studies / "grid.py").write_text("import nmt.lab.run\n")
    code, graph = import_graph("--root", str(package), "--root", str(studies))
    assert code == 1 and graph["circles"] == [["experiments.reach", "experiments.shortcuts"],
                                              ["nmt.config", "nmt.modeling.edges", "nmt.modeling.positions"]]
    assert graph["upward"] == [["experiments.shortcuts", "experiments.reach"], ["nmt.config", "nmt.modeling.edges"],
                               ["nmt.errors", "nmt.lab.run"]]
