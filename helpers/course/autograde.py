"""Autograde submissions in sandboxes, several at once; only this process writes grades.

For each submission (``submitted/<student>/<assignment>/``) and each notebook of the assignment:

1. **Rebuild** the notebook from trusted parts: the released notebook's structure and metadata, the test
   and read-only cells from the gradebook (hidden tests included), and from the student's file only the
   source of their solution cells and the cells they added. Forged nbgrader metadata, deleted test cells
   and changed read-only cells change nothing.
2. **Run** it in a fresh sandbox (helpers.course.sandbox) holding a copy of the student's files and the
   released support files, under the per-submission limits; the runner reports each cell's outcome.
3. **Record**: the graded notebook is written to ``autograded/`` from those reports, and nbgrader's own
   SaveAutoGrades preprocessor puts the scores into the gradebook, in this process, one submission at a time.

The status row of a submission is written to ``autograde_status.csv`` as soon as it is graded, with a
fingerprint of its files and of the tests: a grader that was stopped resumes where it stopped, and a
rerun skips what is already graded unless asked to regrade.
"""
from __future__ import annotations

import builtins
import copy
import csv
import dataclasses
import hashlib
import hmac
import os
import queue
import shutil
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import nbformat

from helpers.core.report import Report, column
from helpers.course import assignments, intake, kit_use, references, sandbox
from helpers.course.intake import safe_text
from helpers.course.referee import REFEREE_FAILED
from helpers.course.sandbox import Limits

STATUS_FILE = "autograde_status.csv"
RUNNER_VERSION = "sandbox-4"  # part of every fingerprint: a change of the grading machinery regrades everything
GRADER_SIDE = "grader error (not the student's doing)"
LEFT_LISTENING = "servers still listening when its last cell ended:"  # a note, never points (sandboxes with a network of their own)


@dataclass
class Outcome:
    """How one submission fared: graded (with its score and notes), failed (the submission's fault, with the reason),
    or error (the grader's own failure: not a grade; rerun it)."""

    student_id: str = column("student")
    assignment_id: str = column("assignment")
    status: str = column("status")
    score: float = column("score", ".2f")
    max_score: float = column("max", ".2f")
    percent: float = column("%", ".1f", init=False)
    seconds: float = column("seconds", ".1f")
    on_roster: bool
    reason: str = column("reason / notes")
    fingerprint: str = ""

    def __post_init__(self):
        self.percent = 100 * self.score / self.max_score if self.max_score else 0.0
        # what came from a submission (ids, file names, messages) is printed and written to CSV: make it safe there
        self.student_id, self.assignment_id, self.reason = safe_text(self.student_id), safe_text(self.assignment_id), safe_text(self.reason, 100_000)


class AutogradeReport(Report):
    """One row per submission autograded: status, score, time, and the reason or notes."""

    title = "Autograding"

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.rows if o.status == "failed"]

    @property
    def errors(self) -> list[Outcome]:
        return [o for o in self.rows if o.status == "error"]


# ---------------------------------------------------------------- what the tests are (read once per assignment)


@dataclass
class TrustedNotebook:
    """One notebook of an assignment as the grader knows it: the released cells, with test cells in full."""

    name: str
    cells: list  # nbformat cells: release structure, gradebook sources for read-only and test cells


@dataclass
class TrustedAssignment:
    assignment_id: str
    notebooks: list[TrustedNotebook]
    support_files: dict[str, Path]
    max_score: float
    fingerprint: str
    timing_sensitive: frozenset[str] = frozenset()  # notebook file names graded alone (assignment.toml)
    kit: tuple[str, ...] | None = None  # what of helpers the assignment may use (assignment.toml); None: all of it
    secret: bytes = b""  # a digest of the hidden tests' text, which students never see: the key of GRADING_SEED
    language_model: bool = False  # its notebooks load the kit's language model (assignment.toml)
    references: Path | None = None  # the instructors' files for later tasks' tests, made before grading (assignment.toml)
    referee: dict[str, tuple[str, ...]] = field(default_factory=dict)  # notebook file -> names its tests call from the referee


