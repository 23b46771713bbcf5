"""A hostile class: submissions that cheat, snoop, crash or sabotage, graded in parallel sandboxes in one run.

The assignment is tiny (two tasks, a support module the tests call, a visible and a hidden test per
task), so the whole corpus grades in well under a minute; the real assignments go through the same
pipeline in tests/test_assignments.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from helpers.course import grading, sandbox
from helpers.course.grading import Course, read_status

from .grading_support import ROOT, environment, submit

pytestmark = pytest.mark.grading

A, PART = "hw2_profiling", "part1_sums.ipynb"
CELL_S = 10  # the per-cell limit of the corpus: short, with room for a loaded 2-core machine
HIDDEN_LINE = "expect(f1(10), 11, 'the hidden check of f1')"
LAB = ("class Judge:\n    def same(self, value, wanted):\n        return value == wanted\n\n\n"
       "def expect(value, wanted, what='value'):\n    assert Judge().same(value, wanted), f'{what}: got {value!r}, expected {wanted!r}'\n")


def _cell(source, **nbgrader):
    meta = {"grade": False, "solution": False, "locked": False, "schema_version": 3, **nbgrader}
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": meta})


def source_notebook():
    """Task 1 (2 points): f1(x) = x + 1, checked with the support module's expect(); task 2 (3 points): f2(x) = 2x, with math.isclose."""
    cells = [
        _cell("import math\nfrom tinylab import expect", locked=True, grade_id="setup"),
        _cell("def f1(x):\n    ### BEGIN SOLUTION\n    return x + 1\n    ### END SOLUTION", solution=True, grade_id="task1_f1"),
        _cell(f"expect(f1(1), 2)\n### BEGIN HIDDEN TESTS\n{HIDDEN_LINE}\n### END HIDDEN TESTS", grade=True, locked=True, points=2.0, grade_id="task1_test"),
        _cell("def f2(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION", solution=True, grade_id="task2_f2"),
        _cell("assert math.isclose(f2(1.5), 3.0)\n### BEGIN HIDDEN TESTS\nassert math.isclose(f2(-7.25), -14.5), 'hidden f2'\n### END HIDDEN TESTS",
              grade=True, locked=True, points=3.0, grade_id="task2_test"),
    ]
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})


