"""The kit's assignment-authoring convention, read from the notebooks: cells by role, points per task, checks.

An assignment is ``assignments/source/<id>/`` with one ``partN_<name>.ipynb`` per part.
Solution and autograded test cells carry nbgrader metadata and a ``grade_id`` that
starts with ``task<K>_``, so the points of task K, and a submission that solves only
task K, can be derived from the notebooks alone (see assignments/README.md).
"""
from __future__ import annotations

import ast
import copy
import re
from pathlib import Path

import nbformat

TASK_ID = re.compile(r"^task(\d+)_")
PART_NAME = re.compile(r"^part(\d+)_\w+\.ipynb$")
SOLUTION_BEGIN, SOLUTION_END = "### BEGIN SOLUTION", "### END SOLUTION"
HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def split_hidden(source: str) -> tuple[list[str], list[str]]:
    """A test cell's lines outside and inside its ### BEGIN/END HIDDEN TESTS regions (marker lines in neither)."""
    visible, hidden, inside = [], [], False
    for line in source.splitlines():
        if HIDDEN_BEGIN in line:
            inside = True
        elif HIDDEN_END in line:
            inside = False
        else:
            (hidden if inside else visible).append(line)
    return visible, hidden


def nbgrader_metadata(cell) -> dict:
    """The cell's nbgrader metadata, or {} for a plain cell."""
    return cell.get("metadata", {}).get("nbgrader", {})


def is_solution(cell) -> bool:
    return bool(nbgrader_metadata(cell).get("solution"))


def is_graded_test(cell) -> bool:
    """An autograded test cell: graded, not a solution (nbgrader's 'autograder tests' cell)."""
    meta = nbgrader_metadata(cell)
    return bool(meta.get("grade")) and not meta.get("solution") and cell.get("cell_type") == "code"


def grade_id(cell) -> str | None:
    return nbgrader_metadata(cell).get("grade_id")


def task_of(cell) -> int | None:
    """K for a cell whose grade_id starts with ``task<K>_``, else None."""
    match = TASK_ID.match(grade_id(cell) or "")
    return int(match.group(1)) if match else None


def read(path: str | Path):
    return nbformat.read(Path(path), as_version=4)


def notebooks(folder: str | Path) -> list[Path]:
    """The assignment's notebooks, in part order (part1_..., part2_..., then any others by name)."""
    return sorted(Path(folder).glob("*.ipynb"), key=lambda path: part_order(path.name))


def part_order(name: str):
    """Sort key of a notebook name: partN_... by N, then any others by name (with or without .ipynb)."""
    match = re.match(r"^part(\d+)_", name)
    return (0, int(match.group(1)), name) if match else (1, 0, name)


def task_points(nb) -> dict[int, float]:
    """Points of each task's autograded test cells in one notebook: {K: points}."""
    points: dict[int, float] = {}
    for cell in nb.cells:
        if is_graded_test(cell) and task_of(cell) is not None:
            points[task_of(cell)] = points.get(task_of(cell), 0.0) + float(nbgrader_metadata(cell).get("points", 0))
    return points


def max_points(nb) -> float:
    return sum(float(nbgrader_metadata(c).get("points", 0)) for c in nb.cells if is_graded_test(c))


def with_task_solutions(released, source, tasks: set[int]):
    """A copy of the released notebook whose solution cells of ``tasks`` hold the source's solutions.

    This is a submission that solves exactly those tasks; by the convention it scores
    exactly their points.
    """
    solutions = {grade_id(c): c.source for c in source.cells if is_solution(c) and task_of(c) in tasks}
    nb = copy.deepcopy(released)
    for cell in nb.cells:
        if is_solution(cell) and grade_id(cell) in solutions:
            cell.source = solutions[grade_id(cell)]
    return nb