def trusted_assignment(course, assignment_id: str) -> TrustedAssignment:
    """The assignment's notebooks, tests and support files from release/ and the gradebook (never from a submission)."""
    from nbgrader.api import MissingEntry

    release = course.release / assignment_id
    digest = hashlib.sha256(RUNNER_VERSION.encode())
    secret = hashlib.sha256(b"edl grading seed\0")
    notebooks = []
    with course.gradebook() as gb:
        assignment = gb.find_assignment(assignment_id)
        max_score = float(assignment.max_score)
        for notebook in sorted(assignment.notebooks, key=lambda n: assignments.part_order(n.name)):
            path = release / f"{notebook.name}.ipynb"
            nb = assignments.read(path)
            for cell in nb.cells:
                grade_id = assignments.grade_id(cell)
                if not grade_id or assignments.is_solution(cell):
                    continue
                try:
                    cell.source = gb.find_source_cell(grade_id, notebook.name, assignment_id).source
                except MissingEntry:
                    continue
                digest.update(f"{notebook.name}/{grade_id}\0{cell.source}\0".encode())
                secret.update(f"{notebook.name}/{grade_id}\0{split_test(cell.source)[1]}\0".encode())
            notebooks.append(TrustedNotebook(notebook.name, nb.cells))
    support = {p.name: p for p in sorted(release.iterdir()) if p.is_file() and p.suffix != ".ipynb"}
    for path in support.values():
        digest.update(path.name.encode() + path.read_bytes())
    declared = kit_use.declaration(release)
    made = None
    if declared.references:  # made from the source notebooks' solutions, which the grade then depends on too
        wanted = {notebook: (cells, code) for notebook, cells, code in declared.references}
        made = Path(tempfile.mkdtemp(prefix=sandbox.scratch_prefix("edl-references-")))
        try:
            references.make(course.source / assignment_id, release, wanted, made, digest)
        except references.ReferenceError:
            shutil.rmtree(made, ignore_errors=True)
            raise
    return TrustedAssignment(assignment_id, notebooks, support, max_score, digest.hexdigest()[:16],
                             frozenset(declared.timing_sensitive), declared.kit, secret.digest(), declared.language_model, made,
                             dict(declared.referee))


def grading_seed(trusted: TrustedAssignment, notebook: str, grade_id: str, student: str) -> int:
    """The seed of one test cell's hidden part for one student: the same at every regrade, different for every
    student and cell, and unknown to anyone without the hidden tests (an HMAC keyed by their digest)."""
    message = f"{trusted.assignment_id}/{notebook}/{grade_id}/{student}".encode()
    return int.from_bytes(hmac.new(trusted.secret, message, hashlib.sha256).digest()[:8], "big") >> 2  # < 2**62


def seeded(hidden: str, seed: int, student: str = "") -> str:
    """A hidden part as the sandbox receives it: ``GRADING_SEED`` defined first, for the tests' random choices, and
    ``GRADING_STUDENT``, the roster id graded (for tests of work that differs per student), on the same line."""
    return f"{SEED_NAME} = {seed}; {STUDENT_NAME} = {student!r}\n{hidden}"


# ---------------------------------------------------------------- 1. rebuild


def rebuild(trusted: TrustedNotebook, submitted) -> tuple[nbformat.NotebookNode, list[str]]:
    """The notebook to run: trusted cells in the student's order, the student's solutions and added cells.

    Returns the notebook and notes for the TA (forged metadata, restored cells).
    """
    by_id = {assignments.grade_id(c): c for c in trusted.cells if assignments.grade_id(c)}
    used: set[str] = set()
    cells, notes = [], []
    for cell in submitted.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        grade_id = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(grade_id, str) and grade_id in by_id and grade_id not in used:
            used.add(grade_id)
            mine = copy.deepcopy(by_id[grade_id])
            if assignments.is_solution(mine) and cell.get("cell_type") == mine.cell_type:
                mine.source = cell.get("source", "")
            cells.append(mine)
        elif cell.get("cell_type") in ("code", "markdown"):
            if meta is not None:
                notes.append(f"a cell with nbgrader metadata that is not the released notebook's ({str(grade_id)[:40]!r}) ran as an ordinary cell")
            plain = nbformat.v4.new_code_cell(cell.get("source", "")) if cell["cell_type"] == "code" else nbformat.v4.new_markdown_cell(cell.get("source", ""))
            cells.append(plain)
    for position, cell in enumerate(trusted.cells):
        grade_id = assignments.grade_id(cell)
        if grade_id and grade_id not in used:
            before = [assignments.grade_id(c) for c in trusted.cells[:position] if assignments.grade_id(c) in used]
            at = max((i for i, c in enumerate(cells) if assignments.grade_id(c) in before), default=-1) + 1
            cells.insert(at, copy.deepcopy(cell))
            used.add(grade_id)
            if not assignments.is_solution(cell):
                notes.append(f"restored the deleted cell {grade_id}")
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
                                                          "language_info": {"name": "python"}})
    return nb, notes


def role(cell) -> str:
    if assignments.is_graded_test(cell):
        return "test"
    meta = assignments.nbgrader_metadata(cell)
    return "instructor" if meta.get("locked") and not meta.get("solution") else "student"


