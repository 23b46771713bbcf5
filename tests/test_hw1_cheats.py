"""HW1 graded against submissions that take a short cut: each earns nothing on the task it targets, the reference full marks.

One copy of the course holding HW1 alone is released and graded once (sandboxed, as `make autograde` does).
Each cheat hands in the notebook it targets only (the others are reported missing): the reference notebook with
one solution cell replaced, so it scores that notebook's points minus exactly the targeted task's.

- ``c10d_bypass``: part 1's ring all-reduce as one call of ``torch.distributed.distributed_c10d.all_reduce``,
  a route to the collective that no ``dist.<name>`` patch sees;
- ``thread_escape``: part 1's ring all-reduce as ``dist.all_reduce`` called on a thread of its own, where a
  dispatch mode (which watches only the thread that entered it) does not look;
- ``root_predicts``: part 3's distributed prediction computed on the root for every input, with one dummy
  scatter and gather so that the other ranks take part in the messages but do none of the work.

The reference (full marks) and the released version (nothing) are graded by tests/test_assignments.py.
"""
from __future__ import annotations

import shutil
import time

import nbformat
import pytest

from helpers.course import assignments, grading
from helpers.course.grading import Course, read_status

from .grading_support import ROOT, copy_course, submit, with_solution

pytestmark = [pytest.mark.grading, pytest.mark.timeout(1800)]  # the fixture grades three HW1 notebooks in the sandbox

HW1 = "hw1_distributed"
SOURCE = ROOT / "assignments" / "source" / HW1

C10D_BYPASS = '''def ring_all_reduce(tensor):
    """Looks like send/recv only to a check that patches dist.all_reduce."""
    import torch.distributed.distributed_c10d as c10d
    c10d.all_reduce(tensor)
    return tensor'''

THREAD_ESCAPE = '''def ring_all_reduce(tensor):
    """The library's all-reduce, run on a thread of its own."""
    import threading
    worker = threading.Thread(target=dist.all_reduce, args=(tensor,))
    worker.start()
    worker.join()
    return tensor'''

ROOT_PREDICTS = '''def distributed_predict(model, inputs, root=0):
    """Every prediction on the root; the other ranks only join one scatter and one gather of dummies."""
    world, rank = dist.get_world_size(), dist.get_rank()
    dummy = torch.zeros(1, 6)
    dist.scatter(dummy, [torch.zeros(1, 6) for _ in range(world)] if rank == root else None, src=root)
    dist.gather(torch.zeros(1), [torch.zeros(1) for _ in range(world)] if rank == root else None, dst=root)
    if rank != root:
        return None
    with torch.no_grad():
        return model(inputs).argmax(dim=1)'''

CHEATS = {  # student: (notebook, solution cell's grade id, source, the points of the task it targets)
    "c10d_bypass": ("part1_ring_allreduce.ipynb", "task1_ring_all_reduce", C10D_BYPASS, 5.0),
    "thread_escape": ("part1_ring_allreduce.ipynb", "task1_ring_all_reduce", THREAD_ESCAPE, 5.0),
    "root_predicts": ("part3_distributed_eval.ipynb", "task1_distributed_predict", ROOT_PREDICTS, 3.0),
}


def reference() -> dict[str, nbformat.NotebookNode]:
    return {p.name: assignments.read(p) for p in assignments.notebooks(SOURCE)}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = copy_course(tmp_path_factory.mktemp("hw1") / "course")
    for folder in (root / "source").iterdir():
        if folder.name != HW1:
            shutil.rmtree(folder)
    course = Course(root)
    grading.release(course)
    honest = reference()
    for student, (notebook, grade_id, source, _) in CHEATS.items():
        submit(root, student, HW1, {notebook: with_solution(honest[notebook], grade_id, source)})
    start = time.monotonic()
    report = grading.autograde(course, jobs=2)
    seconds = time.monotonic() - start
    print(report)  # with -s: the seconds each submission took to grade
    return {"status": read_status(course), "report": report, "seconds": seconds}


def test_the_cheats_target_real_solution_cells():
    honest = reference()
    for notebook, grade_id, _, points in CHEATS.values():
        ids = [assignments.grade_id(c) for c in honest[notebook].cells]
        assert grade_id in ids, f"{notebook} has no cell {grade_id}"
        assert 0 < points < assignments.max_points(honest[notebook])


@pytest.mark.parametrize("student", sorted(CHEATS))
def test_a_cheat_scores_nothing_on_the_task_it_targets(graded, student):
    notebook, _, _, points = CHEATS[student]
    row = graded["status"][(student, HW1)]
    assert row["status"] == "graded", row["reason"]
    assert float(row["max_score"]) == 22.0 and "missing" in row["reason"], row
    assert float(row["score"]) == assignments.max_points(reference()[notebook]) - points, row
