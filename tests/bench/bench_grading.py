"""Autograding throughput: the same submissions graded one at a time and JOBS=<cores> at a time, in sandboxes.

Targets: identical grades both ways; parallel throughput >= 1.7x sequential on 2 or more cores; a class of
100 projected to grade within 30 minutes per assignment at the parallel rate. A quick run (the test suite's) grades
a one-task stand-in for the assignment: the pipeline runs end to end in seconds, and only the equal grades are judged.
"""
from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.core.report import Report, column
from helpers.course import grading
from helpers.course.grading import Course

from ..grading_support import copy_course, read_notebooks, submit, tiny_course
from . import BenchResult, Target

ASSIGNMENT = "hw2_profiling"
CLASS_SIZE = 100


@dataclass
class GradingRun:
    jobs: int = column("jobs at once")
    submissions: int = column("submissions")
    seconds: float = column("wall s", ".1f")
    per_submission: float = column("s per submission", ".1f")
    per_minute: float = column("submissions / min", ".2f")
    class_minutes: float = column(f"class of {CLASS_SIZE}, min", ".1f")


class GradingThroughput(Report):
    title = f"Autograding {ASSIGNMENT} in bubblewrap sandboxes"


def _class(course: Path, solved: int, unsolved: int) -> None:
    source = read_notebooks(course / "source" / ASSIGNMENT)
    released = read_notebooks(course / "release" / ASSIGNMENT)
    for k in range(solved):
        submit(course, f"solved{k}", ASSIGNMENT, source)
    for k in range(unsolved):
        submit(course, f"unsolved{k}", ASSIGNMENT, released)


def _grade(course: Course, jobs: int, regrade: bool) -> tuple[GradingRun, dict]:
    start = time.perf_counter()
    report = grading.autograde(course, [ASSIGNMENT], jobs=jobs, regrade=regrade)
    seconds = time.perf_counter() - start
    n = len(report.rows)
    run = GradingRun(jobs, n, seconds, seconds / n, 60 * n / seconds, CLASS_SIZE * seconds / n / 60)
    return run, {(o.student_id, o.status, o.score) for o in report.rows}


def run(quick: bool) -> BenchResult:
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="edl-bench-grading-") as folder:
        root = Path(folder) / "course"
        course = Course(tiny_course(root, {ASSIGNMENT: {"part1_stand_in.ipynb": {1: 1.0}}}) if quick else copy_course(root))
        grading.release(course, [ASSIGNMENT])
        _class(course.root, *((1, 1) if quick else (3, 3)))
        sequential, grades_one = _grade(course, 1, regrade=True)
        parallel, grades_many = _grade(course, cores, regrade=True)
    report = GradingThroughput([sequential, parallel])
    if quick:
        report.title += " (quick run: a one-task stand-in for the assignment)"
    speedup = parallel.per_minute / sequential.per_minute
    differing = float(len(grades_one ^ grades_many) // 2)
    if quick:  # two submissions of a stand-in whose grades do not depend on time; its timings mean little
        return BenchResult("grading", [report], [
            Target.at_most("submissions whose grade differs between 1 and N jobs", differing, 0),
            Target.not_here("throughput, N jobs / 1 job", ">= 1.7x", "quick mode"),
            Target.not_here(f"class of {CLASS_SIZE}", "<= 30 min", "quick mode")])
    targets = [Target.at_most("submissions whose grade differs between 1 and N jobs", differing, 0)]
    if cores >= 2:
        targets.append(Target.at_least(f"throughput, {cores} jobs / 1 job", speedup, 1.7, "x"))
    else:
        targets.append(Target.not_here("throughput, N jobs / 1 job", ">= 1.7x", "a single core"))
    targets.append(Target.at_most(f"class of {CLASS_SIZE} at {cores} jobs", parallel.class_minutes, 30.0, " min"))
    return BenchResult("grading", [report], targets)
