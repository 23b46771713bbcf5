"""What a submission folder, an LMS download and a feedback page can carry, and graders that never blame students.

One tiny course graded once with ``make autograde JOBS=2`` (links, a FIFO, a device, a 2 GiB file, a
8 MiB notebook, code that hunts for the hidden tests, thin imports of the kit, a notebook killed from
outside), two more graded by two ``make autograde`` at once, and LMS downloads of every hostile kind.
"""
from __future__ import annotations

import csv
import io
import os
import re
import stat
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import nbformat
import psutil
import pytest

from helpers.course import grading, intake, kit_use, lms_import, sandbox
from helpers.course.grading import Course, read_status

from .grading_support import ROOT, environment, submit, tiny_course, with_solution

A, PART = "hw2_profiling", "part1_sums.ipynb"
HIDDEN = "hidden check of f1"
MEMORY_BOUND = 500 * 2**20  # the grader's own peak resident memory, whatever is submitted


def solved(course: Path):
    return nbformat.read(course / "source" / A / PART, as_version=4)


def added(nb, code: str, at: int = 2):
    nb = nbformat.reads(nbformat.writes(nb), as_version=4)
    nb.cells.insert(at, nbformat.v4.new_code_cell(code))
    return nb


HUNTER = '''def f1(x):
    import gc, inspect, linecache, sys, warnings
    warnings.simplefilter("ignore")
    found = []
    frame = sys._getframe(1)
    while frame is not None:                      # 1. walk the stack to the running test cell
        found.append(repr(frame.f_code.co_consts))
        found += linecache.getlines(frame.f_code.co_filename)
        try:
            found.append(inspect.getsource(frame.f_code))   # 3. inspect.getsource of what is running
        except (OSError, TypeError):
            pass
        frame = frame.f_back
    for o in gc.get_objects():                    # 2. the runner's job, through gc
        if isinstance(o, dict) and "cells" in o:
            found.append(repr(o))
    with open("/tmp/loot.txt", "a") as f:
        f.write("\\n".join(found))
    print("\\n".join(found))
    return x + 1'''


def _peak_resident_bytes(pid: int) -> int:
    """A process's peak resident memory so far (Linux's VmHWM); 0 once it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:")), 0)


def make_autograde(course: Path, *variables: str, peak: list | None = None) -> subprocess.CompletedProcess:
    """``make autograde COURSE=<course> ...``; with ``peak``, the grader process's own peak resident memory is appended to it."""
    command = ["make", "--no-print-directory", "-C", str(ROOT), "autograde", f"COURSE={course}", *variables]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment())
    highest = 0
    out: dict[str, str] = {}
    readers = [threading.Thread(target=lambda n=n, s=s: out.__setitem__(n, s.read()), daemon=True)
               for n, s in (("stdout", process.stdout), ("stderr", process.stderr))]
    for reader in readers:
        reader.start()
    while process.poll() is None:  # each grading process's high-water mark (VmHWM): a look every 0.25 s misses no peak
        try:
            for child in psutil.Process(process.pid).children(recursive=True):
                if "helpers.course.grading" in " ".join(child.cmdline()):
                    highest = max(highest, _peak_resident_bytes(child.pid))
        except psutil.Error:
            pass
        time.sleep(0.25)
    for reader in readers:
        reader.join()
    if peak is not None:
        peak.append(highest)
    return subprocess.CompletedProcess(command, process.returncode, out.get("stdout", ""), out.get("stderr", ""))


