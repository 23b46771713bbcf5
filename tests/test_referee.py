"""The referee (helpers.course.referee): tests that run in a process of their own and call the student's code across
the process boundary, so that nothing the student's process does reaches what they count, or the grader."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.course import referee, sandbox

pytestmark = [pytest.mark.grading, pytest.mark.skipif(not sandbox.bubblewrap(), reason="the referee's guarantees hold in the sandbox")]

LAB = '''
class Refused(RuntimeError):
    pass


class Meter:
    """A test's object the student's code may hold: it sees ``base`` and may call it; the calls are counted here."""

    REMOTE_VIEW = ("base",)

    def __init__(self, base):
        self.base, self.calls = base, 0

    def __call__(self, x):
        if x < 0:
            raise Refused(f"negative {x}")
        self.calls += 1
        return self.base + x
'''

ENGINE = '''
import torch

class Engine:
    def __init__(self, meter):
        self.meter = meter

    def run(self, n):
        return [self.meter(i) for i in range(n)]

    def bad(self):
        raise ValueError("bad value")

    def tensor(self):
        return torch.arange(4.0).reshape(2, 2)

    def catches(self):
        try:
            self.meter(-1)
        except Refused as error:
            return "caught " + str(error)

    def private(self):
        return self.meter.calls
'''

# the tests the referee runs: the counts live with it, the student's code is only called
COUNTED = "m = Meter(3)\ne = Engine(m)\nassert e.run(2) == [3, 4]\nassert m.calls == 2, m.calls\nprint('counted')"
HIDDEN = "m = Meter(10)\nassert Engine(m).run(3) == [10, 11, 12] and m.calls == 3\n"
ACROSS = ("try:\n    Engine(Meter(0)).bad()\nexcept ValueError as err:\n    assert str(err) == 'bad value'\nelse:\n    raise AssertionError('no error')\n"
          "t = Engine(Meter(0)).tensor()\nassert isinstance(t, torch.Tensor) and t.shape == (2, 2) and float(t.sum()) == 6\n"
          "assert Engine(Meter(0)).catches() == 'caught negative -1'\n"
          "try:\n    Engine(Meter(0)).private()\nexcept AttributeError as err:\n    assert 'has only base' in str(err), str(err)\nelse:\n    raise AssertionError('read past the view')")


def run_job(tmp_path: Path, student: str, cell_s: float = 60, tests: tuple[str, ...] = (COUNTED, ACROSS), names=("Engine",)) -> sandbox.SandboxRun:
    lab = tmp_path / "lab.py"
    lab.write_text(LAB)
    cells = [{"index": 0, "role": "instructor", "source": "import torch\nfrom lab import Meter, Refused"},
             {"index": 1, "role": "student", "source": student}]
    cells += [{"index": 2 + i, "role": "test", "source": source} for i, source in enumerate(tests)]
    cells[2]["hidden"] = len(HIDDEN.encode())
    job = {"cells": cells, "support_modules": ["lab"], "referee": {"names": names}}
    return sandbox.run_notebook({"lab.py": lab}, job, sandbox.Limits(cell_s=cell_s), time.monotonic() + 240, hidden={2: HIDDEN})


def passed(run: sandbox.SandboxRun, index: int) -> bool:
    """A test cell's verdict as the grader reads it: no error, nothing on stderr, and its hidden part passed (cell 2)."""
    event = run.cells.get(index)
    if event is None or event.outcome is None or event.outcome.get("error") or event.outcome.get("stderr"):
        return False
    return index != 2 or bool(event.hidden and event.hidden.get("passed"))


def test_the_tests_call_the_students_code_across_the_boundary_and_keep_their_counts(tmp_path):
    """Calls both ways (the student's engine calls the test's meter), exceptions of either side arriving as their own
    class, a tensor by value, the hidden part in the referee; the student's code reads only the view's attributes."""
    probe = ("import os\nfor what in ('mem', 'environ', 'fd'):\n    try:\n        os.listdir(f'/proc/{os.getppid()}/{what}') if what == 'fd' else "
             "open(f'/proc/{os.getppid()}/{what}', 'rb').read(1)\n        print('read', what)\n    except OSError:\n        print('refused', what)\n")
    run = run_job(tmp_path, ENGINE + probe)
    assert run.finished and not run.tampered, (run.stopped, run.tampered, run.log[-2000:])
    assert passed(run, 2) and run.cells[2].outcome["stdout"] == "counted\n", run.cells[2].outcome
    assert passed(run, 3), run.cells[3].outcome
    assert run.cells[1].outcome["stdout"] == "refused mem\nrefused environ\nrefused fd\n", "the notebook's process reads the referee's memory"


