"""Grade a class with nbgrader: release, autograde every submission in a sandbox, feedback, grade export.

The Makefile's release / autograde / feedback / grades / import targets call this module:

    python -m helpers.course.grading --course assignments autograde [-a hw2_profiling] [-s alice] [--jobs 2]

Release, feedback, export and LMS import are nbgrader commands, each run in a child process of its own
(forked, so nbgrader is imported once) under a wall-clock limit, with its log under ``<course>/logs/``.
Autograding is helpers.course.autograde: each notebook in a bubblewrap sandbox, several submissions at
once, grades written by this process only. A broken submission gets its reason; the others are graded.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import multiprocessing
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from helpers.core.procs import redirect_output, stop_tree
from helpers.core.report import Report, column
from helpers.course import assignments, intake, sealed
from helpers.course.autograde import STATUS_FILE, AutogradeReport, Outcome, read_status, write_status  # noqa: F401 - the grading API
from helpers.course.autograde import autograde as grade_submissions
from helpers.course.feedback_filters import HideHiddenTestTracebacks, RemoveHiddenTests  # noqa: F401 - named in nbgrader_config.py
from helpers.course.intake import safe_text
from helpers.course.sandbox import Limits

WEIGHTS = {"hw1_distributed": 0.3, "hw2_profiling": 0.1, "hw3_deployment": 0.4, "hw4_monitoring": 0.2}
SUBMISSION_TIMEOUT_S = 1800
GRADES_FILE = "grades.csv"
COURSE_GRADES_FILE = "course_grades.csv"


class GradingError(Exception):
    """A problem with the course itself (not with one submission): the command stops and says what to do."""


# ---------------------------------------------------------------- the course folder


class Course:
    """An nbgrader course folder: source/, release/, submitted/, autograded/, feedback/, roster.csv, gradebook."""

    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()
        if not (self.root / "nbgrader_config.py").exists():
            raise GradingError(f"{self.root} is not an nbgrader course: it has no nbgrader_config.py (pass --course or COURSE=)")
        self.source, self.release = self.root / "source", self.root / "release"
        self.submitted, self.autograded = self.root / "submitted", self.root / "autograded"
        self.feedback, self.logs = self.root / "feedback", self.root / "logs"
        self.roster_file = self.root / "roster.csv"

    def assignment_ids(self) -> list[str]:
        """Every assignment folder under source/."""
        return sorted(p.name for p in self.source.iterdir() if p.is_dir() and not p.name.startswith(".")) if self.source.exists() else []

    def roster(self) -> list[str]:
        """Student ids from roster.csv (nbgrader's format: an ``id`` column, optional names and email)."""
        if not self.roster_file.exists():
            return []
        with self.roster_file.open(newline="") as f:
            rows = list(csv.DictReader(f))
        if rows and "id" not in rows[0]:
            raise GradingError(f"{self.roster_file} needs an 'id' column (header: id,first_name,last_name,email)")
        ids = [r["id"].strip() for r in rows]
        if "" in ids or len(set(ids)) != len(ids):
            raise GradingError(f"{self.roster_file}: every row needs a unique, non-empty id")
        return ids

    def submissions(self, assignment_ids: Sequence[str] = (), student_ids: Sequence[str] = (), under: Path | None = None) -> list[tuple[str, str]]:
        """(student_id, assignment_id) of every folder ``<under>/<student>/<assignment>/`` (default: submitted/).

        Entries are listed without following links: a student or assignment folder that is a link (or anything
        but a folder) is listed all the same, so that grading refuses it with a reason. A folder whose name is
        not a valid student id (intake.ID_ALPHABET) is skipped with a warning.
        """
        under = under or self.submitted
        found = []
        if not under.is_dir():
            return found
        for student in sorted(p for p in under.iterdir() if not p.name.startswith(".")):
            try:
                intake.check_student_id(student.name)
            except intake.Refused as err:
                print(f"warning: skipped {under.name}/{safe_text(student.name)}: {err}", file=sys.stderr)
                continue
            if not (not student_ids or student.name in student_ids):
                continue
            if student.is_symlink() or not student.is_dir():
                found += [(student.name, a) for a in (assignment_ids or self.assignment_ids())]
                continue
            for assignment in sorted(p for p in student.iterdir() if not p.name.startswith(".")):
                if assignment.is_dir() or assignment.is_symlink():
                    if not assignment_ids or assignment.name in assignment_ids:
                        found.append((student.name, assignment.name))
        return found

    def log_path(self, command: str, *names: str) -> Path:
        path = self.logs / command / ("__".join(names) + ".log")
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def gradebook(self):
        """nbgrader's Gradebook on this course's database (use as a context manager)."""
        from nbgrader.api import Gradebook
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config()
        coursedir = CourseDirectory(config=config, root=str(self.root))
        return Gradebook(coursedir.db_url, coursedir.course_id)

    def db_url(self) -> str:
        from nbgrader.coursedir import CourseDirectory
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config()
        return CourseDirectory(config=config, root=str(self.root)).db_url

    def cell_timeout(self) -> float:
        """nbgrader_config.py's per-cell timeout (c.Execute.timeout), 180 s when it sets none."""
        from traitlets.config.loader import PyFileConfigLoader

        config = PyFileConfigLoader("nbgrader_config.py", path=str(self.root)).load_config()
        return float(config.Execute.get("timeout", 180) or 180)

    def released_ids(self) -> set[str]:
        """Assignments the gradebook knows (``nbgrader generate_assignment`` has run on them)."""
        if not (self.root / "gradebook.db").exists():
            return set()
        with self.gradebook() as gb:
            return {a.name for a in gb.assignments}


# ---------------------------------------------------------------- running nbgrader in a child process


@dataclass
class NbgraderRun:
    argv: list[str]
    returncode: int | None
    seconds: float
    timed_out: bool
    log_path: Path

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _nbgrader_main(root: str, argv: list[str], log_path: str) -> None:
    """Child-process body: one nbgrader command in the course folder, all its output going to ``log_path``."""
    os.chdir(root)
    # nbgrader calls `alembic` (and the kernel is started) through PATH: put this environment's bin/ first.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    redirect_output(log_path, append=False)
    from nbgrader.apps.nbgraderapp import NbGraderApp

    NbGraderApp.launch_instance(argv=argv)


def _start_method() -> str:
    """fork where it is safe and fast (Linux: nbgrader is imported once); spawn elsewhere."""
    return "fork" if sys.platform.startswith("linux") else "spawn"


def run_nbgrader(course: Course, argv: list[str], log_path: Path, timeout: float) -> NbgraderRun:
    """Run ``nbgrader <argv>`` in ``course`` in a child process; kill it (and its kernels) after ``timeout`` s."""
    import nbgrader.apps.nbgraderapp  # noqa: F401  (imported here once, so forked children start at once)

    sys.stdout.flush()
    sys.stderr.flush()
    child = multiprocessing.get_context(_start_method()).Process(target=_nbgrader_main, args=(str(course.root), argv, str(log_path)))
    start = time.perf_counter()
    child.start()
    child.join(timeout)
    timed_out = child.is_alive()
    if timed_out:
        stop_tree(child.pid, grace=0)  # nbgrader and the kernels it started (in sessions of their own)
        child.join()
    return NbgraderRun(argv, child.exitcode, time.perf_counter() - start, timed_out, log_path)


def sync_roster(course: Course) -> None:
    """Import roster.csv into the gradebook (creates the gradebook on first use; updates names on later runs)."""
    if not course.roster():
        return
    run = run_nbgrader(course, ["db", "student", "import", course.roster_file.name], course.log_path("db", "roster"), timeout=300)
    if not run.ok:
        raise GradingError(f"importing {course.roster_file} into the gradebook failed: {last_error_line(run.log)} (log: {run.log_path})")


def last_error_line(log: str) -> str:
    """The most specific error line of an nbgrader log: the last 'SomethingError: message' line, else the last ERROR line."""
    errors = re.findall(r"^\s*((?:\w+\.)*\w*(?:Error|Exception|Exit)\b:?.*)$", log, re.M)
    if errors:
        return errors[-1].strip()
    flagged = re.findall(r"\| ERROR\] (.*)$", log, re.M)
    return flagged[-1].strip() if flagged else "no error message in the log"


# ---------------------------------------------------------------- release


def known_assignments(course: Course, assignment_ids: Sequence[str] = ()) -> list[str]:
    """The course's assignment ids; an id asked for that is not among them is an error that lists the real ones."""
    known = course.assignment_ids()
    if not known:
        raise GradingError(f"no assignment folders under {course.source}: add one (see assignments/README.md)")
    unknown = [a for a in assignment_ids if a not in known]
    if unknown:
        raise GradingError(f"no assignment {', '.join(unknown)} under {course.source} (there are: {', '.join(known)}); "
                           f"use one of them with A=")
    return known


def release(course: Course, assignment_ids: Sequence[str] = ()) -> list[str]:
    """Generate the student version of each assignment into release/; returns the ids released."""
    known = known_assignments(course, assignment_ids)
    sync_roster(course)
    released, failed = [], []
    for assignment_id in assignment_ids or known:
        for problem in assignments.convention_problems(course.source / assignment_id) + assignments.feedback_problems(course.source / assignment_id):
            print(f"warning: {assignment_id}/{problem} (see assignments/README.md)")
        run = run_nbgrader(course, ["generate_assignment", assignment_id, "--force"], course.log_path("release", assignment_id), timeout=600)
        if run.ok:
            released.append(assignment_id)
            print(f"released {assignment_id} -> {course.release / assignment_id}  ({run.seconds:.1f} s)")
        else:
            failed.append(f"{assignment_id}: {last_error_line(run.log)} (log: {run.log_path})")
    if failed:
        raise GradingError("release failed for " + "; ".join(failed))
    return released


# ---------------------------------------------------------------- autograde (helpers/course/autograde.py)


def autograde(course: Course, assignment_ids: Sequence[str] = (), student_ids: Sequence[str] = (), timeout: float = SUBMISSION_TIMEOUT_S,
              cell_timeout: float | None = None, jobs: int | None = None, regrade: bool = False, limits: Limits | None = None) -> AutogradeReport:
    """Autograde every submission in submitted/<student>/<assignment>/ (optionally only some), ``jobs`` at a time, each in a sandbox."""
    known_assignments(course, assignment_ids)
    pending = course.submissions(assignment_ids, student_ids)
    if not pending:
        wanted = f" for {', '.join(list(assignment_ids) + list(student_ids))}" if assignment_ids or student_ids else ""
        raise GradingError(f"no submissions{wanted} under {course.submitted}/<student>/<assignment>/ (drop them there, or `make import`)")
    sync_roster(course)
    limits = dataclasses.replace(limits or Limits(), wall_s=float(timeout), cell_s=float(cell_timeout or course.cell_timeout()))
    outcomes = grade_submissions(course, pending, course.released_ids(), set(course.roster()), limits, jobs or os.cpu_count() or 1, regrade)
    return AutogradeReport(outcomes)


# ---------------------------------------------------------------- feedback


def feedback(course: Course, assignment_ids: Sequence[str] = (), student_ids: Sequence[str] = ()) -> list[Path]:
    """HTML feedback for every autograded submission, hidden tests left out; returns the folders written."""
    known_assignments(course, assignment_ids)
    pending = course.submissions(assignment_ids, student_ids, under=course.autograded)
    if not pending:
        raise GradingError(f"nothing autograded yet under {course.autograded} (run `make autograde` first)")
    written, failed = [], []
    for student_id, assignment_id in pending:
        if not any((course.autograded / student_id / assignment_id).glob("*.ipynb")):
            print(f"no feedback for {student_id}/{assignment_id}: no notebook of it was graded (its reason is in {STATUS_FILE})")
            continue
        argv = ["generate_feedback", assignment_id, "--student", student_id, "--force"]
        run = run_nbgrader(course, argv, course.log_path("feedback", student_id, assignment_id), timeout=600)
        if run.ok:
            written.append(course.feedback / student_id / assignment_id)
        else:
            failed.append(f"{student_id}/{assignment_id}: {last_error_line(run.log)}")
    print(f"feedback written for {len(written)} submissions under {course.feedback}/<student>/<assignment>/")
    for line in failed:
        print(f"feedback FAILED for {line}")
    return written


# ---------------------------------------------------------------- grades


@dataclass
class StudentGrades:
    student_id: str = column("student")
    percents: dict[str, float] = column("{}", ".1f", spread=True)  # assignment id -> percentage
    course_grade: float = column("course grade", ".2f")
    on_roster: bool


class CourseGrades(Report):
    """One row per student: the percentage of each assignment (missing or failed = 0) and the weighted course grade."""

    title = "Course grades"

    def __init__(self, rows: list[StudentGrades], assignment_ids: list[str], failures: list[dict], submissions: dict[str, set[str]]):
        self.assignment_ids = assignment_ids
        super().__init__(rows)
        self.students = rows
        self.failures = failures
        self.submissions = submissions  # assignment id -> ids of the students who submitted it
        self.means = {a: (sum(r.percents[a] for r in rows) / len(rows) if rows else 0.0) for a in assignment_ids}

    def summary(self) -> str:
        submitters = set().union(*self.submissions.values())
        off_roster = [r.student_id for r in self.students if not r.on_roster]
        lines = [f"students: {len(self.students)} in the table, {len(submitters)} with at least one submission"]
        if off_roster:
            lines.append(safe_text(f"not on the roster (graded all the same): {', '.join(off_roster)}"))
        lines.append("mean per assignment (over all students; missing or failed = 0):")
        lines += [f"  {a:<18} {self.means[a]:6.1f}%   ({len(self.submissions.get(a, ())):d} submissions, weight {WEIGHTS.get(a, 0):g})" for a in self.assignment_ids]
        if self.failures:
            lines.append(f"failed submissions ({len(self.failures)}, scored 0):")
            lines += [safe_text(f"  {f['student_id']} / {f['assignment_id']}: {f['reason']}") for f in self.failures]
        else:
            lines.append("failed submissions: none")
        return "\n".join(lines)

    def write_csv(self, path: Path) -> None:
        with path.open("w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["student_id", *map(safe_text, self.assignment_ids), "course_grade"])
            for r in self.students:
                writer.writerow([safe_text(r.student_id), *(f"{r.percents[a]:.2f}" for a in self.assignment_ids), f"{r.course_grade:.2f}"])


def neutralise_csv(path: Path) -> None:
    """Rewrite a CSV written by another tool (nbgrader's export) with every cell made safe for a spreadsheet."""
    if not path.exists():
        return
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    temporary = path.with_suffix(".tmp")
    with temporary.open("w", newline="") as f:
        csv.writer(f).writerows([[cell if _is_number(cell) else safe_text(cell) for cell in row] for row in rows])
    os.replace(temporary, path)


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def course_grade(percents: dict[str, float], weights: dict[str, float] = WEIGHTS) -> float:
    """The weighted course grade on the 0-100 scale: sum of weight x percentage (missing assignment = 0)."""
    return sum(w * percents.get(a, 0.0) for a, w in weights.items())


def course_grades(course: Course) -> CourseGrades:
    """Every student's percentage per assignment and course grade, from the gradebook and the autograding status."""
    roster = course.roster()
    status = read_status(course)
    failed = {key: row for key, row in status.items() if row["status"] in ("failed", "error")}
    percents: dict[str, dict[str, float]] = {}
    submissions: dict[str, set[str]] = {}
    mismatches: list[str] = []
    with course.gradebook() as gb:
        known = [a.name for a in gb.assignments]
        for assignment in gb.assignments:
            max_score = float(assignment.max_score)
            for submission in assignment.submissions:
                student_id = submission.student.id
                submissions.setdefault(assignment.name, set()).add(student_id)
                value = 0.0 if (student_id, assignment.name) in failed or not max_score else 100 * float(submission.score) / max_score
                row = status.get((student_id, assignment.name))
                if row and row["status"] == "graded" and abs(float(row["score"]) - float(submission.score)) > 1e-6:
                    mismatches.append(f"{student_id}/{assignment.name}: gradebook {float(submission.score):g}, autograde status {row['score']}")
                percents.setdefault(student_id, {})[assignment.name] = round(value, 2)
        students = set(roster) | {s.id for s in gb.students} | {s for s, _ in status}
    if mismatches:
        raise GradingError("the gradebook does not hold the scores the autograder recorded (was it changed by hand or by another "
                           "tool?): " + "; ".join(mismatches[:20]) + ". Regrade them: make autograde REGRADE=1 S=<student> A=<assignment>")
    ids = list(WEIGHTS) + sorted((set(known) | set(course.assignment_ids())) - set(WEIGHTS))
    rows = []
    for student_id in sorted(students):
        mine = {a: percents.get(student_id, {}).get(a, 0.0) for a in ids}
        rows.append(StudentGrades(student_id, mine, round(course_grade(mine), 2), student_id in roster))
    return CourseGrades(rows, ids, [failed[k] for k in sorted(failed)], submissions)


def grades(course: Course) -> CourseGrades:
    """Write grades.csv (nbgrader's export) and course_grades.csv, and print the class summary."""
    if not (course.root / "gradebook.db").exists():
        raise GradingError(f"no gradebook in {course.root} yet: run `make release` and `make autograde` first")
    sync_roster(course)
    run = run_nbgrader(course, ["export", "--to", GRADES_FILE], course.log_path("export", "grades"), timeout=600)
    if not run.ok:
        raise GradingError(f"nbgrader export failed: {last_error_line(run.log)} (log: {run.log_path})")
    neutralise_csv(course.root / GRADES_FILE)
    report = course_grades(course)
    report.write_csv(course.root / COURSE_GRADES_FILE)
    print(report.table())
    print()
    print(report.summary())
    print(f"\nwrote {course.root / GRADES_FILE} (nbgrader's export) and {course.root / COURSE_GRADES_FILE}")
    return report


# ---------------------------------------------------------------- importing an LMS download


def import_zip(course: Course, archive: str | Path, assignment_id: str) -> list[str]:
    """Collect an LMS download (a zip of <student>_<notebook>.ipynb or <student>/<notebook>.ipynb files) into submitted/.

    helpers.course.lms_import does it, bounded and atomic per student, with the file-name pattern set in
    nbgrader_config.py; returns the student ids imported from this archive. Run it again with next week's
    download: each student's folder of the assignment is replaced by the new one.
    """
    from helpers.course import lms_import

    archive = Path(archive)
    if not archive.is_file():
        raise GradingError(f"no such file: {archive} (pass ZIP=path/to/download.zip)")
    if assignment_id not in course.assignment_ids():
        raise GradingError(f"no assignment {assignment_id!r} under {course.source} (pass A=<assignment id>)")
    try:
        report = lms_import.import_archive(course.root, archive, assignment_id, course.roster())
    except intake.Refused as err:
        raise GradingError(f"the archive was refused, nothing was imported: {err}") from None
    for line in report.lines():
        print(line)
    print(f"collected {assignment_id} for {len(report.imported)} students into {course.submitted}: {', '.join(sorted(report.imported))}"
          + (f"; {len(report.refused)} refused (see above)" if report.refused else ""))
    return sorted(report.imported)


# ---------------------------------------------------------------- command line


NEEDS_SOURCES = ("release", "autograde", "feedback")  # commands that read solutions or hidden tests


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.course.grading", description=__doc__.splitlines()[0])
    parser.add_argument("--course", default="assignments", help="the nbgrader course folder (default: assignments)")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("release", "generate the student versions into release/"), ("autograde", "grade the submissions in submitted/"), ("feedback", "HTML feedback per student into feedback/")):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("-a", "--assignment", action="append", default=[], help="only this assignment (repeatable)")
        if name != "release":
            sub.add_argument("-s", "--student", action="append", default=[], help="only this student (repeatable)")
        if name == "autograde":
            sub.add_argument("--timeout", type=float, default=SUBMISSION_TIMEOUT_S, help="seconds one submission may take before it is stopped")
            sub.add_argument("--cell-timeout", type=int, default=None, help="override the per-cell timeout of nbgrader_config.py")
            sub.add_argument("-j", "--jobs", type=int, default=None, help="submissions graded at once (default: the number of cores)")
            sub.add_argument("--regrade", action="store_true", help="grade again submissions already graded with the same files and tests")
            sub.add_argument("--memory-gb", type=float, default=None, help="address-space limit of a submission's processes (default 8; torch alone maps 3.1)")
    commands.add_parser("grades", help="write grades.csv and course_grades.csv and print a summary")
    zipped = commands.add_parser("import", help="collect an LMS download (zip) into submitted/")
    zipped.add_argument("archive")
    zipped.add_argument("-a", "--assignment", required=True)
    args = parser.parse_args(argv)

    try:
        course = Course(args.course)
        if args.command in NEEDS_SOURCES and sealed.locked(course.source):
            raise GradingError(f"make {args.command} needs the assignments' sources: {sealed.MESSAGE}")
        if args.command == "release":
            release(course, args.assignment)
        elif args.command == "autograde":
            limits = Limits(memory_bytes=int(args.memory_gb * 2**30)) if args.memory_gb else None
            if args.jobs is not None and args.jobs < 1:
                raise GradingError(f"JOBS={args.jobs}: give the number of submissions to grade at once, 1 or more")
            report = autograde(course, args.assignment, args.student, args.timeout, args.cell_timeout, args.jobs, args.regrade, limits)
            print()
            print(report.table())
            graded = len(report.rows) - len(report.failed) - len(report.errors)
            print(f"\n{graded} graded, {len(report.failed)} failed (scored 0; reasons above); status in {course.root / STATUS_FILE}")
            if report.errors:
                students = " ".join(sorted({f"S={o.student_id}" for o in report.errors}))
                print(f"error: {len(report.errors)} submission(s) could not be graded because of the grader, not the student (each was "
                      f"tried twice; nothing was recorded for them): {', '.join(f'{o.student_id}/{o.assignment_id}' for o in report.errors)}. "
                      f"Fix the cause named in the reason, then rerun them: make autograde {students}", file=sys.stderr)
                return 3
        elif args.command == "feedback":
            feedback(course, args.assignment, args.student)
        elif args.command == "grades":
            grades(course)
        elif args.command == "import":
            import_zip(course, args.archive, args.assignment)
    except GradingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