@pytest.fixture(scope="module")
def doors(tmp_path_factory):
    root = tiny_course(tmp_path_factory.mktemp("doors") / "course", {A: {PART: {1: 2.0, 2: 3.0}}})
    (root / "source" / A / "assignment.toml").write_text('kit = ["helpers.core.launch"]\n')
    grading.release(Course(root))
    good = solved(root)
    submit(root, "honest", A, {PART: good})
    submit(root, "victim", A, {PART: good})
    victim = root / "submitted" / "victim" / A / PART

    def linked(student, target, name=PART):
        folder = root / "submitted" / student / A
        folder.mkdir(parents=True)
        (folder / name).symlink_to(target)
        if name != PART:
            nbformat.write(good, folder / PART)

    linked("copies_classmate", victim)
    linked("copies_source", root / "source" / A / PART)
    linked("reads_environ", "/proc/self/environ", "notes.txt")
    linked("reads_gradebook", root / "gradebook.db", "gradebook.db")
    (root / "submitted" / "folder_link").mkdir()
    (root / "submitted" / "folder_link" / A).symlink_to(victim.parent)
    (root / "submitted" / "fifo" / A).mkdir(parents=True)
    os.mkfifo(root / "submitted" / "fifo" / A / PART)
    (root / "submitted" / "device" / A).mkdir(parents=True)
    (root / "submitted" / "device" / A / "data.bin").symlink_to("/dev/zero")
    nbformat.write(good, root / "submitted" / "device" / A / PART)
    submit(root, "huge_file", A, {PART: good})
    with open(root / "submitted" / "huge_file" / A / "weights.bin", "wb") as f:
        f.truncate(2 * 2**30)  # sparse: 2 GiB listed, nothing on disk
    submit(root, "big_notebook", A, {PART: with_solution(good, "task1_f1", "def f1(x):\n    return x + 1\n# " + "z" * (8 * 2**20))})
    after = ("def count():  # the needle is made here, so that no dict of the notebook holds it\n"
             "    import gc, warnings\n    warnings.simplefilter('ignore')\n    needle = 'hidden check ' + 'of f1'\n"
             "    return sum(needle in repr(o) for o in gc.get_objects() if isinstance(o, dict))\n"
             "print('GC-FOUND', count())\nprint(open('/tmp/loot.txt').read()[:20000])")
    submit(root, "hunts_hidden_tests", A, {PART: added(with_solution(good, "task1_f1", HUNTER), after, at=3)})
    submit(root, "thin_import", A, {PART: with_solution(good, "task1_f1", "from helpers.serving import export_onnx\ndef f1(x):\n    return x + 1")})
    submit(root, "thin_attribute", A, {PART: with_solution(good, "task1_f1", "import helpers\ndef f1(x):\n    helpers.serving\n    return x + 1")})
    submit(root, "killed_once", A, {PART: added(good, "import subprocess\nsubprocess.run(['sleep', '4.321'])", at=1)})
    killer = threading.Thread(target=_kill_first_sleeper, daemon=True)
    killer.start()
    peak: list[int] = []
    start = time.monotonic()
    result = make_autograde(root, "JOBS=2", "TIMEOUT=300", peak=peak)
    seconds = time.monotonic() - start
    feedback = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), "feedback", f"COURSE={root}"], capture_output=True,
                              text=True, env=environment(), timeout=900)
    return {"root": root, "result": result, "status": read_status(Course(root)), "peak": peak[0], "seconds": seconds, "feedback": feedback}