# ---------------------------------------------------------------- 2. run, 3. record


@dataclass
class NotebookResult:
    name: str
    notebook: nbformat.NotebookNode | None  # None: not submitted
    notes: list[str]
    tampered: str = ""


def grader_fault(run: sandbox.SandboxRun, code: list[tuple[int, object]], limits: Limits, first: bool = True) -> str:
    """Why a run's failure is the grader's and not the student's, or '' when it is not.

    The grader's: the runner could not start or failed before any student cell began (the interpreter, the
    kit or an instructor setup cell), or the process was killed by a signal that none of its own limits sends.
    ``first``: no student code of the submission ran in an earlier notebook (so a wall-time stop before any
    student cell of this one is the grader's slowness, not the student's).
    """
    roles = {index: role(cell) for index, cell in code}
    student_started = any(roles.get(index) == "student" for index in run.cells)
    if run.refereed and run.returncode == REFEREE_FAILED:  # a status the referee alone ends with (never its runner's)
        return "the referee, the process that runs this notebook's tests, failed (its traceback is in the grading log)"
    if run.stopped.startswith("wall-time") and first and not student_started and not run.tampered:
        return f"the wall-time limit ({limits.wall_s:g} s) passed before any student code ran: the grading machine was too slow to start the notebook"
    if run.tampered or run.stopped:
        return ""
    setup_failed = [index for index, event in run.cells.items() if roles.get(index) == "instructor" and event.outcome
                    and event.outcome.get("error") and not any(roles.get(i) == "student" and i < index for i in roles)]
    if setup_failed:
        error = run.cells[setup_failed[0]].outcome["error"]
        return f"an instructor setup cell failed before any student code ran ({safe_text(error.get('ename'))}: {safe_text(error.get('evalue'), 200)})"
    if run.finished:
        return ""
    if not student_started:
        return f"the notebook's process ended (exit status {run.returncode}) before any student code ran: the sandbox or its interpreter could not start"
    killed = run.returncode in (-9, -15, 128 + 9, 128 + 15)
    cpu_possible = run.seconds * (os.cpu_count() or 1) >= limits.cpu_s
    if killed and not cpu_possible:
        return f"the notebook's process was killed from outside (exit status {run.returncode}) after {run.seconds:.0f} s, before any of its limits"
    return ""


def run_notebook(nb, trusted: TrustedAssignment, files: dict[str, Path], limits: Limits, deadline: float, jobs: int,
                 threads: int, uid: int | None = None, first: bool = True, student: str = "", notebook: str = "",
                 ) -> tuple[nbformat.NotebookNode, list[str], str, str, str]:
    """Run ``nb`` (the ``notebook`` of ``student``) in a sandbox and fill its outputs from the runner's reports.

    Each hidden part starts with its ``GRADING_SEED`` (``grading_seed``). Returns (notebook, notes, tampering, grader
    fault, log).
    """
    code = [(i, c) for i, c in enumerate(nb.cells) if c.cell_type == "code" and c.source.strip()]
    parts = {i: split_test(c.source) if role(c) == "test" else (c.source, "") for i, c in code}
    hidden = {i: seeded(part[1], grading_seed(trusted, notebook, assignments.grade_id(nb.cells[i]) or str(i), student), student)
              for i, part in parts.items() if part[1].strip()}
    job = {"cells": [{"index": i, "source": parts[i][0], "role": role(c), **({"hidden": len(hidden[i].encode())} if i in hidden else {})}
                     for i, c in code],
           "support_modules": [Path(n).stem for n in trusted.support_files if n.endswith(".py")],
           "assignment": trusted.assignment_id, "kit": list(trusted.kit) if trusted.kit is not None else None}
    names = trusted.referee.get(f"{notebook}.ipynb")
    if names:  # its tests run in the referee, which calls these names of the student's code (helpers.course.referee)
        job["referee"] = {"names": list(names)}
    run = sandbox.run_notebook(files, job, limits, deadline, jobs=jobs, threads=threads, uid=uid, hidden=hidden,
                               references=trusted.references)
    fault = grader_fault(run, code, limits, first)
    notes = []
    if run.tampered:
        stopped = f"the submission {run.tampered}: its results cannot be trusted"
    elif run.stopped:
        stopped = f"stopped at the {run.stopped}"
    elif not run.finished:
        stopped = f"the notebook's process ended (exit status {run.returncode}: the code ended the process, crashed, or was killed at a limit)"
    else:
        stopped = ""
    for count, (index, cell) in enumerate(code, 1):
        event = run.cells.get(index)
        outcome = event.outcome if event else None
        cell.execution_count = count if event else None
        if outcome and role(cell) == "test":
            cell.outputs = [_verdict(outcome, event.hidden, index in hidden), *_warning_notes(outcome)]
        else:
            cell.outputs = _outputs(outcome, stopped if not run.tampered else "") if outcome else []
        if outcome is None and (event or stopped):
            what = stopped or "the notebook stopped before this cell"
            cell.outputs = [nbformat.v4.new_output("error", ename="NotRun", evalue=f"{what}; this cell did not finish", traceback=[])]
        if run.tampered and assignments.is_graded_test(cell):
            cell.outputs = [nbformat.v4.new_output("error", ename="GradingChannelTampered", evalue=stopped, traceback=[])]
        for note in (outcome or {}).get("notes", []):
            notes.append(f"cell {assignments.grade_id(cell) or index}: {note}")
        limit = ((outcome or {}).get("error") or {}).get("limit") or ((event.hidden or {}).get("limit") if event else "")
        if limit:
            notes.append(f"cell {assignments.grade_id(cell) or index} hit the {limit}")
    if stopped:
        running = run.running
        where = f" while cell {assignments.grade_id(nb.cells[running]) or running} ran" if running is not None else ""
        notes.append(f"{stopped}{where}; the cells after it scored 0")
    if run.listening:
        notes.append(f"{LEFT_LISTENING} {', '.join(run.listening)} (the grader stopped them; a notebook stops the servers it starts)")
    log = f"sandbox exit status {run.returncode} after {run.seconds:.1f} s; finished: {run.finished}; {stopped or 'no limit hit'}\n{run.log}"
    return nb, notes, run.tampered, fault, log


