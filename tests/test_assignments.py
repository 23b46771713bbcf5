"""Every assignment under assignments/source/ ships working: solutions pass, the student version runs and scores 0.

Generic: a new assignment folder is covered with no new test. One temporary copy of the
course goes through the whole pipeline once (make release, submissions dropped into
submitted/, make autograde, make grades, make feedback) and the checks below read its
results. The source notebooks are checked by the runner that grades them (alice's run), not by a second
execution under a Jupyter kernel:

- alice hands in the solutions (100%, every cell passing, no server left listening), bob the untouched student version (0%),
  carol one part only, the student version with task 1 solved (exactly that task's points),
  dmitri a corrupt first notebook (failed with its reason, 0%),
  zoe, who is not on the roster, the last notebook only (graded all the same),
  erin every part of more than one task with all but task 1 solved, frank (not on the roster) every part of
  three or more tasks with all but task 2 solved: a broken task costs only its own points, since later tasks'
  tests use instructors' files (helpers.course.references) or data of their own, never an earlier task's result.
"""
from __future__ import annotations

import csv
import html
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.course import assignments, autograde
from helpers.course.grading import WEIGHTS, Course, course_grade, read_status

from .grading_support import ROOT, copy_course, hidden_test_lines, make, submit

pytestmark = [pytest.mark.notebooks, pytest.mark.grading, pytest.mark.instructor, pytest.mark.timeout(2400)]  # the module fixture grades the whole course

SOURCE = ROOT / "assignments" / "source"
ASSIGNMENTS = sorted(p.name for p in SOURCE.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))) if SOURCE.exists() else []
NOTEBOOKS = [(a, nb.name) for a in ASSIGNMENTS for nb in assignments.notebooks(SOURCE / a)]


def test_the_course_has_assignments():
    assert ASSIGNMENTS, "no assignment folders under assignments/source/"
    assert all(a in WEIGHTS for a in ASSIGNMENTS), f"assignment ids must be among {sorted(WEIGHTS)}: {ASSIGNMENTS}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_assignment_follows_the_authoring_convention(assignment):
    assert assignments.convention_problems(SOURCE / assignment) == []


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_every_test_cell_says_what_it_checks_and_which_property_failed(assignment):
    """The feedback teaches: each test cell prints what it checks, each assert names the property and by how much."""
    assert assignments.feedback_problems(SOURCE / assignment) == []


# ---------------------------------------------------------------- one pass of the whole pipeline


@dataclass
class GradedCourse:
    course: Path
    outputs: dict[str, str]  # make target -> its stdout + stderr
    status: dict[tuple[str, str], dict]
    course_grades: dict[str, dict[str, str]]

    def outcome(self, student: str, assignment: str) -> dict:
        return self.status.get((student, assignment))


def source_notebooks(assignment: str) -> dict[str, object]:
    return {p.name: assignments.read(p) for p in assignments.notebooks(SOURCE / assignment)}


def released_notebooks(course: Path, assignment: str) -> dict[str, object]:
    return {p.name: assignments.read(p) for p in assignments.notebooks(course / "release" / assignment)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory) -> GradedCourse:
    course = copy_course(tmp_path_factory.mktemp("course") / "assignments")
    outputs = {}
    released = make("release", course)
    outputs["release"] = released.stdout + released.stderr
    assert released.returncode == 0, outputs["release"]
    for assignment in ASSIGNMENTS:
        solutions, student_version = source_notebooks(assignment), released_notebooks(course, assignment)
        first, last = next(iter(student_version)), list(student_version)[-1]
        submit(course, "alice", assignment, solutions)
        submit(course, "bob", assignment, student_version)
        part = carol_part(assignment)
        submit(course, "carol", assignment, {part: assignments.with_task_solutions(student_version[part], solutions[part], {1})})
        submit(course, "dmitri", assignment, {**student_version, first: '{"cells": [ this is not a notebook'})
        submit(course, "zoe", assignment, {last: student_version[last]})
        for student, task in BROKEN_TASK.items():
            if parts_broken(assignment, task):
                submit(course, student, assignment, {part: assignments.with_task_solutions(student_version[part], solutions[part], set(tasks) - {task})
                                                     for part, tasks in parts_broken(assignment, task).items()})
    for target in ("autograde", "grades", "feedback"):
        result = make(target, course)
        outputs[target] = result.stdout + result.stderr
        assert result.returncode == 0, f"make {target} failed:\n{outputs[target]}"
    with (course / "course_grades.csv").open(newline="") as f:
        table = {row["student_id"]: row for row in csv.DictReader(f)}
    return GradedCourse(course, outputs, read_status(Course(course)), table)