def _kill_first_sleeper():
    """Kill, from outside, the notebook that runs `sleep 4.321` the first time (as a crash of the machine or a TA would)."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            if process.info["cmdline"] == ["sleep", "4.321"]:
                try:
                    process.parent().kill()
                    return
                except (psutil.Error, AttributeError):
                    pass
        time.sleep(0.2)


def row(doors, student):
    r = doors["status"][(student, A)]
    return r["status"], float(r["score"]), r["reason"]


@pytest.mark.parametrize("student, kind", [("copies_classmate", "symbolic link"), ("copies_source", "symbolic link"),
                                           ("reads_environ", "symbolic link"), ("reads_gradebook", "symbolic link"),
                                           ("folder_link", "symbolic link"), ("fifo", "FIFO"), ("device", "symbolic link")])
@pytest.mark.grading  # runs the sandboxed autograder
def test_links_fifos_and_devices_are_refused_with_a_reason(doors, student, kind):
    status, points, reason = row(doors, student)
    assert (status, points) == ("failed", 0.0) and "refused" in reason and kind in reason, reason
    assert not (doors["root"] / "autograded" / student / A / PART).exists() or points == 0.0


@pytest.mark.grading  # runs the sandboxed autograder
def test_the_rest_of_the_class_is_graded_and_a_fifo_does_not_hang_the_grader(doors):
    assert row(doors, "honest")[:2] == ("graded", 5.0) and row(doors, "victim")[:2] == ("graded", 5.0)
    assert doors["seconds"] < 600, doors["seconds"]


@pytest.mark.grading  # runs the sandboxed autograder
def test_big_inputs_are_refused_before_they_are_read_and_the_grader_stays_small(doors):
    status, points, reason = row(doors, "huge_file")
    assert status == "failed" and "MiB, the limit for one submission" in reason, reason
    assert doors["peak"] < MEMORY_BOUND, f"the grader peaked at {doors['peak'] / 2**20:.0f} MiB"
    pages = list((doors["root"] / "feedback" / "big_notebook").rglob("*.html"))
    assert pages and all(p.stat().st_size < 2 * 2**20 for p in pages), [p.stat().st_size for p in pages]


@pytest.mark.grading  # runs the sandboxed autograder
def test_hidden_tests_reach_nothing_a_student_sees(doors):
    assert row(doors, "hunts_hidden_tests")[:2] == ("graded", 5.0), row(doors, "hunts_hidden_tests")
    graded = nbformat.read(doors["root"] / "autograded" / "hunts_hidden_tests" / A / PART, as_version=4)
    printed = "".join(str(o.get("text", "")) for c in graded.cells for o in c.get("outputs", []))
    assert "assert f1(1) == 2" in printed, "the hunt ran (it found the visible test on the stack)"
    assert "GC-FOUND 0" in printed, "the notebook's process held the hidden tests (the runner's job, through gc)"
    pages = list((doors["root"] / "feedback").rglob("*.html"))
    assert {p.parts[-3] for p in pages} >= {"honest", "hunts_hidden_tests"}
    for page in pages:
        text = page.read_text()
        assert HIDDEN not in text and "f1(10)" not in text and "loot" not in text.replace("/tmp/loot.txt", "") or "hunts" not in str(page)


@pytest.mark.grading  # runs the sandboxed autograder
def test_feedback_holds_only_what_the_grader_wrote(doors):
    page = next((doors["root"] / "feedback" / "hunts_hidden_tests").rglob("*.html")).read_text()
    assert "[grader] passed" in page
    assert "co_consts" in page, "the student's own code is on the page"
    assert "assert f1(1) == 2\n" not in re.sub(r"<[^>]+>", "", page).split("[grader]")[-1], "outputs of the submission are not"


@pytest.mark.grading  # runs the sandboxed autograder
def test_an_assignment_declares_its_part_of_the_kit(doors):
    for student in ("thin_import", "thin_attribute"):
        status, points, reason = row(doors, student)
        assert status == "graded" and points == 3.0, (student, reason)  # task 1 fails, task 2 still counts
        graded = nbformat.read(doors["root"] / "autograded" / student / A / PART, as_version=4)
        errors = [o for c in graded.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
        assert any("ImportError" in (o["ename"] + o["evalue"]) for o in errors), errors
    graded = nbformat.read(doors["root"] / "autograded" / "thin_import" / A / PART, as_version=4)
    errors = [o for c in graded.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert any(o["ename"] == "ImportError" and "not part of the kit that hw2_profiling may use" in o["evalue"] for o in errors), errors


@pytest.mark.grading  # runs the sandboxed autograder
def test_a_notebook_killed_from_outside_is_a_grader_error_retried_once(doors):
    status, points, reason = row(doors, "killed_once")
    assert (status, points) == ("graded", 5.0) and "second try after a grader error" in reason, reason


@pytest.mark.grading  # runs the sandboxed autograder
def test_two_graders_at_once_keep_to_their_own_uids_and_grade_exactly(tmp_path):
    courses = []
    for name in ("first", "second"):
        root = tiny_course(tmp_path / name, {A: {PART: {1: 2.0, 2: 3.0}}})
        (root / "source" / A / "assignment.toml").write_text(f'timing_sensitive = ["{PART}"]\n')
        grading.release(Course(root))
        stamp = "import os, time\nprint('UID', os.getuid(), 'FROM', time.time())\ntime.sleep(2)\nprint('TO', time.time())"
        for student in ("alice", "bob"):
            submit(root, student, A, {PART: added(solved(root), stamp)})
        courses.append(root)
    results: dict[str, subprocess.CompletedProcess] = {}
    threads = [threading.Thread(target=lambda r=r: results.__setitem__(r.name, make_autograde(r, "JOBS=2"))) for r in courses]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    uids, spans = {}, {}
    for root in courses:
        assert results[root.name].returncode == 0, results[root.name].stdout + results[root.name].stderr
        status = read_status(Course(root))
        assert {(s, float(r["score"])) for (s, _), r in status.items()} == {("alice", 5.0), ("bob", 5.0)}
        for student in ("alice", "bob"):
            graded = nbformat.read(root / "autograded" / student / A / PART, as_version=4)
            text = "".join(str(o.get("text", "")) for c in graded.cells for o in c.get("outputs", []))
            uid, begin, end = re.search(r"UID (\d+) FROM ([\d.]+)\s+TO ([\d.]+)", text).groups()
            uids.setdefault(root.name, set()).add(int(uid))
            spans.setdefault(root.name, []).append((float(begin), float(end)))
            assert "timing-sensitive: ran alone" in status[(student, A)]["reason"]
    if os.getuid() == 0:
        assert not uids["first"] & uids["second"], f"two grading runs shared sandbox uids: {uids}"
    for name, (one, two) in spans.items():
        assert one[1] <= two[0] or two[1] <= one[0], f"{name}: timing-sensitive notebooks overlapped: {spans[name]}"


def test_uid_leases_are_exclusive_on_the_machine():
    if os.getuid() != 0:
        pytest.skip("sandbox uids are leased only when grading as root (otherwise the sandbox runs as the grader's user)")
    with sandbox.UidLease(2) as first, sandbox.UidLease(2) as second:
        assert len(set(first.uids)) == 2 and not set(first.uids) & set(second.uids)
        assert all(sandbox.UID_BASE <= uid < sandbox.UID_BASE + sandbox.UID_COUNT for uid in first.uids + second.uids)


@pytest.mark.grading  # runs the sandboxed autograder
def test_a_symlinked_environment_grades(tmp_path, monkeypatch):
    linked = tmp_path / "linked-venv"
    linked.symlink_to(Path(sys.prefix).resolve())
    monkeypatch.setattr(sys, "executable", str(linked / "bin" / Path(sys.executable).name))
    monkeypatch.setattr(sys, "prefix", str(linked))
    cells = [{"index": 0, "role": "student", "source": "import sys\nprint(sys.prefix)"}]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(), time.monotonic() + 300)
    assert run.finished and str(linked) in run.cells[0].outcome["stdout"], (run.returncode, run.log[-2000:])


@pytest.mark.grading  # runs the sandboxed autograder
def test_a_grader_side_failure_is_an_error_with_a_rerun_command(tmp_path):
    root = tiny_course(tmp_path / "course", {A: {PART: {1: 1.0}}})
    nb = nbformat.read(root / "source" / A / PART, as_version=4)
    setup = {"grade": False, "solution": False, "locked": True, "schema_version": 3, "grade_id": "setup"}
    nb.cells.insert(1, nbformat.v4.new_code_cell("import a_module_the_grader_lacks", metadata={"nbgrader": setup}))
    nbformat.write(nb, root / "source" / A / PART)
    grading.release(Course(root))
    submit(root, "alice", A, {PART: nb})
    result = make_autograde(root, "JOBS=1")
    row = read_status(Course(root))[("alice", A)]
    assert row["status"] == "error" and "grader error" in row["reason"] and "instructor setup cell" in row["reason"], row
    assert "also on the first try" in row["reason"], "retried once"
    assert result.returncode != 0 and "make autograde S=alice" in result.stderr, result.stderr


# ---------------------------------------------------------------- LMS downloads


def _zip(path: Path, entries, modes: dict[str, int] | None = None) -> Path:
    """A zip of (name, bytes) entries (a dict, or a list where a name may repeat), with the given Unix modes."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about a duplicate name, which is the point
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
            for name, data in (entries.items() if isinstance(entries, dict) else entries):
                info = zipfile.ZipInfo(name)
                info.external_attr = (modes or {}).get(name, 0o100644) << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                z.writestr(info, data)
    return path


