"""Honest work under the grader's own load: each reference solution graded ROUNDS times at JOBS=2, beside another submission.

Every round regrades two submissions of one assignment at once, in sandboxes: the reference solution and the
untouched student version (which runs the same notebooks and scores 0). Targets: the reference scores full marks
in every round, the other submission 0 in every round, no round ends in a grader error.

    make bench B=reference_grades [ROUNDS=20] [A=hw3_deployment]

A quick run (the test suite's) grades one round of a one-task stand-in: the loop runs end to end in seconds.
"""
from __future__ import annotations

import os
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helpers.core.report import Report, column
from helpers.course import grading, sealed
from helpers.course.grading import Course

from ..grading_support import copy_course, read_notebooks, submit, tiny_course
from . import BenchResult, Target

JOBS = 2
STAND_IN = "hw2_profiling"


@dataclass
class Rounds:
    assignment: str = column("assignment")
    rounds: int = column("rounds")
    full: int = column("reference full marks")
    zero: int = column("other submission 0")
    errors: int = column("grader errors")
    worst: float = column("reference's lowest %", ".1f")
    seconds: float = column("median s per round", ".1f")
    lost: str = column("tests the reference failed (round: notebook/test)")


class ReferenceGrades(Report):
    title = f"Reference solutions graded at JOBS={JOBS} beside another submission"


def _rounds(root: Path, assignment: str, rounds: int) -> Rounds:
    course = Course(root)
    source = read_notebooks(root / "source" / assignment)
    released = read_notebooks(root / "release" / assignment)
    submit(root, "reference", assignment, source)
    submit(root, "student_version", assignment, released)
    full = zero = errors = 0
    worst, seconds, lost = 100.0, [], []
    for number in range(1, rounds + 1):
        report = grading.autograde(course, [assignment], jobs=JOBS, regrade=True)
        rows = {row.student_id: row for row in report.rows}
        reference, other = rows["reference"], rows["student_version"]
        errors += sum(row.status != "graded" for row in rows.values())
        full += reference.status == "graded" and reference.score == reference.max_score > 0
        zero += other.status == "graded" and other.score == 0
        worst = min(worst, reference.percent)
        seconds.append(max(row.seconds for row in rows.values()))
        lost += [f"{number}: {test}" for test in _failed_tests(course, assignment, "reference")]
    return Rounds(assignment, rounds, full, zero, errors, worst, statistics.median(seconds), "; ".join(lost) or "none")


def _failed_tests(course: Course, assignment: str, student: str) -> list[str]:
    """The graded test cells that did not earn their points in the student's last grading: "notebook/grade id"."""
    from nbgrader.api import MissingEntry

    with course.gradebook() as gb:
        try:
            submission = gb.find_submission(assignment, student)
        except MissingEntry:
            return ["(no grades recorded)"]
        return [f"{notebook.name}/{grade.name}" for notebook in submission.notebooks for grade in notebook.grades
                if (grade.score or 0) < grade.max_score]


def _rounds_asked(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise SystemExit(f"ROUNDS={text}: give the number of rounds per assignment, a whole number from 1 (e.g. ROUNDS=20)")
    return int(text)


def run(quick: bool) -> BenchResult:
    if not quick and sealed.locked():
        return BenchResult("reference_grades", [], [Target.not_here("reference solutions graded beside the student versions",
                                                                    "full marks and 0", sealed.MESSAGE)])
    rounds = 1 if quick else _rounds_asked(os.environ.get("EDL_ROUNDS", "20"))
    with tempfile.TemporaryDirectory(prefix="edl-bench-reference-") as folder:
        root = Path(folder) / "course"
        if quick:
            ids = [STAND_IN]
            tiny_course(root, {STAND_IN: {"part1_stand_in.ipynb": {1: 1.0, 2: 2.0}}})
        else:
            copy_course(root)
            ids = os.environ.get("EDL_ASSIGNMENTS", "").split() or sorted(grading.WEIGHTS)
        try:
            grading.release(Course(root), ids)
        except grading.GradingError as err:  # an unknown A=: the message names the assignments there are
            raise SystemExit(str(err)) from None
        rows = [_rounds(root, assignment, rounds) for assignment in ids]
    report = ReferenceGrades(rows, [f"{rounds} round(s) per assignment on {os.cpu_count()} cores; each round regrades both "
                                    "submissions at once" + (" (quick run: a stand-in assignment)" if quick else "")])
    targets = []
    for row in rows:
        targets += [Target.at_least(f"{row.assignment}: rounds in which the reference scored full marks", row.full, row.rounds),
                    Target.at_least(f"{row.assignment}: rounds in which the student version scored 0", row.zero, row.rounds),
                    Target.at_most(f"{row.assignment}: grader errors", row.errors, 0)]
    return BenchResult("reference_grades", [report], targets)