def solution(nb, grade_id, code):
    nb = nbformat.reads(nbformat.writes(nb), as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            cell.source = code
    return nb


def added(nb, code, at=1):
    """A copy of ``nb`` with a plain cell of the student's inserted at position ``at``."""
    nb = nbformat.reads(nbformat.writes(nb), as_version=4)
    nb.cells.insert(at, nbformat.v4.new_code_cell(code))
    return nb


def wrong(nb):
    return solution(solution(nb, "task1_f1", "def f1(x):\n    return 0"), "task2_f2", "def f2(x):\n    return 0.0")


def digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(str(path).encode() + path.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Release the tiny assignment, submit the corpus, grade it with JOBS=2; returns what the checks need."""
    root = tmp_path_factory.mktemp("hostile") / "course"
    root.mkdir()
    for name in ("nbgrader_config.py", "roster.csv"):
        (root / name).write_text((ROOT / "assignments" / name).read_text())
    (root / "source" / A).mkdir(parents=True)
    nbformat.write(source_notebook(), root / "source" / A / PART)
    (root / "source" / A / "tinylab.py").write_text(LAB)
    course = Course(root)
    grading.release(course)
    good = source_notebook()
    base = nbformat.read(root / "release" / A / PART, as_version=4)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    connections = []

    def accept():
        while not stop.is_set():
            try:
                connections.append(listener.accept())
            except OSError:
                pass

    stop = threading.Event()
    threading.Thread(target=accept, daemon=True).start()
    sneaky = wrong(good)
    corpus = {
        "honest": good,
        "victim": good,
        "transformer": added(base, "ip = get_ipython()\nip.input_transformers_cleanup.append(lambda lines: ['pass\\n'])\n"
                                   "ip.input_transformer_manager.cleanup_transforms.append(lambda lines: ['pass\\n'])"),
        "custom_exc": added(base, "get_ipython().set_custom_exc((BaseException,), lambda *args, **kwargs: None)\n"
                                  "import sys\nsys.excepthook = lambda *args: None"),
        "rebinds_helper": added(sneaky, "expect = lambda *args, **kwargs: None", at=2),
        "patches_library": added(sneaky, "import math, builtins\nmath.isclose = lambda *a, **k: True\nbuiltins.AssertionError = type('Quiet', (Exception,), {})"),
        "patches_support_class": added(sneaky, "import tinylab\ntinylab.Judge.same = lambda self, value, wanted: True"),
        "patches_under_test": solution(sneaky, "task2_f2", "def f2(x):\n    import math\n    math.isclose = lambda *a, **k: True\n    return 0.0"),
        "forges_outputs": _forged(wrong(good)),
        "snoops": added(base, f"import glob, os\nfor path in glob.glob({str(root)!r} + '/**/*', recursive=True)[:50]:\n    print('FOUND', path)\n"
                              f"print(os.path.exists({str(root / 'source')!r}), os.path.exists({str(root / 'gradebook.db')!r}))"),
        "sabotages": added(base, "import glob, os\n"
                                 f"for path in glob.glob({str(root)!r} + '/**/*', recursive=True):\n"
                                 "    try:\n        open(path, 'w').write('pwned')\n    except OSError as e:\n        print('refused', e.errno)\n"
                                 f"open({str(root / 'gradebook.db')!r}, 'w')"),
        "reads_hidden_tests": solution(good, "task1_f1", "def f1(x):\n    import gc, warnings\n    warnings.simplefilter('ignore')\n    for o in gc.get_objects():\n"
                                                         "        if isinstance(o, dict) and 'cells' in o:\n            print([c['source'] for c in o['cells']])\n"
                                                         "    return x + 1"),
        "forges_channel": added(base, "import os, json\nfor fd in range(3, 64):\n    try:\n"
                                      "        os.write(fd, (json.dumps({'event': 'end', 'cell': 2}) + '\\n').encode())\n    except OSError:\n        pass"),
        "memory_bomb": solution(good, "task2_f2", "blob = bytearray(8 * 2**30)\ndef f2(x):\n    return 2 * x"),
        "process_bomb": added(good, "import subprocess\nfor _ in range(20):\n    subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
                                    "import threading\nthreads = []\ntry:\n    for _ in range(5000):\n"
                                    "        t = threading.Thread(target=__import__('time').sleep, args=(30,), daemon=True); t.start(); threads.append(t)\n"
                                    "except RuntimeError as e:\n    print('stopped at', len(threads))\n    raise"),
        "ignores_interrupts": solution(good, "task2_f2", "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                                       "while True:\n    pass"),
        "floods_output": added(good, "for _ in range(200):\n    print('x' * 2**20)\nimport os\nos.write(1, b'y' * 2**24)"),
        "fills_disk": added(good, "open('/tmp/big', 'wb').write(b'0' * 2**30)"),
        "marker_text": solution(good, "task1_f1", "def f1(x):\n    # ### BEGIN HIDDEN TESTS (just a comment of mine)\n    return x + 1"),
        "calls_home": added(good, f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), 2)\n    print('connected')\nexcept OSError as e:\n    print('no network:', e)"),
        "forged_metadata": _forged_metadata(wrong(good)),
    }
    for student, nb in corpus.items():
        submit(root, student, A, {PART: nb})
    protected = {name: digest(root / name) for name in ("source", "release")}
    victim_file = (root / "submitted" / "victim" / A / PART).read_bytes()
    limits = sandbox.Limits(memory_bytes=5 * 2**30, disk_bytes=64 * 2**20)
    start = time.monotonic()
    report = grading.autograde(course, cell_timeout=CELL_S, jobs=2, limits=limits)
    seconds = time.monotonic() - start
    stop.set()
    grading.feedback(course)
    return {"course": course, "root": root, "report": report, "status": read_status(course), "protected": protected,
            "victim_file": victim_file, "connections": connections, "seconds": seconds, "limits": limits}


def _forged(nb):
    """Test cells carrying outputs of a passing run, and no error."""
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade"):
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="all tests passed\n")]
            cell.execution_count = 1
    return nb


def _forged_metadata(nb):
    """Test cells turned into ordinary cells, a grade id without metadata fields, a duplicated test id."""
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("grade_id") == "task1_test":
            cell.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "task1_f1"}
            cell.source = "pass"
        elif meta.get("grade_id") == "task2_test":
            cell.metadata["nbgrader"] = {"grade": True}
            cell.source = "pass"
    return nb


def score(hostile, student):
    row = hostile["status"][(student, A)]
    return row["status"], float(row["score"]), row["reason"]


@pytest.mark.parametrize("student", ["transformer", "custom_exc", "rebinds_helper", "patches_library", "patches_support_class", "patches_under_test",
                                     "forges_outputs", "snoops", "sabotages", "forged_metadata"])
def test_cheats_earn_nothing(hostile, student):
    status, points, reason = score(hostile, student)
    assert points == 0.0, f"{student} scored {points}: {reason}"


def test_honest_students_get_full_marks_next_to_the_cheats(hostile):
    for student in ("honest", "victim", "reads_hidden_tests", "marker_text", "calls_home", "floods_output", "fills_disk"):
        assert score(hostile, student)[:2] == ("graded", 5.0), (student, score(hostile, student))


def test_what_a_cheat_replaced_is_named_for_the_ta(hostile):
    assert "expect" in score(hostile, "rebinds_helper")[2]
    assert "math.isclose" in score(hostile, "patches_library")[2]
    assert "tinylab.Judge.same" in score(hostile, "patches_support_class")[2]
    assert "restored the deleted cell task1_test" in score(hostile, "forged_metadata")[2]
    tampered = score(hostile, "forges_channel")
    assert tampered[0] == "failed" and "grader's channel" in tampered[2] and tampered[1] == 0.0


def test_a_submission_cannot_read_or_change_the_course_or_a_classmate(hostile):
    root = hostile["root"]
    for name, before in hostile["protected"].items():
        assert digest(root / name) == before, f"{name}/ changed during grading"
    assert (root / "submitted" / "victim" / A / PART).read_bytes() == hostile["victim_file"]
    snooped = nbformat.read(root / "autograded" / "snoops" / A / PART, as_version=4)
    printed = "".join(o.get("text", "") for c in snooped.cells for o in c.get("outputs", []))
    assert "FOUND" not in printed and "False False" in printed, printed[:500]
    assert not hostile["connections"], "a sandboxed submission reached a listener on the grader's loopback"


def test_limits_give_zero_for_what_did_not_run_and_name_the_limit(hostile):
    status, points, reason = score(hostile, "memory_bomb")
    assert points == 2.0 and "memory limit (5 GiB" in reason, reason
    status, points, reason = score(hostile, "ignores_interrupts")
    assert points == 2.0 and f"per-cell time limit ({CELL_S} s)" in reason, reason
    status, points, reason = score(hostile, "process_bomb")
    assert "process limit" in reason, reason
    assert "output limit" in score(hostile, "floods_output")[2]
    assert "disk limit" in score(hostile, "fills_disk")[2]
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] and p.info["cmdline"][:2] == ["sleep", "600"]]
    assert not leftovers, f"{len(leftovers)} processes a submission started outlived grading"


def test_graded_notebooks_and_feedback_stay_small_and_never_show_hidden_tests(hostile):
    root = hostile["root"]
    for student in ("floods_output", "honest"):
        assert (root / "autograded" / student / A / PART).stat().st_size < 3 * hostile["limits"].output_bytes
    pages = list((root / "feedback").rglob("*.html"))
    assert {p.parts[-3] for p in pages} >= {"honest", "marker_text", "reads_hidden_tests", "floods_output"}, "every graded student gets feedback"
    for page in pages:
        text = page.read_text()
        assert HIDDEN_LINE not in text and "f2(-7.25)" not in text, f"hidden test text in {page}"
        assert page.stat().st_size < 4 * 2**20


def test_the_status_file_and_the_gradebook_agree(hostile):
    report = grading.course_grades(hostile["course"])
    honest = next(r for r in report.students if r.student_id == "honest")
    assert honest.percents[A] == 100.0


def test_a_gradebook_changed_behind_the_graders_back_is_an_error(hostile, tmp_path):
    import shutil

    copy = tmp_path / "course"
    shutil.copytree(hostile["root"], copy)
    course = Course(copy)
    with course.gradebook() as gb:
        for grade in gb.find_submission(A, "transformer").notebooks[0].grades:
            grade.manual_score = grade.max_score
        gb.db.commit()
    with pytest.raises(grading.GradingError, match="transformer/hw2_profiling: gradebook 5, autograde status 0"):
        grading.course_grades(course)


def test_rerun_keeps_what_is_graded_and_regrade_gives_identical_grades(hostile, capsys):
    course = hostile["course"]
    chosen = ["honest", "transformer", "memory_bomb", "rebinds_helper"]
    before = {s: score(hostile, s)[:2] for s in chosen}
    grading.autograde(course, student_ids=chosen, cell_timeout=CELL_S, jobs=2, limits=hostile["limits"])
    assert "4 submission(s) already graded" in capsys.readouterr().out
    grading.autograde(course, student_ids=chosen, cell_timeout=CELL_S, jobs=1, regrade=True, limits=hostile["limits"])
    after = read_status(course)
    assert {s: (after[(s, A)]["status"], float(after[(s, A)]["score"])) for s in chosen} == before


def test_a_killed_grader_resumes_where_it_stopped(hostile, tmp_path):
    import shutil

    copy = tmp_path / "course"
    shutil.copytree(hostile["root"], copy, ignore=shutil.ignore_patterns("autograded", "feedback", "autograde_status.csv"))
    command = [sys.executable, "-m", "helpers.course.grading", "--course", str(copy), "autograde", "--jobs", "1",
               "-s", "honest", "-s", "victim", "-s", "marker_text", "-s", "calls_home"]
    grader = subprocess.Popen(command, cwd=ROOT, env=environment(), stdout=subprocess.PIPE, text=True)
    for line in grader.stdout:
        if line.startswith("[1/4]"):
            grader.kill()
            break
    grader.wait()
    first = read_status(Course(copy))
    assert len(first) == 1, "the status row of a finished submission is saved at once"
    rerun = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0 and "1 submission(s) already graded" in rerun.stdout and "[3/3]" in rerun.stdout, rerun.stdout
    final = read_status(Course(copy))
    assert {k[0]: float(v["score"]) for k, v in final.items()} == {"honest": 5.0, "victim": 5.0, "marker_text": 5.0, "calls_home": 5.0}


def test_without_bubblewrap_grading_still_works_and_says_so_loudly(hostile, tmp_path, monkeypatch, capsys):
    import shutil

    copy = tmp_path / "course"
    shutil.copytree(hostile["root"], copy, ignore=shutil.ignore_patterns("autograded", "feedback", "autograde_status.csv"))
    monkeypatch.setattr(sandbox, "bubblewrap", lambda: None)
    report = grading.autograde(Course(copy), student_ids=["honest", "rebinds_helper"], cell_timeout=CELL_S, jobs=2)
    assert "WARNING: bubblewrap (bwrap) is not available" in capsys.readouterr().out
    assert {(o.student_id, o.score) for o in report.rows} == {("honest", 5.0), ("rebinds_helper", 0.0)}


def test_a_cell_has_its_own_processes_and_no_network_exactly_where_bubblewrap_works():
    """What the sandbox promises, seen from inside a cell: a fresh process namespace and loopback only."""
    probe = ("import os, socket\nnames = [name for _, name in socket.if_nameindex()]\n"
             "assert os.getpid() < 50 and names == ['lo'], (os.getpid(), names)")
    run = sandbox.run_notebook({}, {"cells": [{"index": 0, "role": "test", "source": probe}]}, sandbox.Limits(cell_s=60), time.monotonic() + 60)
    error = run.cells[0].outcome.get("error")
    if sandbox.bubblewrap():
        assert error is None, (error, run.log)
    else:  # the fallback: the cell sees the machine's processes and network, and the TA is told
        assert error is not None and "WITHOUT a sandbox" in sandbox.isolation()


def test_servers_left_listening_after_the_last_cell_are_named_and_stopped_ones_are_not():
    """The sandbox's network is the notebook's own, so what still listens after the last cell is what it left running."""
    left = ("import socket, threading\nkept = []\nfor host in ('127.0.0.1', '0.0.0.0'):\n    s = socket.socket()\n"
            "    s.bind((host, 0))\n    s.listen()\n    kept.append(s)\nports = [s.getsockname()[1] for s in kept]")
    stopped = "closed = socket.socket()\nclosed.bind(('127.0.0.1', 0))\nclosed.listen()\nclosed.close()"
    show = "print(ports)"
    cells = [{"index": 0, "role": "student", "source": left}, {"index": 1, "role": "student", "source": stopped},
             {"index": 2, "role": "student", "source": show}]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(cell_s=60), time.monotonic() + 120)
    assert run.finished, run.log[-2000:]
    if not sandbox.bubblewrap():  # the machine's network is shared: nothing can be said of the notebook's own servers
        assert run.listening == []
        return
    ports = json.loads(run.cells[2].outcome["stdout"].strip())
    assert run.listening == sorted([f"127.0.0.1:{ports[0]}", f"0.0.0.0:{ports[1]}"]), run.listening


def test_a_cell_past_the_cpu_time_limit_fails_and_names_it():
    """The limit counts the whole process: the runner's own start (torch and Dynamo imported, 4-7 s of CPU on a slow
    2-core machine) comes first, so the limit leaves room for it, and the cell timer is far enough to tell them apart."""
    cells = [{"index": 0, "role": "student", "source": "while True:\n    pass"}, {"index": 1, "role": "test", "source": "print('after')"}]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(cpu_s=20, cell_s=120), time.monotonic() + 180)
    assert 0 in run.cells, f"the loop's cell never started (stopped: {run.stopped}); runner log: {run.log[-2000:]}"
    assert run.cells[0].outcome["error"]["limit"] == "CPU-time limit (20 s)", run.cells[0].outcome
    assert run.cells[0].outcome["seconds"] < 100, "the cell timer, not the CPU limit, stopped the loop"


def test_a_cell_reads_the_kits_model_cache_read_only_and_loads_the_language_model_from_it():
    """SmolLM2's weights (540 MB in fp32) are over the sandbox's disk limit: the cache the grader wrote is shown
    read-only, and a notebook that loads the model reads it from there instead of writing its own."""
    from helpers.serving.smollm import ensure_cache

    cache = ensure_cache()
    probe = ("import os\nfrom pathlib import Path\nfrom helpers.serving.llama import load_llm\n"
             "shared = Path(os.environ['EDL_MODEL_CACHE'])\n"
             f"assert (shared / {cache.name!r}).is_file()\n"
             "try:\n    (shared / 'mine').write_text('x')\n    raise AssertionError('the shared cache is writable')\n"
             "except OSError:\n    pass\n"
             "print(load_llm().config.layers)")
    run = sandbox.run_notebook({}, {"cells": [{"index": 0, "role": "test", "source": probe}]},
                               sandbox.Limits(cell_s=240), time.monotonic() + 300)
    outcome = run.cells[0].outcome
    assert outcome.get("error") is None, (outcome, run.log[-2000:])
    assert outcome["stdout"].split() == ["30"], outcome      # SmolLM2's 30 layers, loaded from the shared cache


def test_scratch_mounts_come_before_the_binds_so_a_checkout_under_tmp_stays_visible(tmp_path):
    """A kit cloned under /tmp (as CI may do) must not vanish under the sandbox's own /tmp."""
    command = sandbox.bwrap_command(tmp_path, sandbox.Limits(), 1, {}, uid=sandbox.UID_BASE)
    tmpfs = max(i for i, a in enumerate(command) if a == "--tmpfs")
    binds = [i for i, a in enumerate(command) if a == "--ro-bind"]
    assert binds and tmpfs < min(binds), "a tmpfs mounted after the binds hides whatever they put under it"


def test_a_warning_in_a_test_cell_is_a_note_and_other_stderr_still_fails():
    """torch.tensor() of a tensor warns: in Jupyter that passes, so in the grader it passes too, with the warning shown."""
    from helpers.course import autograde

    hidden = "import warnings\nwarnings.warn('from the hidden part')\nassert True\n"
    cells = [{"index": 0, "role": "test", "source": "import torch\nx = torch.tensor(torch.ones(2))\nassert x.sum() == 2"},
             {"index": 1, "role": "test", "source": "import sys\nprint('a log line', file=sys.stderr)"},
             {"index": 2, "role": "test", "source": "import warnings\nfor i in range(9):\n    warnings.warn(f'number {i}', RuntimeWarning)",
              "hidden": len(hidden.encode())},
             {"index": 3, "role": "test", "source": "raise AssertionError('a real failure')"}]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(cell_s=60), time.monotonic() + 120, hidden={2: hidden})
    warned, logged, many, failed = (run.cells[i].outcome for i in range(4))
    assert "error" not in warned and not warned["stderr"], warned
    assert warned["warnings"][0]["category"] == "UserWarning" and "copy construct" in warned["warnings"][0]["message"]
    assert logged["stderr"] == "a log line\n" and "warnings" not in logged
    assert many["warnings_raised"] == 9 and len(many["warnings"]) == 5 and run.cells[2].hidden["passed"], (many, run.cells[2].hidden)

    verdicts = [autograde._verdict(outcome, run.cells[i].hidden, i == 2) for i, outcome in enumerate((warned, logged, many, failed))]
    assert [v["output_type"] for v in verdicts] == ["stream", "error", "stream", "error"]
    assert "wrote to stderr" in verdicts[1]["evalue"] and "AssertionError" in verdicts[3]["evalue"]
    notes = autograde._warning_notes(warned)[0]["text"]
    assert notes.startswith(autograde.GRADER_MARK) and "notes, not failures" in notes and "UserWarning" in notes
    assert "4 more warning(s)" in autograde._warning_notes(many)[0]["text"]
    assert autograde._warning_notes(logged) == []