def test_lms_downloads_are_imported_bounded_per_student_and_atomically(tmp_path):
    root = tiny_course(tmp_path / "course", {A: {PART: {1: 1.0}}})
    nb = nbformat.writes(nbformat.read(root / "source" / A / PART, as_version=4)).encode()
    course = Course(root)
    week1 = _zip(tmp_path / "week1.zip", {f"alice_{PART}": nb, f"bob/{PART}": nb})
    assert grading.import_zip(course, week1, A) == ["alice", "bob"]
    week2 = _zip(tmp_path / "week2.zip", [
        (f"alice_{PART}", nb + b" "),                     # a new version replaces last week's
        (f"../{PART}", nb), (f"./{PART}", nb),            # ids '..' and '.'
        (f"=1+2_{PART}", nb), (f"-2+3_{PART}", nb), (f"@SUM(1)_{PART}", nb),
        (f"eve\nERROR: forged_{PART}", nb), (f"mal\x1b[31mlory_{PART}", nb), (f"rtl\u202eevil_{PART}", nb),
        (f"\u0430lice/{PART}", nb),                        # Cyrillic a: a look-alike of the roster's alice
        (f"carol/{PART}", nb), (f"carol_{PART}", nb),      # both forms: carol is refused, the others go on
        (f"dmitri/{PART}", nb), (f"dmitri/{PART}", nb),    # the same entry twice
        (f"erin/bob_{PART}", nb),                          # a file in erin's folder that names bob
        (f"frank/{PART}", b"link target"), ("frank/extra.ipynb", nb),
        (f"zed/{PART}", nb), ("readme.txt", b"hello"),
    ], modes={f"frank/{PART}": 0o120777, f"zed/{PART}": 0o106777})
    imported = grading.import_zip(course, week2, A)
    assert imported == ["alice", "zed"], imported
    submitted = root / "submitted"
    assert sorted(p.name for p in submitted.iterdir() if not p.name.startswith(".")) == ["alice", "bob", "zed"]
    assert (submitted / "alice" / A / PART).read_bytes() == nb + b" " and (submitted / "bob" / A / PART).read_bytes() == nb
    assert not (root / PART).exists() and not (submitted / A).exists() and not (root / A).exists()
    for path in submitted.rglob("*"):
        mode = stat.S_IMODE(path.lstat().st_mode)
        assert not path.is_symlink() and mode in (0o644, 0o755), (path, oct(mode))
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"mallory_{PART}", b"0" * (200 * 2**20))
    (tmp_path / "bomb.zip").write_bytes(bomb.getvalue())
    with pytest.raises(grading.GradingError, match="zip bomb"):
        grading.import_zip(course, tmp_path / "bomb.zip", A)
    assert sorted(p.name for p in submitted.iterdir()) == ["alice", "bob", "zed"], "a refused archive leaves nothing behind"


