"""A synthetic study's grid (experiments/grid.py): a recorded cell is never run again, a failed cell costs only itself
and is named (exit 2), records are written whole, and a study stopped by Ctrl-C, SIGTERM or SIGKILL (or a worker
killed) takes its workers along, keeps its finished records and continues where it stopped."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import grid
from nmt.errors import UserError
from tests.conftest import INTERACTIVE, ROOT, wait_for

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "4"}


def _cell(name: str, folder: str) -> str:
    import torch

    if name == "bad":
        raise ValueError("no such setting")
    with open(Path(folder) / "ran.txt", "a") as ran:
        ran.write(name + "\n")
    grid.write_record(Path(folder) / f"{name}.json", {"name": name})
    return f"{name}: done on {torch.get_num_threads()} thread(s)"


def test_a_recorded_cell_is_skipped_and_a_failed_one_costs_only_itself(tmp_path, capsys):
    grid.write_record(tmp_path / "a.json", {"name": "a", "kept": True})  # a cell finished by an earlier run
    cells = [grid.Cell(tmp_path / f"{name}.json", (name, str(tmp_path))) for name in ("a", "bad", "b", "c")]
    with pytest.raises(UserError, match=rf"^1 of 3 runs failed .*: {tmp_path / 'bad.json'}$"):
        grid.run_cells(_cell, cells, jobs=2)
    printed = capsys.readouterr().out
    assert f"{tmp_path / 'bad.json'}: FAILED (ValueError: no such setting)" in printed
    assert "b: done on 1 thread(s)" in printed and "c: done on 1 thread(s)" in printed  # one thread a cell
    assert sorted((tmp_path / "ran.txt").read_text().split()) == ["b", "c"]
    assert json.loads((tmp_path / "a.json").read_text()) == {"name": "a", "kept": True}
    with pytest.raises(UserError, match="1 of 1 runs failed"):  # run again: only the failed cell is tried
        grid.run_cells(_cell, cells, jobs=2)
    assert sorted((tmp_path / "ran.txt").read_text().split()) == ["b", "c"]
    assert grid.run_cells(_cell, cells[::2], jobs=1) == []  # all recorded: nothing runs


def test_a_record_is_written_whole_under_another_name_then_renamed(tmp_path, monkeypatch):
    record, written, write_text = tmp_path / "run" / "cell.json", [], Path.write_text

    def watched(path, text):  # what is written, and whether the record's own name could be read meanwhile
        written.append((path.name, record.exists() and record.read_text()))
        return write_text(path, text)

    monkeypatch.setattr(Path, "write_text", watched)
    grid.write_record(record, {"score": 1.0})
    grid.write_record(record, {"score": 2.0})  # an old record: replaced whole
    assert [seen for _, seen in written] == [False, '{\n "score": 1.0\n}\n']  # the old one whole, never a part
    assert all(name != record.name for name, _ in written)
    assert json.loads(record.read_text()) == {"score": 2.0}
    assert [p.name for p in record.parent.iterdir()] == ["cell.json"]  # no temporary left


STUDY = """import os, sys, time
from pathlib import Path
from experiments.grid import Cell, run_cells, write_record
from nmt.cli import ends_in_one_line

def run(i, folder):
    Path(folder, f"started{i}").write_text(str(os.getpid()))
    with open(Path(folder, "ran.txt"), "a") as ran:
        ran.write(f"{i}\\n")
    if i > 0 and not Path(folder, "fast").exists():
        time.sleep(120)  # still training when the study is stopped
    write_record(Path(folder, f"{i}.json"), {"cell": i})
    return f"cell {i}: done"

if __name__ == "__main__":
    with ends_in_one_line("study"):
        run_cells(run, [Cell(Path(sys.argv[1], f"{i}.json"), (i, sys.argv[1])) for i in range(4)], jobs=2)
"""


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (its parent was killed)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", pytest.param("Ctrl-C", marks=pytest.mark.slow),
                                 pytest.param("a worker killed", marks=pytest.mark.slow)])
def test_a_stopped_study_takes_its_workers_along_and_continues(tmp_path, how):
    script = tmp_path / "study.py"
    script.write_text(STUDY)
    study = subprocess.Popen([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=ENV, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, **INTERACTIVE)
    wait_for(lambda: all((tmp_path / name).exists() for name in ("0.json", "started1", "started2"))
             or study.poll() is not None, 120)
    workers = {int((tmp_path / f"started{i}").read_text()) for i in (1, 2)}
    if how == "Ctrl-C":  # the terminal signals the whole foreground group: the study and its workers
        os.killpg(study.pid, signal.SIGINT)
    elif how == "a worker killed":  # by the OOM killer
        os.kill(min(workers), signal.SIGKILL)
    else:
        study.send_signal(getattr(signal, how))
    out, err = study.communicate(timeout=60)
    wait_for(lambda: all(ended(pid) for pid in workers), 30)  # no cell trains on for nobody
    if how == "SIGKILL":  # no handler runs, as from a scheduler or the OOM killer
        assert study.returncode == -signal.SIGKILL
    elif how == "a worker killed":
        assert study.returncode == 2 and err.strip().splitlines() == [
            "error: a worker of the study was killed (exit code {SIGKILL(-9)}), and with it the running cells: 1 of 4 "
            "runs recorded; run the same command again to continue (recorded runs are kept)"], err
    else:
        assert study.returncode == 75 and "Traceback" not in err, err[-2000:]
        assert err.strip().splitlines() == ["stopped: 1 of 4 runs recorded; run the same command again to continue "
                                            "(recorded runs are kept)"], err
    assert "cell 0: done" in out or how == "SIGKILL"
    assert sorted(p.name for p in tmp_path.glob("*.json")) == ["0.json"]
    (tmp_path / "fast").touch()
    again = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert sorted(again.stdout.split("\n")) == ["", "cell 1: done", "cell 2: done", "cell 3: done"]
    assert (tmp_path / "ran.txt").read_text().split().count("0") == 1  # the recorded cell never ran again