def test_a_failed_hidden_test_shows_the_instructors_message_and_never_the_students():
    """Which property failed and by how much reaches the student; text the submission wrote does not."""
    from helpers.course import autograde

    def cell(index, hidden):
        return {"index": index, "role": "test", "source": "assert True", "hidden": len(hidden.encode())}

    hidden = {1: "check(3)\n", 2: "assert answer(2) == 4, f'answer(2) is {answer(2)}, off by {answer(2) - 4}'\n",
              3: "assert answer(2) == 4\n", 4: "answer(-1)\n"}
    cells = [{"index": 0, "role": "instructor", "source": "def check(x):\n    assert x < 0, f'check: {x} should be negative'"},
             {"index": 5, "role": "student", "source": "def answer(x):\n    assert x > 0, 'a message the student wrote'\n    return x + 1"},
             *(cell(i, hidden[i]) for i in (1, 2, 3, 4))]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(cell_s=60), time.monotonic() + 120, hidden=hidden)
    verdicts = {i: autograde._verdict(run.cells[i].outcome, run.cells[i].hidden, True)["evalue"] for i in (1, 2, 3, 4)}
    assert verdicts[1].endswith("AssertionError: check: 3 should be negative"), verdicts[1]  # a setup cell's function
    assert verdicts[2].endswith("AssertionError: answer(2) is 3, off by -1"), verdicts[2]  # the hidden part itself
    assert verdicts[3].endswith("(its code is not shown): AssertionError"), verdicts[3]  # no message: nothing added
    assert verdicts[4].endswith("(its code is not shown): AssertionError"), verdicts[4]  # raised in the student's code
    assert all("answer(2) == 4" not in v and "student wrote" not in v for v in verdicts.values()), verdicts