def split_test(source: str) -> tuple[str, str]:
    """A test cell's visible part (before its first hidden region) and hidden part (the rest, markers left out)."""
    lines = source.splitlines()
    for number, line in enumerate(lines):
        if assignments.HIDDEN_BEGIN in line:
            rest = [text for text in lines[number:] if assignments.HIDDEN_BEGIN not in text and assignments.HIDDEN_END not in text]
            return "\n".join(lines[:number]), "\n".join(rest)
    return source, ""


SEED_NAME = "GRADING_SEED"  # defined at the top of every hidden part: hidden tests take their random choices from it
STUDENT_NAME = "GRADING_STUDENT"  # defined beside it: the roster id of the submission graded
GRADER_MARK = "[grader] "  # the first line of every message the grader writes into a test cell's output
_KNOWN = {"CellTimeoutError", "CpuLimitError", "RunnerError", "EOFError"}


def _exception_name(name) -> str:
    """An exception class name for the feedback: a builtin one (or the runner's), never a name the submission made up."""
    name = str(name or "")
    builtin = getattr(builtins, name, None)
    if name in _KNOWN or (isinstance(builtin, type) and issubclass(builtin, BaseException)):
        return name
    return "an exception raised by the submission's code"


def _verdict(outcome: dict, hidden: dict | None, has_hidden: bool):
    """The output of a test cell, written by the grader alone: passed, or which part failed and how (no text of the submission)."""
    error = outcome.get("error")
    if error and outcome.get("hidden_interrupted"):
        what, limit = "a hidden test did not finish (its code is not shown)", error.get("limit") and f" [hit the {error['limit']}]"
    elif error:
        line = f" on line {error['line']}" if isinstance(error.get("line"), int) else ""
        what = f"the visible test{line} failed: {_exception_name(error.get('ename'))}"
        limit = error.get("limit") and f" [hit the {error['limit']}]"
    elif outcome.get("stderr"):
        what, limit = "the test wrote to stderr, which counts as a failure", ""
    elif has_hidden and not (hidden or {}).get("passed"):
        hidden = hidden or {}
        if hidden.get("replaced"):
            what = "a hidden test failed: the code under test replaced " + ", ".join(map(str, hidden["replaced"]))[:400] + " while the tests ran"
        elif hidden.get("ename") == "stderr":
            what = "a hidden test wrote to stderr, which counts as a failure"
        else:
            what = f"a hidden test failed (its code is not shown): {_exception_name(hidden.get('ename'))}" if hidden else \
                "the hidden tests did not report (the process ended or was stopped)"
            if hidden.get("message"):  # an instructor's assertion message: which property failed, by how much
                what += f": {safe_text(hidden['message'], 500)}"
        limit = hidden.get("limit") and f" [hit the {hidden['limit']}]"
    else:
        return nbformat.v4.new_output("stream", name="stdout", text=f"{GRADER_MARK}passed\n")
    message = f"{GRADER_MARK}{what}{limit or ''}"
    return nbformat.v4.new_output("error", ename="TestFailed", evalue=message[len(GRADER_MARK):], traceback=[message])