def test_lms_import_reports_each_refused_student_safely(tmp_path, capsys):
    root = tiny_course(tmp_path / "course", {A: {PART: {1: 1.0}}})
    archive = _zip(tmp_path / "d.zip", {f"=HYPERLINK(1)_{PART}": b"{}", f"eve\nERROR: x_{PART}": b"{}", f"\u0430lice_{PART}": b"{}",
                                        f"carol/{PART}": b"{}", f"carol_{PART}": b"{}"})
    grading.import_zip(Course(root), archive, A)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and not re.search(r"^ERROR", out, re.M)
    assert "looks like the roster's 'alice'" in out and "both forms" in out
    assert all(not line.startswith(("=", "+", "-", "@")) for line in out.splitlines())


def test_csv_and_console_text_is_neutralised(tmp_path):
    for text in ("=1+2", "+SUM(1;1)", "@SUM(1)", "-2+3", "\tx", "\rx", "=HYPERLINK(\"http://x\")"):
        assert not intake.safe_text(text).startswith(("=", "+", "-", "@", "\t", "\r")), text
    assert intake.safe_text("a\x1b[31mb\u202ec\nERROR: d") == "a\\u001b[31mb\\u202ec ERROR: d"
    root = tiny_course(tmp_path / "course", {})
    course = Course(root)
    outcome = grading.Outcome("alice", A, "failed", 0.0, 1.0, 0.1, True, "=cmd|' /C calc'!A0\x1b[2J")
    grading.write_status(course, [outcome])
    with (root / grading.STATUS_FILE).open(newline="") as f:
        reason = next(csv.DictReader(f))["reason"]
    assert reason.startswith("'=") and "\x1b" not in reason
    (root / "submitted" / "=1+2" / A).mkdir(parents=True)
    assert course.submissions() == [], "a folder whose name is not a student id is skipped"