def carol_part(assignment: str) -> str:
    """The part carol hands in: the first with more than one task, so that task 1 alone is partial credit within it."""
    points = {name: assignments.task_points(nb) for name, nb in source_notebooks(assignment).items()}
    return next((name for name, tasks in points.items() if len(tasks) > 1), next(iter(points)))


BROKEN_TASK = {"erin": 1, "frank": 2}  # each hands in solutions with that task left as released, in every part with a later task


def parts_broken(assignment: str, task: int) -> dict[str, dict[int, float]]:
    """{part: its tasks' points} of the parts in which ``task`` has a later task whose tests could depend on it."""
    points = {name: assignments.task_points(nb) for name, nb in source_notebooks(assignment).items()}
    return {name: tasks for name, tasks in points.items() if task in tasks and max(tasks) > task}


def max_points(assignment: str) -> float:
    return sum(assignments.max_points(nb) for nb in source_notebooks(assignment).values())


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solutions_score_full_marks(graded, assignment):
    outcome = graded.outcome("alice", assignment)
    assert outcome["status"] == "graded", outcome["reason"]
    assert float(outcome["score"]) == float(outcome["max_score"]) == max_points(assignment), outcome
    assert float(graded.course_grades["alice"][assignment]) == 100.0


@pytest.mark.parametrize("assignment, notebook", NOTEBOOKS)
def test_source_notebook_passes_every_test_when_graded_and_stops_its_servers(graded, assignment, notebook):
    """Alice's solutions as the grader ran them (the one way the kit executes an assignment notebook): no cell failed,
    and nothing the notebook started was still listening after its last cell."""
    nb = assignments.read(graded.course / "autograded" / "alice" / assignment / notebook)
    failed = {assignments.grade_id(c) or i: [o.get("evalue", "")[:300] for o in c.outputs if o.get("output_type") == "error"]
              for i, c in enumerate(nb.cells) if c.cell_type == "code"}
    failed = {cell: errors for cell, errors in failed.items() if errors}
    assert not failed, f"{assignment}/{notebook} (with solutions) failed when graded: {failed}"
    left = [note for note in graded.outcome("alice", assignment)["reason"].split("; ")
            if note.startswith(notebook) and autograde.LEFT_LISTENING in note]
    assert not left, left


@pytest.mark.parametrize("assignment, notebook", NOTEBOOKS)
def test_released_notebook_holds_no_solution_and_no_hidden_test(graded, assignment, notebook):
    source = assignments.read(SOURCE / assignment / notebook)
    released = assignments.read(graded.course / "release" / assignment / notebook)
    text = "\n".join(c.source for c in released.cells)
    assert assignments.SOLUTION_BEGIN not in text and assignments.HIDDEN_BEGIN not in text
    solutions = {assignments.grade_id(c): c.source for c in source.cells if assignments.is_solution(c)}
    for cell in released.cells:
        if assignments.is_solution(cell):
            solution_lines = {line.strip() for line in solutions[assignments.grade_id(cell)].split(assignments.SOLUTION_BEGIN, 1)[1].split(assignments.SOLUTION_END, 1)[0].splitlines()}
            leaked = solution_lines & {line.strip() for line in cell.source.splitlines()} - {""}
            assert not leaked, f"solution lines left in {assignments.grade_id(cell)}: {sorted(leaked)}"
    leaked_tests = [line for line in hidden_test_lines(source) if line in text]
    assert not leaked_tests, f"hidden test lines in the released notebook: {leaked_tests}"


