"""The grading pipeline itself (helpers.course.grading), on tiny assignments: broken submissions, grade arithmetic, LMS import.

Most tests call helpers.course.grading in-process (it still runs nbgrader in child processes);
the make targets and their knobs are exercised here and, on the real assignments, in
tests/test_assignments.py.
"""
from __future__ import annotations

import csv
import re
import subprocess
import zipfile

import nbformat
import psutil
import pytest

from helpers.course import assignments, grading
from helpers.course.grading import Course, HideHiddenTestTracebacks, course_grade, read_status

from .grading_support import ROOT, make, submit, tiny_course, tiny_notebook, with_solution

pytestmark = pytest.mark.grading

PART = "part1_sums.ipynb"


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """An empty gradebook holding the roster, copied into each tiny course."""
    course = Course(tiny_course(tmp_path_factory.mktemp("empty"), {}))
    grading.sync_roster(course)
    return course.root / "gradebook.db"


def released(course, assignment, name=PART):
    return assignments.read(course / "release" / assignment / name)


def source(course, assignment, name=PART):
    return assignments.read(course / "source" / assignment / name)


def test_broken_submissions_are_reported_with_their_reason_and_never_stop_the_others(tmp_path, capsys, gradebook):
    course = tiny_course(tmp_path / "course", {"hw2_profiling": {PART: {1: 2.0, 2: 3.0}}}, gradebook)
    grading.release(Course(course))
    solved = source(course, "hw2_profiling")
    submit(course, "a_corrupt", "hw2_profiling", {PART: '{"cells": [ oops'})
    submit(course, "b_dead_kernel", "hw2_profiling", {PART: with_solution(solved, "task1_f1", "def f1(x):\n    import os\n    os._exit(3)")})
    submit(course, "c_good", "hw2_profiling", {PART: solved})
    submit(course, "d_endless_loop", "hw2_profiling", {PART: with_solution(solved, "task2_f2", "def f2(x):\n    while True:\n        pass")})
    submit(course, "e_misnamed", "hw2_profiling", {"my_homework.ipynb": solved})
    submit(course, "f_no_such_assignment", "hw9_unknown", {PART: solved})
    report = grading.autograde(Course(course), cell_timeout=3)
    assert len(report.rows) == 6 and len(report.failed) == 3
    printed = capsys.readouterr().out
    status = read_status(Course(course))

    def check(student, assignment="hw2_profiling"):
        return status[(student, assignment)]

    assert check("a_corrupt")["status"] == "failed" and "part1_sums.ipynb is not a valid notebook" in check("a_corrupt")["reason"]
    dead = check("b_dead_kernel")
    assert dead["status"] == "graded" and float(dead["score"]) == 0.0, "the process ended in task 1's test: nothing after it ran"
    assert "process ended (exit status 3" in dead["reason"] and "while cell task1_test ran" in dead["reason"]
    assert check("c_good")["status"] == "graded" and float(check("c_good")["score"]) == 5.0
    endless = check("d_endless_loop")
    assert endless["status"] == "graded" and float(endless["score"]) == 2.0, "the endless cell fails its test, the others still count"
    assert "task2_test hit the per-cell time limit (3 s)" in endless["reason"]
    assert check("e_misnamed")["status"] == "failed" and "expected part1_sums.ipynb; found my_homework.ipynb" in check("e_misnamed")["reason"]
    assert check("f_no_such_assignment", "hw9_unknown")["status"] == "failed" and "never released" in check("f_no_such_assignment", "hw9_unknown")["reason"]
    for student in ("a_corrupt", "b_dead_kernel", "e_misnamed"):
        assert student in printed and "not on the roster" in check(student)["reason"]
        assert float(check(student)["score"]) == 0.0
    log = course / "logs" / "autograde" / "b_dead_kernel__hw2_profiling.log"
    assert "sandbox exit status 3" in log.read_text(), "the sandbox's log is kept for the TA"


def test_a_submission_past_the_time_limit_is_stopped_with_everything_it_started(tmp_path, gradebook):
    course = tiny_course(tmp_path / "course", {"hw2_profiling": {PART: {1: 1.0}}}, gradebook)
    grading.release(Course(course))
    stuck = ("def f1(x):\n    import signal, subprocess, time\n    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
             "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    subprocess.Popen(['sleep', '613'], start_new_session=True)\n    time.sleep(600)")
    submit(course, "alice", "hw2_profiling", {PART: with_solution(source(course, "hw2_profiling"), "task1_f1", stuck)})
    submit(course, "bob", "hw2_profiling", {PART: source(course, "hw2_profiling")})
    grading.autograde(Course(course), student_ids=["alice"], timeout=15)
    grading.autograde(Course(course), student_ids=["bob"])  # the next submission is graded as usual
    status = read_status(Course(course))
    assert status[("alice", "hw2_profiling")]["status"] == "graded" and float(status[("alice", "hw2_profiling")]["score"]) == 0.0
    assert "stopped at the wall-time limit (15 s for the submission) while cell task1_test ran" in status[("alice", "hw2_profiling")]["reason"]
    assert status[("bob", "hw2_profiling")]["status"] == "graded" and float(status[("bob", "hw2_profiling")]["score"]) == 1.0
    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "613"]]
    assert not left, "a process the stopped submission started was left running"