def convention_problems(folder: str | Path) -> list[str]:
    """Every way the assignment folder breaks the authoring convention, as readable sentences ([] when none)."""
    folder = Path(folder)
    found = notebooks(folder)
    if not found:
        return [f"{folder.name}: no notebooks"]
    problems = []
    parts = sorted(int(PART_NAME.match(p.name).group(1)) for p in found if PART_NAME.match(p.name))
    problems += [f"{p.name}: name it partN_<short_name>.ipynb" for p in found if not PART_NAME.match(p.name)]
    if parts and parts != list(range(1, len(parts) + 1)):
        problems.append(f"{folder.name}: parts are numbered {parts}, expected 1..{len(parts)}")
    for path in found:
        problems += [f"{path.name}: {p}" for p in _notebook_problems(read(path))]
    return problems


def feedback_problems(folder: str | Path) -> list[str]:
    """Test cells that do not teach: a visible part that does not print what it checks, or an assert with no message
    (which property failed, and by how much, is what a student reads in the feedback)."""
    problems = []
    for path in notebooks(Path(folder)):
        for index, cell in enumerate(read(path).cells):
            if not is_graded_test(cell):
                continue
            where = f"{path.name}: cell {index} ({grade_id(cell)})"
            if "print(" not in cell.source.split(HIDDEN_BEGIN)[0]:
                problems.append(f"{where}: its visible part must print what the cell checks (first line: print(\"...\"))")
            try:
                tree = ast.parse(cell.source)
            except SyntaxError as error:
                problems.append(f"{where}: not Python ({error.msg}, line {error.lineno})")
                continue
            bare = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Assert) and node.msg is None]
            if bare:
                problems.append(f"{where}: the asserts on lines {bare} give no message: say which property failed and by how much")
    return problems


def _notebook_problems(nb) -> list[str]:
    problems = []
    if nb.metadata.get("kernelspec", {}).get("name") != "python3":
        problems.append("kernelspec must be python3")
    ids = [grade_id(c) for c in nb.cells if grade_id(c)]
    problems += [f"grade_id {i!r} is used twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    solution_tasks, test_tasks = set(), set()
    for index, cell in enumerate(nb.cells):
        where = f"cell {index} ({grade_id(cell) or 'no grade_id'})"
        source = cell.source
        if HIDDEN_BEGIN in source and not is_graded_test(cell):
            problems.append(f"{where}: hidden tests outside an autograded test cell")
        if not (is_solution(cell) or is_graded_test(cell)):
            continue
        if task_of(cell) is None:
            problems.append(f"{where}: grade_id must start with task<K>_")
        meta = nbgrader_metadata(cell)
        if meta.get("schema_version") != 3:
            problems.append(f"{where}: nbgrader schema_version must be 3")
        if is_solution(cell):
            solution_tasks.add(task_of(cell))
            problems += [f"{where}: {p}" for p in _solution_problems(cell)]
        else:
            test_tasks.add(task_of(cell))
            if "time.time()" in source or "time.time_ns()" in source:
                problems.append(f"{where}: a test reads the clock, so a regrade is not the same grade and a submission can find its "
                                "inputs: seed visible tests with a constant and hidden ones with GRADING_SEED (the grader's)")
            if not meta.get("locked") or float(meta.get("points", 0)) <= 0:
                problems.append(f"{where}: a test cell must be locked and worth points > 0")
    for task in sorted((solution_tasks ^ test_tasks) - {None}):
        kind = "solution cells but no test cell" if task in solution_tasks else "test cells but no solution cell"
        problems.append(f"task {task} has {kind}")
    return problems


def _solution_problems(cell) -> list[str]:
    if cell.cell_type != "code":
        return []
    lines = cell.source.splitlines()
    begins = [line for line in lines if SOLUTION_BEGIN in line]
    if not begins or not any(SOLUTION_END in line for line in lines):
        return ["a solution cell needs ### BEGIN SOLUTION / ### END SOLUTION"]
    if any(not line.startswith((" ", "\t")) for line in begins):
        return ["put the solution region inside a function or class body, so the released cell still runs"]
    return []