@pytest.mark.parametrize("assignment, notebook", NOTEBOOKS)
def test_released_notebook_runs_to_the_end_where_only_test_cells_fail(graded, assignment, notebook):
    """Bob's untouched student version as the grader ran it: every cell ran, and only autograded tests failed."""
    nb = assignments.read(graded.course / "autograded" / "bob" / assignment / notebook)
    unexecuted = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip() and c.execution_count is None]
    errored = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(o.get("output_type") == "error" for o in c.outputs)]
    assert not unexecuted, f"cells {unexecuted} never ran"
    not_tests = [i for i in errored if not assignments.is_graded_test(nb.cells[i])]
    assert not not_tests, f"cells other than autograded tests fail in the student version: {[(i, nb.cells[i].source[:80], nb.cells[i].outputs) for i in not_tests]}"
    assert errored, "no test fails in the unsolved notebook: do its tests test anything?"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_untouched_student_version_scores_zero(graded, assignment):
    outcome = graded.outcome("bob", assignment)
    assert outcome["status"] == "graded", outcome["reason"]
    assert float(outcome["score"]) == 0.0 and float(outcome["max_score"]) == max_points(assignment)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_task_1_alone_scores_exactly_task_1s_points(graded, assignment):
    part = carol_part(assignment)
    expected = assignments.task_points(source_notebooks(assignment)[part]).get(1, 0.0)
    outcome = graded.outcome("carol", assignment)
    assert outcome["status"] == "graded", outcome["reason"]
    assert expected > 0, "task 1 has no test points"
    assert float(outcome["score"]) == pytest.approx(expected), f"task 1 of {part} is worth {expected} points, carol got {outcome['score']}"


@pytest.mark.parametrize("student", sorted(BROKEN_TASK))
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_a_broken_task_costs_only_its_own_points(graded, assignment, student):
    task = BROKEN_TASK[student]
    parts = parts_broken(assignment, task)
    if not parts:
        assert graded.outcome(student, assignment) is None, "no part has a task after this one, so nothing was handed in"
        return
    expected = sum(sum(points.values()) - points[task] for points in parts.values())
    outcome = graded.outcome(student, assignment)
    assert outcome["status"] == "graded", outcome["reason"]
    assert float(outcome["score"]) == pytest.approx(expected), (
        f"{student} broke task {task} of {', '.join(parts)} and solved the rest ({expected:g} points), but got {outcome['score']}: "
        f"a later task's tests depend on task {task}'s work")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_corrupt_submission_fails_with_its_reason_and_scores_zero(graded, assignment):
    first = assignments.notebooks(SOURCE / assignment)[0].name
    outcome = graded.outcome("dmitri", assignment)
    assert outcome["status"] == "failed"
    assert first in outcome["reason"] and "not a valid notebook" in outcome["reason"], outcome["reason"]
    assert float(graded.course_grades["dmitri"][assignment]) == 0.0
    assert "dmitri" in graded.outputs["autograde"] and "dmitri" in graded.outputs["grades"]  # reported by both commands


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_student_not_on_the_roster_is_graded_and_reported(graded, assignment):
    outcome = graded.outcome("zoe", assignment)
    assert outcome["status"] == "graded" and outcome["on_roster"] == "False", outcome
    if len(assignments.notebooks(SOURCE / assignment)) > 1:
        assert "missing" in outcome["reason"], "the notebooks zoe did not hand in are reported as missing"
    assert re.search(r"not on the roster.*zoe", graded.outputs["grades"]), graded.outputs["grades"]


def test_course_grades_follow_the_weights(graded):
    for student, row in graded.course_grades.items():
        percents = {a: float(row[a]) for a in WEIGHTS}
        assert float(row["course_grade"]) == pytest.approx(course_grade(percents), abs=0.006), student
    shipped = sum(WEIGHTS[a] for a in ASSIGNMENTS)
    assert float(graded.course_grades["alice"]["course_grade"]) == pytest.approx(100 * shipped, abs=0.01)
    assert float(graded.course_grades["bob"]["course_grade"]) == 0.0
    assert set(graded.course_grades) >= {"alice", "bob", "carol", "dmitri", "erin", "frank", "zoe"}  # the roster, and each who handed in


def test_grades_csv_is_nbgraders_export_of_every_submission(graded):
    with (graded.course / "grades.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {"assignment", "student_id", "score", "max_score"} <= set(rows[0])
    scores = {(r["student_id"], r["assignment"]): float(r["score"]) for r in rows}
    for (student, assignment), outcome in graded.status.items():
        assert scores[(student, assignment)] == pytest.approx(float(outcome["score"])), (student, assignment)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_feedback_shows_the_score_but_no_hidden_test(graded, assignment):
    for student in ("alice", "bob"):
        pages = sorted((graded.course / "feedback" / student / assignment).glob("*.html"))
        assert [p.stem for p in pages] == [p.stem for p in assignments.notebooks(SOURCE / assignment)]
        for page in pages:
            text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
            assert "Score:" in text
            hidden = [line for line in hidden_test_lines(assignments.read(SOURCE / assignment / f"{page.stem}.ipynb")) if line in text]
            assert not hidden, f"{student}'s feedback {page.name} shows hidden tests: {hidden[:3]}"
