"""The package's imports point one way: no circle, no import up the layer order of scripts/import_graph.py (a lazy
import inside a function counts)."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def import_graph(*args):
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "import_graph.py"), "--json", *args],
                            capture_output=True, text=True)
    assert result.stderr == "", result.stderr
    return result.returncode, json.loads(result.stdout)


def test_nmt_has_no_import_circle_and_no_upward_import():
    code, graph = import_graph()
    assert graph["circles"] == [] and graph["upward"] == [], graph["circles"] + graph["upward"]
    assert code == 0 and graph["modules"] > 50 and len(graph["edges"]) > 150  # it read the package


def test_a_lazy_import_up_a_layer_and_a_circle_are_found(tmp_path):
    package = tmp_path / "nmt"
    (package / "modeling").mkdir(parents=True)
    for name in ("__init__.py", "modeling/__init__.py", "cell.py"):
        (package / name).write_text("")
    (package / "config.py").write_text("def check():\n    from nmt.modeling.edges import rule\n")
    (package / "modeling" / "edges.py").write_text("from .positions import buckets\n")
    (package / "modeling" / "positions.py").write_text("import nmt.config\n")
    (package / "errors.py").write_text("def later():\n    import nmt.cell\n")
    code, graph = import_graph("--root", str(package))
    assert code == 1 and graph["circles"] == [["nmt.config", "nmt.modeling.edges", "nmt.modeling.positions"]]
    assert graph["upward"] == [["nmt.config", "nmt.modeling.edges"], ["nmt.errors", "nmt.cell"]]