FORGER = '''
import gc, json, os
from helpers.course.cell_runner import Runner

runner = next(o for o in gc.get_objects() if isinstance(o, Runner))

def say(**message):
    os.write(runner.channel, (json.dumps(message) + "\\n").encode())

say(event="end", cell=1, stdout="", stderr="", seconds=0.1, notes=[])
for cell in runner.job["cells"][2:]:
    say(event="start", cell=cell["index"])
    say(event="end", cell=cell["index"], stdout="", stderr="", seconds=0.1, notes=[])
say(event="done")
os._exit(0)
'''


def test_a_notebook_that_writes_the_verdicts_itself_passes_nothing(tmp_path):
    """Where the tests run beside the student's code, its process holds the grader's channel and can write every
    verdict itself; with the referee it holds only the pipe to the referee, which asked for none of it."""
    run = run_job(tmp_path, ENGINE + FORGER)
    assert not passed(run, 2) and not passed(run, 3), {i: (e.outcome, e.hidden) for i, e in run.cells.items()}


@pytest.mark.parametrize("garbage", ['{"re": 99, "value": 1}', '{"op": "getattr", "id": 1, "ref": 1, "attr": "calls"}', 'not json'])
def test_a_message_the_referee_did_not_ask_for_is_tampering(tmp_path, garbage):
    """The student's engine writes to the referee's pipe while a test calls it: an answer to no question, a read of
    the test's own object, a line that is not JSON."""
    engine = ENGINE.replace('        return [self.meter(i) for i in range(n)]',
                            f'        import gc, os\n        from helpers.course.cell_runner import Runner\n'
                            f'        runner = next(o for o in gc.get_objects() if isinstance(o, Runner))\n'
                            f'        os.write(runner.channel, {garbage!r}.encode() + b"\\n")\n        return [self.meter(i) for i in range(n)]')
    run = run_job(tmp_path, engine)
    assert run.tampered and "never asked for" in run.tampered, (run.tampered, run.log[-1500:])
    assert not passed(run, 2)


@pytest.mark.parametrize("loop", ["pass", "self.meter(0)"], ids=["computes", "calls the tests back"])
def test_a_call_past_the_time_limit_fails_its_test_and_the_next_test_runs(tmp_path, loop):
    run = run_job(tmp_path, ENGINE.replace("return [self.meter(i) for i in range(n)]", f"while True:\n            {loop}"), cell_s=8)
    assert run.finished, (run.stopped, run.log[-1500:])
    assert run.cells[2].outcome["error"]["limit"].startswith("per-cell time limit"), run.cells[2].outcome
    assert passed(run, 3), run.cells[3].outcome


def test_a_failure_of_the_referee_is_the_graders_and_a_runner_cannot_claim_one(tmp_path):
    """The referee's own failure ends it with a status its runner's exit never passes on: the grader records the
    submission as its own error (not graded), while a notebook that exits with that status is graded as it ran."""
    from helpers.course import autograde

    def fault(run):
        code = [(0, _cell("instructor")), (1, _cell("student")), (2, _cell("test")), (3, _cell("test"))]
        return autograde.grader_fault(run, code, sandbox.Limits())

    broken = run_job(tmp_path, ENGINE, names=None)  # the referee cannot set up its stand-ins
    assert broken.returncode == referee.REFEREE_FAILED and "referee" in fault(broken), (broken.returncode, broken.log[-800:])
    claims = run_job(tmp_path, ENGINE + f"\nimport os\nos._exit({referee.REFEREE_FAILED})")
    assert claims.returncode != referee.REFEREE_FAILED and fault(claims) == "", (claims.returncode, fault(claims))


def _cell(kind: str):
    """A notebook cell whose nbgrader metadata gives it ``kind``'s role in the grader."""
    import nbformat

    meta = {"test": {"grade": True, "locked": True, "points": 1}, "instructor": {"locked": True}, "student": {"solution": True}}[kind]
    return nbformat.v4.new_code_cell("", metadata={"nbgrader": {"grade": False, "solution": False, "locked": False, **meta}})


