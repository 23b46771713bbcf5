"""What the grading tests share: a temporary copy of a course, `make` on it, and papermill runs that allow errors."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.course import assignments
from helpers.course.autograde import SEED_NAME, STUDENT_NAME

ROOT = Path(__file__).resolve().parents[1]
COURSE_FILES = ("nbgrader_config.py", "roster.csv")


def copy_course(destination: Path, source_root: Path = ROOT / "assignments") -> Path:
    """A fresh course folder at ``destination``: the config, the roster and source/ of ``source_root`` (nothing generated)."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in COURSE_FILES:
        shutil.copy(source_root / name, destination / name)
    shutil.copytree(source_root / "source", destination / "source", ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
    return destination


def environment() -> dict[str, str]:
    """The environment for subprocesses: this venv's bin/ first on PATH (nbgrader calls `alembic`)."""
    return {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}


def make(target: str, course: Path, *variables: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """``make <target> COURSE=<course> ...`` in the repository, output captured (the way a TA runs it)."""
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), target, f"COURSE={course}", *variables],
        capture_output=True, text=True, env=environment(), timeout=timeout,
    )


def grading_cli(course: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """``python -m helpers.course.grading --course <course> <args>``, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "helpers.course.grading", "--course", str(course), *args],
        capture_output=True, text=True, env=environment(), timeout=timeout, cwd=ROOT,
    )


def submit(course: Path, student: str, assignment: str, notebooks: dict[str, object], extra_files: dict[str, str] | None = None) -> Path:
    """Drop a submission into submitted/<student>/<assignment>/: notebooks (nbformat objects, or raw text) by file name."""
    folder = course / "submitted" / student / assignment
    folder.mkdir(parents=True, exist_ok=True)
    for name, nb in notebooks.items():
        if isinstance(nb, str):
            (folder / name).write_text(nb)
        else:
            nbformat.write(nb, folder / name)
    for name, text in (extra_files or {}).items():
        (folder / name).write_text(text)
    return folder


def read_notebooks(folder: Path) -> dict[str, nbformat.NotebookNode]:
    """The assignment notebooks of ``folder`` (a source or release folder), by file name."""
    return {p.name: assignments.read(p) for p in assignments.notebooks(folder)}


@dataclass
class ErrorRun:
    """A notebook executed to the end with errors allowed: which cells raised."""

    notebook: nbformat.NotebookNode
    errored: list[int]  # indices of the cells that raised
    unexecuted: list[int]  # indices of code cells that never ran


TEST_GRADING_SEED = 20261128  # the hidden tests' GRADING_SEED where a test runs a source notebook outside the grader
TEST_GRADING_STUDENT = "ada"  # and their GRADING_STUDENT


def execute_allowing_errors(path: Path, output: Path, timeout: int = 600, student: str = TEST_GRADING_STUDENT) -> ErrorRun:
    """Execute ``path`` with papermill, continuing past failing cells, in the notebook's own folder (hidden tests graded
    as ``student``'s)."""
    import papermill
    from papermill.exceptions import PapermillExecutionError

    try:
        papermill.execute_notebook(str(path), str(output), parameters={SEED_NAME: TEST_GRADING_SEED, STUDENT_NAME: student}, cwd=str(path.parent), progress_bar=False,
                                   execution_timeout=timeout, allow_errors=True)
    except PapermillExecutionError:
        pass  # papermill reports the first error after running every cell; we look at all of them below
    executed = nbformat.read(output, as_version=4)
    executed.cells = [c for c in executed.cells if "papermill-error-cell-tag" not in c.metadata.get("tags", [])]
    errored = [i for i, c in enumerate(executed.cells) if any(o.get("output_type") == "error" for o in c.get("outputs", []))]
    unexecuted = [i for i, c in enumerate(executed.cells) if c.cell_type == "code" and c.source.strip() and c.execution_count is None]
    return ErrorRun(executed, errored, unexecuted)


def hidden_test_lines(nb) -> list[str]:
    """Distinctive lines of the hidden-test regions of a source notebook (those that appear nowhere else in it)."""
    hidden, visible = [], []
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if assignments.HIDDEN_BEGIN in line:
                inside = True
            elif assignments.HIDDEN_END in line:
                inside = False
            else:
                (hidden if inside else visible).append(line.strip())
    return [line for line in hidden if len(line) >= 20 and line not in visible]


# ---------------------------------------------------------------- tiny assignments for the pipeline's own tests


def _cell(source: str, **nbgrader) -> nbformat.NotebookNode:
    meta = {"grade": False, "solution": False, "locked": False, "schema_version": 3, **nbgrader}
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta})


def tiny_notebook(points: dict[int, float]) -> nbformat.NotebookNode:
    """A notebook with one task per entry of ``points``: task K asks for ``fK(x) = x + K`` (a visible and a hidden test)."""
    cells = [nbformat.v4.new_markdown_cell("A tiny assignment for testing the grading pipeline.")]
    for task, value in points.items():
        cells.append(_cell(f"def f{task}(x):\n    ### BEGIN SOLUTION\n    return x + {task}\n    ### END SOLUTION", solution=True, grade_id=f"task{task}_f{task}"))
        test = f"assert f{task}(1) == {1 + task}\n### BEGIN HIDDEN TESTS\nassert f{task}(10) == {10 + task}, 'hidden check of f{task}'\n### END HIDDEN TESTS"
        cells.append(_cell(test, grade=True, locked=True, points=value, grade_id=f"task{task}_test"))
    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": kernelspec})


def tiny_course(root: Path, parts: dict[str, dict[str, dict[int, float]]], gradebook: Path | None = None) -> Path:
    """A course at ``root`` with the kit's config and roster and tiny assignments: {assignment: {notebook: {task: points}}}.

    ``gradebook``: an empty gradebook to start from (creating one costs nbgrader a few seconds).
    """
    root.mkdir(parents=True, exist_ok=True)
    for name in COURSE_FILES:
        shutil.copy(ROOT / "assignments" / name, root / name)
    if gradebook is not None:
        shutil.copy(gradebook, root / "gradebook.db")
    for assignment, notebooks in parts.items():
        (root / "source" / assignment).mkdir(parents=True)
        for name, points in notebooks.items():
            nbformat.write(tiny_notebook(points), root / "source" / assignment / name)
    return root


def tasks_only(nb, tasks: set[int]):
    """A copy of ``nb`` cut to its code cells that belong to no task and to ``tasks``: a shortcut's run costs those
    tasks' cells only (a task's tests never use another task's work: they take the instructors' files)."""
    trimmed = nbformat.reads(nbformat.writes(nb), as_version=4)
    kept = []
    for cell in trimmed.cells:
        owner, grade_id = assignments.task_of(cell), assignments.grade_id(cell)
        setup_of = re.match(r"setup_task(\d+)", grade_id or "")
        if owner is None and setup_of:  # a setup cell that only one task's cells use
            owner = int(setup_of.group(1))
        if cell.cell_type == "code" and (owner is None or owner in tasks):
            kept.append(cell)
    trimmed.cells = kept
    return trimmed


def with_solution(nb, grade_id: str, source: str):
    """A copy of ``nb`` whose solution cell ``grade_id`` holds ``source`` instead."""
    changed = nbformat.reads(nbformat.writes(nb), as_version=4)
    for cell in changed.cells:
        if assignments.grade_id(cell) == grade_id:
            cell.source = source
    return changed