def test_course_grades_weigh_each_assignment_and_count_missing_and_failed_as_zero(tmp_path, capsys, gradebook):
    course = tiny_course(tmp_path / "course", {
        "hw1_distributed": {PART: {1: 2.0, 2: 3.0}},
        "hw2_profiling": {PART: {1: 1.0, 2: 1.0}},
        "hw3_deployment": {PART: {1: 4.0}, "part2_more.ipynb": {1: 1.0}},
    }, gradebook)  # hw4_monitoring does not exist yet: everyone's hw4 counts as 0
    grading.release(Course(course))
    solved = {a: {p.name: assignments.read(p) for p in assignments.notebooks(course / "source" / a)} for a in ("hw1_distributed", "hw2_profiling", "hw3_deployment")}
    task1_only = {PART: assignments.with_task_solutions(released(course, "hw2_profiling"), solved["hw2_profiling"][PART], {1})}
    submit(course, "alice", "hw1_distributed", solved["hw1_distributed"])
    submit(course, "alice", "hw2_profiling", task1_only)
    submit(course, "bob", "hw1_distributed", {PART: "not json at all"})
    submit(course, "bob", "hw2_profiling", solved["hw2_profiling"])
    submit(course, "bob", "hw3_deployment", solved["hw3_deployment"])
    submit(course, "zed", "hw3_deployment", {PART: solved["hw3_deployment"][PART]})  # not on the roster; part2 missing
    grading.autograde(Course(course))
    capsys.readouterr()
    grading.grades(Course(course))
    out = capsys.readouterr().out

    with (course / "course_grades.csv").open(newline="") as f:
        rows = {r["student_id"]: r for r in csv.DictReader(f)}
    assert list(next(iter(rows.values()))) == ["student_id", "hw1_distributed", "hw2_profiling", "hw3_deployment", "hw4_monitoring", "course_grade"]
    expected = {
        "alice": {"hw1_distributed": 100.0, "hw2_profiling": 50.0, "hw3_deployment": 0.0, "hw4_monitoring": 0.0, "course_grade": 35.0},
        "bob": {"hw1_distributed": 0.0, "hw2_profiling": 100.0, "hw3_deployment": 100.0, "hw4_monitoring": 0.0, "course_grade": 50.0},
        "zed": {"hw1_distributed": 0.0, "hw2_profiling": 0.0, "hw3_deployment": 80.0, "hw4_monitoring": 0.0, "course_grade": 32.0},
        "erin": {"hw1_distributed": 0.0, "hw2_profiling": 0.0, "hw3_deployment": 0.0, "hw4_monitoring": 0.0, "course_grade": 0.0},
    }
    for student, values in expected.items():
        assert {k: float(v) for k, v in rows[student].items() if k != "student_id"} == values, student
    assert set(rows) == {"alice", "bob", "carol", "dmitri", "erin", "zed"}
    assert "bob / hw1_distributed: part1_sums.ipynb is not a valid notebook" in out
    assert "not on the roster (graded all the same): zed" in out
    assert re.search(r"hw2_profiling\s+25\.0%", out), "mean of hw2 over the 6 students: (50 + 100) / 6"

    # A TA fixes bob's hw1 and regrades only that submission: his row follows.
    submit(course, "bob", "hw1_distributed", solved["hw1_distributed"])
    regrade = make("autograde", course, "A=hw1_distributed", "S=bob")
    assert regrade.returncode == 0 and "[1/1]" in regrade.stdout, regrade.stdout + regrade.stderr
    grading.grades(Course(course))
    with (course / "course_grades.csv").open(newline="") as f:
        bob = next(r for r in csv.DictReader(f) if r["student_id"] == "bob")
    assert float(bob["hw1_distributed"]) == 100.0 and float(bob["course_grade"]) == 80.0
    assert read_status(Course(course))[("alice", "hw1_distributed")]["status"] == "graded", "other rows are kept"