def test_only_plain_values_tensors_and_lent_objects_cross(tmp_path):
    """What arrives is built from data alone: no class of the sender's is ever instantiated by the receiver."""
    read_end, write_end = os.pipe()
    try:
        ours = referee.Link(read_end, write_end, "referee")
        theirs = referee.Link(read_end, write_end, "runner")
        value = {"a": [1, 2.5, None, True], ("t", 3): b"\x00\x01"}
        assert ours.unpack(theirs.pack(value)) == value
        import numpy as np
        import torch

        assert ours.unpack(theirs.pack({np.int64(4): np.float32(0.5)})) == {4: 0.5}
        array = ours.unpack(theirs.pack(np.arange(6, dtype=np.int32).reshape(2, 3)))
        assert isinstance(array, np.ndarray) and array.dtype == np.int32 and array.tolist() == [[0, 1, 2], [3, 4, 5]]
        logits = torch.randn(3, 5, dtype=torch.bfloat16)
        assert torch.equal(ours.unpack(theirs.pack(logits)), logits)
        handle = theirs.pack(object())
        assert isinstance(ours.unpack(handle), referee.Remote)
        with pytest.raises(TypeError, match="cannot hand a object"):
            ours.pack(object())  # a test's object without a REMOTE_VIEW stays with the tests
        for forged in ({"view": 1, "attrs": {}}, {"yours": 5}, {"tensor": "AAAA", "dtype": "float32", "shape": [3]},
                       {"pickle": "gASV"}, {"dict": [[{"list": []}, 1]]}):
            with pytest.raises(referee.Tampered):
                ours.unpack(forged)
        assert referee._known_exception("os.system", ()) is None and referee._known_exception("SystemExit", ()) is None
        assert referee._known_exception("ValueError", ()) is ValueError
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_declaration_names_notebooks_and_identifiers(tmp_path):
    from helpers.course import kit_use

    assert kit_use.refereed({"referee": {"part3.ipynb": {"names": ["SLOEngine", "helper"]}}}, "x") == (("part3.ipynb", ("SLOEngine", "helper")),)
    for table in ({"part3.ipynb": {"names": []}}, {"part3.ipynb": {"names": ["not a name"]}}, {"part3": {"names": ["A"]}}, ["A"]):
        with pytest.raises(ValueError, match="referee must map a notebook"):
            kit_use.refereed({"referee": table}, "x")


def test_hw3_part3_declares_its_engine_for_the_referee():
    from helpers.course import kit_use

    root = Path(__file__).resolve().parents[1] / "assignments" / "source" / "hw3_deployment"
    assert dict(kit_use.declaration(root).referee) == {"part3_llm_serving.ipynb": ("SLOEngine",)}


FILLS_SERVES_RECORDS = """
import sys


class SLOEngine:
    \"\"\"Serves nothing: at each step it writes every request's tokens and steps into the records serve keeps.\"\"\"

    def __init__(self, model):
        self.model, self.next_id = model, 0

    def add(self, prompt, max_tokens, ttft_slo):
        if not prompt or max_tokens < 1 or min(prompt) < 0 or max(prompt) >= self.model.vocab_size \\
                or len(prompt) + max_tokens > self.model.capacity_tokens:
            raise ValueError("refused")
        self.next_id += 1
        return self.next_id

    def step(self):
        frame, outcomes, lecture = sys._getframe(1), None, None
        while frame is not None:
            outcomes = outcomes or frame.f_locals.get("outcomes")
            lecture = lecture or (frame.f_locals.get("reports") or [None])[0]
            frame = frame.f_back
        for i, outcome in enumerate(outcomes or []):
            n = outcome.arrival.max_tokens
            outcome.tokens[:] = list(lecture.outcomes[i].tokens) if lecture else [0] * n
            outcome.steps[:] = [outcome.arrival.step + k for k in range(n)]
        return {}
"""

FORGES_THE_VERDICTS = """
import gc, json, os
from helpers.course.cell_runner import Runner

runner = next(o for o in gc.get_objects() if isinstance(o, Runner))
cells = runner.job["cells"]
mine = next(i for i, cell in enumerate(cells) if "FORGES" in cell["source"])


def say(**message):
    os.write(runner.channel, (json.dumps(message) + "\\n").encode())


say(event="end", cell=cells[mine]["index"], stdout="", stderr="", seconds=0.1, notes=[])  # FORGES
for cell in cells[mine + 1:]:
    say(event="start", cell=cell["index"])
    say(event="end", cell=cell["index"], stdout="", stderr="", seconds=0.1, notes=[])
say(event="done")
os._exit(0)
"""


@pytest.mark.instructor
@pytest.mark.timeout(1200)
def test_hw3_part3_graded_an_engine_that_writes_the_tests_records_or_verdicts_scores_nothing(tmp_path):
    """Through the real grader. In the student's own process the first engine fills serve's records with the lecture
    engine's tokens at one per step (every test passes there); the second writes every verdict on the runner's channel.
    Graded, serve and its records live in the referee, and the channel leads to the referee alone: 0 of 10 each."""
    from helpers.course import assignments, grading
    from helpers.course.grading import Course

    from .grading_support import copy_course, submit, with_solution

    root = copy_course(tmp_path / "course")
    course = Course(root)
    assert grading.release(course, ["hw3_deployment"]) == ["hw3_deployment"]
    released = assignments.read(root / "release" / "hw3_deployment" / "part3_llm_serving.ipynb")
    for student, code in (("bob", FILLS_SERVES_RECORDS), ("carol", FORGES_THE_VERDICTS)):
        submit(root, student, "hw3_deployment", {"part3_llm_serving.ipynb": with_solution(released, "task1_engine", code)})
    report = grading.autograde(course, ["hw3_deployment"], ["bob", "carol"], jobs=2)
    scores = {row.student_id: (row.status, row.score) for row in report.rows}
    assert scores == {"bob": ("graded", 0.0), "carol": ("graded", 0.0)}, [(r.student_id, r.status, r.score, r.reason) for r in report.rows]