def _warning_notes(outcome: dict) -> list:
    """The Python warnings a test cell raised, as notes under its verdict: shown, never counted as a failure."""
    raised = outcome.get("warnings") or []
    if not raised:
        return []
    lines = []
    for warning in raised:
        category = str(warning.get("category", ""))
        if not isinstance(getattr(builtins, category, None), type):
            category = "a warning class of the submission's code"
        lines.append(f"{GRADER_MARK}note: {category} from {str(warning.get('where', ''))[:120]!r}: {str(warning.get('message', ''))[:300]!r}\n")
    more = int(outcome.get("warnings_raised", len(raised))) - len(raised)
    if more > 0:
        lines.append(f"{GRADER_MARK}note: {more} more warning(s) not shown\n")
    head = f"{GRADER_MARK}the test raised Python warnings: they are notes, not failures (other writes to stderr fail a test)\n"
    return [nbformat.v4.new_output("stream", name="stdout", text=head + "".join(lines))]


def _outputs(outcome: dict, stopped: str) -> list:
    outputs = []
    for name in ("stdout", "stderr"):
        if outcome.get(name):
            outputs.append(nbformat.v4.new_output("stream", name=name, text=outcome[name]))
    if "result" in outcome:
        outputs.append(nbformat.v4.new_output("execute_result", data={"text/plain": outcome["result"]}, execution_count=None))
    if outcome.get("error"):
        error = outcome["error"]
        outputs.append(nbformat.v4.new_output("error", ename=str(error["ename"])[:200], evalue=str(error["evalue"]), traceback=[str(t) for t in error["traceback"]]))
    return outputs


def fingerprint(listing: intake.Listing, trusted: TrustedAssignment, limit: int) -> str:
    """What the grade depends on: every submitted file (read as a regular file, bounded) and the assignment's tests and support files."""
    digest = hashlib.sha256(trusted.fingerprint.encode())
    for problem in listing.problems:
        digest.update(problem.encode() + b"\0")
    if listing.problems:
        return digest.hexdigest()[:16]
    for name in sorted(listing.files):
        try:
            data = intake.read_regular(listing.folder / name, limit)
        except intake.Refused as err:
            data = str(err).encode()
        digest.update(name.encode() + b"\0" + data)
    return digest.hexdigest()[:16]


class TimingGate:
    """Notebooks an assignment marks timing-sensitive run alone: each waits until no other notebook runs, and holds
    the others back while it runs. The others share the machine as usual (a readers-writer lock, writers first)."""

    def __init__(self):
        self.condition = threading.Condition()
        self.running = 0
        self.alone = False
        self.waiting_alone = 0

    def enter(self, alone: bool) -> None:
        with self.condition:
            if alone:
                self.waiting_alone += 1
                self.condition.wait_for(lambda: self.running == 0 and not self.alone)
                self.waiting_alone -= 1
                self.alone = True
            else:
                self.condition.wait_for(lambda: not self.alone and not self.waiting_alone)
            self.running += 1

    def leave(self, alone: bool) -> None:
        with self.condition:
            self.running -= 1
            if alone:
                self.alone = False
            self.condition.notify_all()


