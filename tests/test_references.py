"""The instructors' files for later tasks' tests: made from the source notebook's cells, shown read-only to the sandbox."""
from __future__ import annotations

import hashlib
import time

import nbformat
import pytest

from helpers.course import references, sandbox

pytestmark = pytest.mark.grading


def _source(folder, cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source, metadata={"nbgrader": {"grade_id": grade_id, "solution": grade_id.startswith("task"),
                                                                        "grade": False, "locked": False, "schema_version": 3}})
                for grade_id, source in cells.items()]
    nbformat.write(nb, folder / "part1.ipynb")
    (folder / "lab.py").write_text("def twice(x):\n    return 2 * x\n")
    return folder


def test_make_runs_the_declared_cells_with_the_support_modules_and_writes_readable_files(tmp_path):
    source = _source(tmp_path, {"setup": "from lab import twice", "task1_write": "def write(path):\n    path.write_text(str(twice(21)))\n",
                                "task2_other": "raise AssertionError('not declared, so never run')"})
    digest = hashlib.sha256()
    before = digest.copy().hexdigest()
    out = references.make(source, source, {"part1.ipynb": (("setup", "task1_write"), "write(REFERENCES / 'answer.txt')")},
                          tmp_path / "made", digest)
    assert (out / "answer.txt").read_text() == "42"
    assert (out / "answer.txt").stat().st_mode & 0o777 == 0o644 and out.stat().st_mode & 0o777 == 0o755
    assert digest.hexdigest() != before, "the grade depends on the code that made the files"


def test_a_function_defined_by_a_declared_cell_has_its_source_for_inspect(tmp_path):
    """Support code may read a solution's source (HW3 packages a service's source into an image)."""
    source = _source(tmp_path, {"task1_f": "def f():\n    return 1\n"})
    out = references.make(source, source, {"part1.ipynb": (("task1_f",), "import inspect\n(REFERENCES / 'f.py').write_text(inspect.getsource(f))")},
                          tmp_path / "made")
    assert (out / "f.py").read_text().startswith("def f():")


@pytest.mark.parametrize("cells, make, says", [
    ({"task1_f": "1 / 0"}, "pass", "ZeroDivisionError"),
    ({"task1_f": "pass"}, "undefined_name()", "NameError"),
])
def test_a_failure_to_make_them_is_the_graders_error_with_the_childs_last_lines(tmp_path, cells, make, says):
    source = _source(tmp_path, cells)
    with pytest.raises(references.ReferenceError, match=says):
        references.make(source, source, {"part1.ipynb": (("task1_f",), make)}, tmp_path / "made")


def test_a_cell_the_declaration_names_but_the_notebook_lacks_is_named(tmp_path):
    source = _source(tmp_path, {"task1_f": "pass"})
    with pytest.raises(references.ReferenceError, match="no cell task1_g"):
        references.make(source, source, {"part1.ipynb": (("task1_g",), "pass")}, tmp_path / "made")


@pytest.mark.parametrize("table", [{"references": {"part1.ipynb": {"cells": "task1"}}}, {"references": {"part1": {"cells": [], "make": ""}}},
                                   {"references": ["part1.ipynb"]}])
def test_a_malformed_declaration_says_what_the_table_must_hold(table):
    with pytest.raises(ValueError, match="references must map a notebook file name"):
        references.declared(table, "assignment.toml")


def test_outside_grading_there_is_no_instructors_file(monkeypatch):
    monkeypatch.delenv(references.REFERENCES_ENV, raising=False)
    assert references.instructors_file("model.onnx") is None