def test_course_grade_is_the_weighted_sum():
    assert course_grade({"hw1_distributed": 100, "hw2_profiling": 100, "hw3_deployment": 100, "hw4_monitoring": 100}) == pytest.approx(100)
    assert course_grade({"hw2_profiling": 40, "hw4_monitoring": 50}) == pytest.approx(0.1 * 40 + 0.2 * 50)


def test_an_lms_download_is_collected_into_submitted(tmp_path, gradebook):
    course = tiny_course(tmp_path / "course", {"hw2_profiling": {PART: {1: 1.0}}}, gradebook)
    grading.release(Course(course))
    archive = tmp_path / "download.zip"
    text = nbformat.writes(source(course, "hw2_profiling"))
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(f"alice_{PART}", text)
        z.writestr(f"bob_smith/{PART}", text)
        z.writestr("readme.txt", "not a submission")
    result = make("import", course, "A=hw2_profiling", f"ZIP={archive}")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (course / "submitted" / "alice" / "hw2_profiling" / PART).exists()
    assert (course / "submitted" / "bob_smith" / "hw2_profiling" / PART).exists()
    assert "alice, bob_smith" in result.stdout


def test_bad_input_gets_an_error_that_says_what_to_do(tmp_path, capsys):
    def error_of(*argv):
        assert grading.main(list(argv)) == 2
        return capsys.readouterr().err

    assert "no nbgrader_config.py" in error_of("--course", str(tmp_path / "nowhere"), "grades")
    course = str(tiny_course(tmp_path / "course", {"hw2_profiling": {PART: {1: 1.0}}}))
    unknown = error_of("--course", course, "release", "-a", "hw7")
    assert "no assignment hw7 " in unknown and "hw2_profiling" in unknown
    assert "make release" in error_of("--course", course, "grades")
    assert "no submissions" in error_of("--course", course, "autograde")
    (tmp_path / "course" / "roster.csv").write_text("name,email\nann,ann@example.org\n")
    assert "needs an 'id' column" in error_of("--course", course, "release")


def test_hidden_test_tracebacks_are_cut_to_one_line():
    nb = tiny_notebook({1: 1.0})
    cell = nb.cells[2]
    traceback = ["\x1b[31mAssertionError\x1b[39m Traceback", "Cell \x1b[32mIn[3], line 3\x1b[39m", "assert f1(10) == 11, 'hidden check of f1'"]
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", evalue="hidden check of f1", traceback=traceback)]
    HideHiddenTestTracebacks().preprocess_cell(cell, {}, 2)
    assert cell.outputs[0].traceback == ["a hidden test failed (its code is not shown): AssertionError: hidden check of f1"]
    cell.outputs[0].traceback = ["Cell In[3], line 1", "----> 1 assert f1(1) == 2"]
    HideHiddenTestTracebacks().preprocess_cell(cell, {}, 2)
    assert cell.outputs[0].traceback == ["the visible test on line 1 failed: AssertionError: hidden check of f1"]


def test_convention_problems_are_named(tmp_path):
    nb = tiny_notebook({1: 1.0})
    nb.cells[1].metadata.nbgrader.grade_id = "adder"  # no task<K>_ prefix
    nb.cells[1].source = "### BEGIN SOLUTION\nx = 1\n### END SOLUTION"  # at top level: the released cell would raise
    nb.cells[2].metadata.nbgrader.points = 0
    nbformat.write(nb, tmp_path / "homework.ipynb")
    problems = "\n".join(assignments.convention_problems(tmp_path))
    assert "homework.ipynb: name it partN_<short_name>.ipynb" in problems
    assert "grade_id must start with task<K>_" in problems
    assert "inside a function or class body" in problems
    assert "locked and worth points > 0" in problems
    nbformat.write(tiny_notebook({1: 1.0, 2: 2.0}), tmp_path / "homework.ipynb")
    (tmp_path / "homework.ipynb").rename(tmp_path / "part2_only.ipynb")
    assert assignments.convention_problems(tmp_path) == [f"{tmp_path.name}: parts are numbered [2], expected 1..1"]


def test_an_unknown_assignment_is_named_as_such_by_every_command(tmp_path):
    course = grading.Course(tiny_course(tmp_path / "course", {"hw_real": {PART: {1: 1.0}}}))
    for command in (grading.release, grading.autograde, grading.feedback):
        with pytest.raises(grading.GradingError, match="no assignment hw9 .*there are: hw_real"):
            command(course, ["hw9"])


def test_make_import_without_arguments_shows_makes_own_usage():
    done = subprocess.run(["make", "-s", "import"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode != 0 and "usage: make import A=<assignment id> ZIP=" in done.stderr
    assert "--assignment" not in done.stderr  # not argparse's flags