class Grader:
    """Grades submissions of a course, ``jobs`` at a time; gradebook and status writes happen under one lock."""

    def __init__(self, course, limits: Limits, jobs: int):
        self.course, self.limits, self.jobs = course, limits, max(1, jobs)
        self.threads = max(1, (os.cpu_count() or 1) // self.jobs)
        self.lock = threading.Lock()
        self.trusted: dict[str, TrustedAssignment] = {}
        self.unusable: dict[str, Exception] = {}  # assignments whose references could not be made
        self.gate = TimingGate()
        self.uids = sandbox.UidLease(self.jobs)  # this run's own sandbox users, one per job slot
        sandbox.sweep_scratch()  # what graders killed mid-run left in the temporary directory
        self.slots: queue.Queue = queue.Queue()
        for slot in range(self.jobs):
            self.slots.put(slot)

    def close(self) -> None:
        self.uids.release()
        for trusted in self.trusted.values():
            if trusted.references:
                shutil.rmtree(trusted.references, ignore_errors=True)

    def assignment(self, assignment_id: str) -> TrustedAssignment:
        """The trusted assignment, read (and its references made) once per run; a failure is kept, not retried per submission."""
        with self.lock:
            if assignment_id in self.unusable:
                raise self.unusable[assignment_id]
            if assignment_id not in self.trusted:
                try:
                    self.trusted[assignment_id] = trusted_assignment(self.course, assignment_id)
                except references.ReferenceError as error:
                    self.unusable[assignment_id] = error
                    print(safe_text(f"{GRADER_SIDE}: {assignment_id}: {error}", 2000), flush=True)  # once per run
                    raise
            return self.trusted[assignment_id]

    def grade(self, student_id: str, assignment_id: str, on_roster: bool) -> Outcome:
        """Grade one submission in a free job slot; never raises for anything the submission did.

        A grader error (see grader_fault) is retried once; a second one is recorded with status ``error``.
        """
        slot = self.slots.get()
        try:
            outcome = self._grade(student_id, assignment_id, on_roster, slot)
            if outcome.status == "error":
                first = outcome.reason
                outcome = self._grade(student_id, assignment_id, on_roster, slot)
                if outcome.status == "error":
                    outcome.reason += f" (also on the first try: {first})"
                else:
                    outcome.reason = "; ".join(r for r in (outcome.reason, f"graded on a second try after a grader error ({first})") if r)
            return outcome
        finally:
            self.slots.put(slot)

    def _grade(self, student_id: str, assignment_id: str, on_roster: bool, slot: int) -> Outcome:
        start = time.monotonic()
        folder = self.course.submitted / student_id / assignment_id
        trusted = self.assignment(assignment_id)
        listing = intake.list_submission(folder, self.course.root, self.limits.submission_bytes)
        prints = fingerprint(listing, trusted, self.limits.submission_bytes)
        flag = "" if on_roster else "not on the roster"
        if listing.problems:
            return self._failed(student_id, assignment_id, trusted, "refused: " + "; ".join(listing.problems), start, on_roster, prints)
        top = listing.top_level()
        files = {name: folder / name for name in top if not name.endswith(".ipynb")}
        files.update(trusted.support_files)  # the released support files win over a student's copy
        expected = [f"{n.name}.ipynb" for n in trusted.notebooks]
        found = [name for name in top if name.endswith(".ipynb")]
        if not set(expected) & set(found):
            reason = f"no notebook of the assignment in the submission: expected {', '.join(expected)}; found {', '.join(found) or 'nothing'}"
            return self._failed(student_id, assignment_id, trusted, reason, start, on_roster, prints)
        deadline = time.monotonic() + self.limits.wall_s
        logs = []
        results, notes, tampered, faults = [], [], [], []
        for notebook in trusted.notebooks:
            path = folder / f"{notebook.name}.ipynb"
            if path.name not in found:
                notes.append(f"missing {path.name} (0 points)")
                results.append(NotebookResult(notebook.name, None, []))
                continue
            try:
                submitted = nbformat.reads(intake.read_regular(path, self.limits.submission_bytes).decode("utf-8"), as_version=4)
                nbformat.validate(submitted)
            except Exception as err:  # noqa: BLE001 - an unreadable notebook is a reason, not a crash
                message = safe_text((str(err).strip().splitlines() or [type(err).__name__])[0][:160])
                return self._failed(student_id, assignment_id, trusted, f"{path.name} is not a valid notebook ({message})", start, on_roster, prints)
            nb, rebuild_notes = rebuild(notebook, submitted)
            del submitted
            alone = path.name in trusted.timing_sensitive and self.jobs > 1
            queued = time.monotonic()
            self.gate.enter(alone)
            deadline += time.monotonic() - queued  # time spent waiting for a timing-sensitive notebook is not the student's
            try:
                nb, run_notes, tamper, fault, log = run_notebook(nb, trusted, {**files}, self.limits, deadline, self.jobs,
                                                                 (os.cpu_count() or 1) if alone else self.threads, self.uids.uids[slot],
                                                                 first=not any(r.notebook is not None for r in results),
                                                                 student=student_id, notebook=notebook.name)
            finally:
                self.gate.leave(alone)
            if alone:
                run_notes.append("timing-sensitive: ran alone on the machine")
            if fault:
                faults.append(f"{path.name}: {fault}")
            logs.append(f"== {path.name}\n{log}")
            results.append(NotebookResult(notebook.name, nb, rebuild_notes + run_notes, tamper))
            notes += [f"{path.name}: {n}" for n in rebuild_notes + run_notes]
            if tamper:
                tampered.append(f"{path.name}: {tamper}")
        self.course.log_path("autograde", student_id, assignment_id).write_text("\n".join(logs))
        if faults:
            reason = f"{GRADER_SIDE}: " + "; ".join(faults) + f" (nothing recorded; log: {self.course.log_path('autograde', student_id, assignment_id)})"
            return Outcome(student_id, assignment_id, "error", 0.0, trusted.max_score, time.monotonic() - start, on_roster, reason, "")
        extra = sorted(name for name in found if name[:-len(".ipynb")] not in {n.name for n in trusted.notebooks})
        notes += [f"ignored {safe_text(name)} (not part of the assignment)" for name in extra]
        if tampered:
            reason = "; ".join(tampered) + " (a submission that writes to the grader's channel scores 0)"
            return self._failed(student_id, assignment_id, trusted, reason, start, on_roster, prints, results)
        score = self._record(student_id, assignment_id, results, folder)
        return Outcome(student_id, assignment_id, "graded", score, trusted.max_score, time.monotonic() - start, on_roster,
                       "; ".join(([flag] if flag else []) + notes), prints)

    def _failed(self, student_id, assignment_id, trusted, reason, start, on_roster, prints, results=()) -> Outcome:
        self._record(student_id, assignment_id, results, None, zero=True)
        flag = "" if on_roster else "; not on the roster"
        return Outcome(student_id, assignment_id, "failed", 0.0, trusted.max_score, time.monotonic() - start, on_roster, reason + flag, prints)

    def _record(self, student_id: str, assignment_id: str, results: Iterable[NotebookResult], folder: Path | None, zero: bool = False) -> float:
        """Write the graded notebooks and the gradebook's scores (nbgrader's SaveAutoGrades); returns the score."""
        from nbgrader.preprocessors import SaveAutoGrades

        graded = self.course.autograded / student_id / assignment_id
        with self.lock, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nbgrader's update_or_create_submission trips SQLAlchemy's autoflush warnings
            shutil.rmtree(graded, ignore_errors=True)
            graded.mkdir(parents=True)
            stamp = _timestamp(folder / "timestamp.txt") if folder else None
            with self.course.gradebook() as gb:
                gb.update_or_create_student(student_id)
                if stamp is not None:
                    gb.update_or_create_submission(assignment_id, student_id, timestamp=stamp[0])
                    (graded / "timestamp.txt").write_text(stamp[1])
                else:
                    gb.update_or_create_submission(assignment_id, student_id)
            for result in results:
                if result.notebook is not None:
                    nbformat.write(result.notebook, graded / f"{result.name}.ipynb")
                    if not zero:
                        resources = {"nbgrader": {"notebook": result.name, "assignment": assignment_id, "student": student_id, "db_url": self.course.db_url()}}
                        SaveAutoGrades().preprocess(copy.deepcopy(result.notebook), resources)
            with self.course.gradebook() as gb:
                submission = gb.find_submission(assignment_id, student_id)
                written = {r.name for r in results if r.notebook is not None and not zero}
                for notebook in submission.notebooks:
                    if notebook.name not in written:
                        for grade in notebook.grades:
                            grade.auto_score, grade.manual_score, grade.needs_manual_grade = 0, None, False
                gb.db.commit()
                return float(gb.find_submission(assignment_id, student_id).score)

    def save_status(self, outcome: Outcome) -> None:
        with self.lock:
            write_status(self.course, [outcome])


def _timestamp(path: Path):
    """(time, text) of a submission's timestamp.txt, or None when it is missing, not a small regular file or not a time."""
    from nbgrader.utils import parse_utc

    try:
        text = intake.read_regular(path, 200).decode().strip()
        return parse_utc(text), text
    except Exception:  # noqa: BLE001 - a missing or odd timestamp is no timestamp
        return None


def autograde(course, pending: Sequence[tuple[str, str]], released: set[str], roster: set[str], limits: Limits, jobs: int,
              regrade: bool = False) -> list[Outcome]:
    """Grade ``pending`` (student, assignment) pairs, ``jobs`` at a time; print a line and save the status as each finishes."""
    grader = Grader(course, limits, jobs)
    try:
        return _autograde(grader, course, pending, released, roster, limits, regrade)
    finally:
        grader.close()


def _autograde(grader, course, pending, released, roster, limits, regrade) -> list[Outcome]:
    previous = read_status(course)
    outcomes, todo = [], []
    for student_id, assignment_id in pending:
        on_roster = student_id in roster
        if assignment_id not in released:
            reason = f"assignment {assignment_id!r} was never released (run `make release A={assignment_id}`; released: {', '.join(sorted(released)) or 'none'})"
            outcome = Outcome(student_id, assignment_id, "failed", 0.0, 0.0, 0.0, on_roster, reason)
            grader.save_status(outcome)
            outcomes.append(outcome)
            continue
        row = previous.get((student_id, assignment_id))
        folder = course.submitted / student_id / assignment_id
        trusted = _usable(grader, assignment_id)
        if not regrade and row and row.get("status") in ("graded", "failed") and (course.autograded / student_id / assignment_id).exists() \
                and trusted and row.get("fingerprint") == fingerprint(intake.list_submission(folder, course.root, limits.submission_bytes),
                                                                      trusted, limits.submission_bytes):
            outcomes.append(_from_row(row))
            continue
        todo.append((student_id, assignment_id, on_roster))
    skipped = len(pending) - len(todo) - sum(o.status == "failed" and not o.fingerprint for o in outcomes)
    if skipped:
        print(f"{skipped} submission(s) already graded with these files and tests: kept (REGRADE=1 or --regrade grades them again)", flush=True)
    print(f"grading {len(todo)} submission(s), {grader.jobs} at a time; {sandbox.isolation()}; limits: {limits.describe()}", flush=True)
    if any(_usable(grader, assignment_id) and grader.assignment(assignment_id).language_model for _, assignment_id, _ in todo):
        print(prepare_language_model(), flush=True)
    with ThreadPoolExecutor(max_workers=grader.jobs) as pool:
        futures = {pool.submit(_grade_safely, grader, *item): item for item in todo}
        for number, future in enumerate(as_completed(futures), 1):
            outcome = future.result()
            grader.save_status(outcome)
            outcomes.append(outcome)
            detail = f"{outcome.score:g}/{outcome.max_score:g} ({outcome.percent:.0f}%)" if outcome.status == "graded" else outcome.reason
            print(safe_text(f"[{number}/{len(todo)}] {outcome.status:>6}  {outcome.assignment_id}  {outcome.student_id}  {outcome.seconds:.1f} s  {detail}", 100_000), flush=True)
    order = {pair: i for i, pair in enumerate(pending)}
    return sorted(outcomes, key=lambda o: order[(o.student_id, o.assignment_id)])


def _usable(grader: Grader, assignment_id: str) -> TrustedAssignment | None:
    """The trusted assignment, or None when its instructors' files could not be made (the grader said why): its submissions are
    then recorded as grader errors, one by one, and the rest of the class is graded."""
    try:
        return grader.assignment(assignment_id)
    except references.ReferenceError:
        return None


def prepare_language_model() -> str:
    """Write the language model's weight cache on this machine, once, before sandboxes read it (they cannot write it:
    it is larger than their disk limit); a line saying where it is, or why the notebooks that load it will fail."""
    from helpers.serving.smollm import ModelFileError, ensure_cache

    try:
        return f"language model: weights cached at {ensure_cache()} (read-only in each sandbox)"
    except ModelFileError as error:
        return f"language model: unavailable, so the notebooks that load it fail as the grader's fault: {error}"


def _grade_safely(grader: Grader, student_id: str, assignment_id: str, on_roster: bool) -> Outcome:
    """Grade, turning a failure of the grader itself on this submission into a failed row (the others go on)."""
    try:
        return grader.grade(student_id, assignment_id, on_roster)
    except Exception as err:  # noqa: BLE001 - one submission's problem must not stop the class
        return Outcome(student_id, assignment_id, "error", 0.0, 0.0, 0.0, on_roster,
                       f"{GRADER_SIDE}: the grader could not grade this submission: {type(err).__name__}: {err} (report it if it persists)")


def _from_row(row: dict) -> Outcome:
    return Outcome(row["student_id"], row["assignment_id"], row["status"], float(row["score"]), float(row["max_score"]),
                   float(row["seconds"]), row["on_roster"] == "True", row["reason"], row.get("fingerprint", ""))


def read_status(course) -> dict[tuple[str, str], dict]:
    """The last autograding outcome of each (student, assignment), from autograde_status.csv."""
    path = course.root / STATUS_FILE
    if not path.exists():
        return {}
    with path.open(newline="") as f:
        return {(r["student_id"], r["assignment_id"]): r for r in csv.DictReader(f)}


def write_status(course, outcomes: Iterable[Outcome]) -> None:
    """Merge these outcomes into autograde_status.csv (written to a temporary file, then moved into place)."""
    rows = read_status(course)
    for o in outcomes:
        rows[(o.student_id, o.assignment_id)] = {**dataclasses.asdict(o), "score": f"{o.score:g}", "max_score": f"{o.max_score:g}", "seconds": f"{o.seconds:.1f}"}
    safe = {key: {k: safe_text(v, 100_000) if k == "reason" else v for k, v in row.items()} for key, row in rows.items()}
    fields = [f.name for f in dataclasses.fields(Outcome) if f.init]
    temporary = course.root / (STATUS_FILE + ".tmp")
    with temporary.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore", restval="")
        writer.writeheader()
        writer.writerows(safe[key] for key in sorted(safe))
    os.replace(temporary, course.root / STATUS_FILE)