def test_a_sandboxed_cell_reads_the_instructors_files_and_can_neither_change_nor_redirect_them(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    (made / "model.txt").write_text("the instructors' file")
    made.chmod(0o755)
    (made / "model.txt").chmod(0o644)
    reads = ("from helpers.course.references import REFERENCES_ENV, instructors_file\n"
             "path = instructors_file('model.txt')\n"
             "assert path.read_text() == \"the instructors' file\", path\n"
             "try:\n    path.write_text('changed')\n    raise AssertionError('the file is writable')\nexcept OSError:\n    pass\n")
    redirects = ("import os, pathlib\nmine = pathlib.Path('/tmp/mine')\nmine.mkdir()\n(mine / 'model.txt').write_text('mine')\n"
                 "os.environ[REFERENCES_ENV] = str(mine)\n"
                 "assert instructors_file('model.txt').read_text() == \"the instructors' file\", 'the environment redirected it'\n")
    # without bubblewrap the folder is named by the environment alone, which the submission's process can change
    cells = [{"index": 0, "role": "test", "source": reads + (redirects if sandbox.bubblewrap() else "")}]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(cell_s=60), time.monotonic() + 90, references=made)
    outcome = run.cells[0].outcome
    assert outcome.get("error") is None, (outcome, run.log[-2000:])
    assert (made / "model.txt").read_text() == "the instructors' file"


def test_references_made_before_grading_score_a_later_task_and_a_failure_to_make_them_is_the_graders(tmp_path, capsys):
    """Through the real grader: task 2's test reads the instructors' file that task 1's solution cell made (so a
    submission with task 1 unsolved keeps task 2's point); an assignment whose files cannot be made has every
    submission recorded as the grader's error, and the other assignments are graded."""
    from helpers.course import assignments, grading
    from helpers.course.autograde import GRADER_SIDE
    from helpers.course.grading import Course

    from .grading_support import submit, tiny_course

    works, broken = "hw2_profiling", "hw4_monitoring"
    root = tiny_course(tmp_path / "course", {works: {"part1_sums.ipynb": {1: 1.0, 2: 1.0}}, broken: {"part1_sums.ipynb": {1: 1.0}}})
    source = root / "source" / works / "part1_sums.ipynb"
    nb = assignments.read(source)
    test2 = next(c for c in nb.cells if assignments.grade_id(c) == "task2_test")
    test2.source = ("from helpers.course.references import instructors_file\n"
                    "assert instructors_file('eleven.txt').read_text() == '11', 'the instructors file holds f1(10)'\n" + test2.source)
    nbformat.write(nb, source)
    (root / "source" / works / "assignment.toml").write_text(
        '[references."part1_sums.ipynb"]\ncells = ["task1_f1"]\nmake = "(REFERENCES / \'eleven.txt\').write_text(str(f1(10)))"\n')
    (root / "source" / broken / "assignment.toml").write_text('[references."part1_sums.ipynb"]\ncells = ["task1_f1"]\nmake = "1 / 0"\n')
    course = Course(root)
    grading.release(course)
    for assignment in (works, broken):
        released = assignments.read(root / "release" / assignment / "part1_sums.ipynb")
        solved = assignments.with_task_solutions(released, assignments.read(root / "source" / assignment / "part1_sums.ipynb"), {2})
        submit(root, "alice", assignment, {"part1_sums.ipynb": solved})
    report = grading.autograde(course, student_ids=["alice"], cell_timeout=60, jobs=1)
    scores = {row.assignment_id: (row.status, row.score, row.reason) for row in report.rows}
    assert scores[works][:2] == ("graded", 1.0), scores  # task 1 unsolved, task 2's test read the instructors' file
    status, _, reason = scores[broken]
    assert status == "error" and GRADER_SIDE in reason and "ZeroDivisionError" in reason, scores
    assert "ZeroDivisionError" in capsys.readouterr().out, "the grader says once why the assignment could not be graded"


def test_a_killed_graders_scratch_folders_are_swept_and_a_running_ones_kept(tmp_path):
    """A grader killed mid-run (tests/test_sandboxed_grading.py kills one) skips its cleanup: the next sweeps it."""
    import subprocess
    import sys

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    dead = [tmp_path / f"{kind}{gone}-abc" for kind in sandbox.SCRATCH_KINDS]
    alive = tmp_path / sandbox.scratch_prefix("edl-grade-")
    other = tmp_path / "edl-grade-notapid"
    for path in (*dead, alive, other):
        path.mkdir()
        (path / "file").write_text("x")
    assert sandbox.sweep_scratch(tmp_path) == len(dead)
    assert not any(path.exists() for path in dead) and alive.exists() and other.exists()