def test_the_hidden_part_alone_gets_a_seed_per_student_and_cell_that_a_regrade_repeats():
    """GRADING_SEED: an HMAC of (assignment, notebook, cell, student) keyed by the hidden tests' digest, never the clock;
    GRADING_STUDENT beside it, the roster id graded."""
    from helpers.course import autograde

    trusted = autograde.TrustedAssignment("hw", [], {}, 1.0, "f", secret=b"digest of the hidden tests")
    seed = autograde.grading_seed(trusted, "part1", "task1_test", "alice")
    assert seed == autograde.grading_seed(trusted, "part1", "task1_test", "alice") and 0 <= seed < 2**62  # a regrade: the same
    others = {autograde.grading_seed(trusted, "part1", "task1_test", "bob"), autograde.grading_seed(trusted, "part1", "task2_test", "alice"),
              autograde.grading_seed(dataclasses.replace(trusted, secret=b"other hidden tests"), "part1", "task1_test", "alice")}
    assert seed not in others and len(others) == 3
    hidden_right, hidden_wrong = (autograde.seeded(f"assert GRADING_SEED == {value} and GRADING_STUDENT == 'alice'", seed, "alice")
                                  for value in (seed, seed + 1))
    assert hidden_right.count("\n") == 1, "the seed and the student id take one line: hidden tests' line numbers stay"
    visible = "assert 'GRADING_SEED' not in globals() and 'GRADING_STUDENT' not in globals()"
    cells = [{"index": 0, "role": "test", "source": visible, "hidden": len(hidden_right.encode())},
             {"index": 1, "role": "test", "source": visible, "hidden": len(hidden_wrong.encode())}]
    run = sandbox.run_notebook({}, {"cells": cells}, sandbox.Limits(cell_s=60), time.monotonic() + 120, hidden={0: hidden_right, 1: hidden_wrong})
    assert "error" not in run.cells[0].outcome and "error" not in run.cells[1].outcome  # the visible parts never see it
    assert run.cells[0].hidden["passed"] and not run.cells[1].hidden["passed"], (run.cells[0].hidden, run.cells[1].hidden)


def test_a_test_that_reads_the_clock_breaks_the_authoring_convention(tmp_path):
    from helpers.course import assignments

    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"nbgrader": {"grade": False, "solution": True, "locked": False, "grade_id": "task1_code", "schema_version": 3}}),
                nbformat.v4.new_code_cell("import time\nrng = time.time()", metadata={"nbgrader": {
                    "grade": True, "solution": False, "locked": True, "points": 1, "grade_id": "task1_test", "schema_version": 3}})]
    nbformat.write(nb, tmp_path / "part1_clock.ipynb")
    assert any("reads the clock" in p and "GRADING_SEED" in p for p in assignments.convention_problems(tmp_path))