def test_student_ids_are_checked():
    assert intake.check_student_id("alice", ["alice"]) == "alice"
    assert intake.check_student_id("ｂｏｂ") == "bob", "NFKC-normalised"
    for bad in ("..", ".", "", "=1+2", "a/b", "x" * 65, "eve\n"):
        with pytest.raises(intake.Refused):
            intake.check_student_id(bad)
    with pytest.raises(intake.Refused, match="looks like"):
        intake.check_student_id("\u0430lice", ["alice"])


@pytest.mark.instructor  # reads the assignments' sources
def test_every_assignment_declares_what_its_notebooks_import_from_the_kit():
    import ast

    for folder in sorted((ROOT / "assignments" / "source").iterdir()):
        declared = kit_use.declaration(folder)
        assert declared.kit is not None, f"{folder.name} has no {kit_use.DECLARATION}"
        rules = kit_use.Rules(folder.name, declared.kit, str(folder), declared.support_modules)
        assert set(declared.support_modules) == {p.stem for p in folder.glob("*.py")}
        for path in folder.glob("*.ipynb"):
            for cell in nbformat.read(path, as_version=4).cells:
                if cell.cell_type != "code":
                    continue
                code = "\n".join(line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!")))
                for node in ast.walk(ast.parse(code)):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("helpers"):
                        for alias in node.names:
                            assert rules.allows(f"{node.module}.{alias.name}"), (path.name, node.module, alias.name)


def test_the_import_hook_holds_in_a_students_notebook(tmp_path, monkeypatch):
    (tmp_path / "assignment.toml").write_text('kit = ["helpers.core.launch"]\nsupport_modules = []\n')
    monkeypatch.chdir(tmp_path)
    import builtins

    before = builtins.__import__
    with kit_use.scoped():
        kit_use.enforce()
        namespace = {"__name__": "__main__"}
        exec("from helpers.core import launch", namespace)  # noqa: S102
        for source in ("from helpers.serving import export_onnx", "import helpers.serving", "import helpers\nhelpers.pick_device",
                       "import importlib\nimportlib.import_module('helpers.training')",
                       "__import__('helpers.serving', fromlist=['DynamicBatcher'])",  # no globals passed: the caller is judged
                       "__import__('helpers.serving')", "import builtins\nbuiltins.__import__('helpers.training', None, None, ['x'])",
                       "import importlib\nimportlib.__import__('helpers.serving', fromlist=['DynamicBatcher'])"):
            with pytest.raises(ImportError, match="not part of the kit that .* may use"):
                exec(source, dict(namespace))  # noqa: S102
        config = {"c": {}, "__file__": str(tmp_path.parent / "course" / "nbgrader_config.py")}  # how traitlets runs a course's config file
        exec("from helpers.course.feedback_filters import RemoveHiddenTests", config)  # noqa: S102
    exec("from helpers.serving import start_ray_service", {"__name__": "__main__"})  # noqa: S102 - the hook is gone afterwards
    assert builtins.__import__ is before
    assert lms_import.MAX_RATIO > 1
