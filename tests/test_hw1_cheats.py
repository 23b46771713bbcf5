"""HW1 graded against submissions that take a short cut: each earns nothing on the task it targets, the reference full marks.

One copy of the course holding HW1 alone is released and graded once (sandboxed, as `make autograde` does).
Each cheat hands in the notebook it targets only (the others are reported missing): the reference notebook with
one solution cell replaced, so it scores that notebook's points minus exactly the targeted task's.

- ``c10d_bypass``: part 1's ring all-reduce as one call of ``torch.distributed.distributed_c10d.all_reduce``,
  a route to the collective that no ``dist.<name>`` patch sees;
- ``thread_escape``: part 1's ring all-reduce as ``dist.all_reduce`` called on a thread of its own, where a
  dispatch mode (which watches only the thread that entered it) does not look;
- ``file_ring``: part 1's ring all-reduce summed through files, with the ring's exact traffic sent alongside on a
  tensor of zeros (so the byte count matches), caught because doubling the messages in flight changes nothing;
- ``file_broadcast``: part 1's tree broadcast read from a file the source wrote, with the tree's messages sent
  alongside as zeros;
- ``file_buckets``: part 2's gradient averaging read from every rank's file, with one all-reduce per bucket of
  the right size on zeros;
- ``root_predicts``: part 3's distributed prediction computed on the root for every input, with one dummy
  scatter and gather so that the other ranks take part in the messages but do none of the work.

Beside them, honest work written another way keeps every point:

- ``imports_all_reduce``: part 2's averaging with ``all_reduce`` imported by name before the tests run (a test
  that patched ``dist.all_reduce`` to count the calls saw none and took 2 points).

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

FILES = '''import tempfile, time
from pathlib import Path

_calls = 0


def _exchange_folder():
    """A folder this call shares with the other ranks of this launch (each launch's store has a port of its own)."""
    global _calls
    _calls += 1
    port = dist.distributed_c10d._get_default_store().underlying_store.port
    folder = Path(tempfile.gettempdir()) / f"by-file-{port}-{_calls}"
    folder.mkdir(exist_ok=True)
    return folder


def _write(tensor, path):
    torch.save(tensor.clone(), path.with_suffix(".part"))
    path.with_suffix(".part").rename(path)


def _read(path):
    while not path.exists():
        time.sleep(0.01)
    return torch.load(path)
'''

FILE_RING = FILES + '''

def ring_all_reduce(tensor):
    """The sum read from every rank's file; the ring's messages, byte for byte, carry zeros."""
    world, rank = dist.get_world_size(), dist.get_rank()
    folder = _exchange_folder()
    _write(tensor, folder / f"{rank}.pt")
    zeros = torch.zeros(tensor.numel(), dtype=tensor.dtype)
    bounds = [round(i * zeros.numel() / world) for i in range(world + 1)]
    chunk = lambda i: zeros[bounds[i % world]:bounds[i % world + 1]]
    for step in range(2 * (world - 1)):
        outgoing, incoming = (chunk(rank - step), chunk(rank - step - 1)) if step < world - 1 else (chunk(rank + world - step), chunk(rank + world - 1 - step))
        pending = dist.isend(outgoing.clone(), (rank + 1) % world) if outgoing.numel() else None
        if incoming.numel():
            dist.recv(incoming.clone(), (rank - 1) % world)
        if pending is not None:
            pending.wait()
    tensor.copy_(sum(_read(folder / f"{peer}.pt") for peer in range(world)).view_as(tensor))
    return tensor'''

FILE_BROADCAST = FILES + '''

def tree_broadcast(tensor, src=0):
    """The source's tensor read from its file; the binomial tree's messages carry zeros."""
    world, rank = dist.get_world_size(), dist.get_rank()
    folder = _exchange_folder()
    if rank == src:
        _write(tensor, folder / "source.pt")
    me, distance, zeros = (rank - src) % world, 1, torch.zeros_like(tensor)
    while distance < world:
        if me < distance and me + distance < world:
            dist.send(zeros, (me + distance + src) % world)
        elif distance <= me < 2 * distance:
            dist.recv(zeros.clone(), (me - distance + src) % world)
        distance *= 2
    if rank != src:
        tensor.copy_(_read(folder / "source.pt"))
    return tensor'''

FILE_BUCKETS = FILES + '''

def allreduce_gradients(model, bucket_bytes):
    """Averages read from every rank's file; the greedy buckets' all-reduces carry zeros."""
    world, rank = dist.get_world_size(), dist.get_rank()
    grads = [p.grad for p in reversed(list(model.parameters()))]
    folder = _exchange_folder()
    _write(torch.cat([g.reshape(-1) for g in grads]), folder / f"{rank}.pt")
    average = sum(_read(folder / f"{peer}.pt") for peer in range(world)) / world
    offset = 0
    for g in grads:
        g.copy_(average[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
    sizes, current = [], 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if current and current + nbytes > bucket_bytes:
            sizes.append(current)
            current = 0
        current += nbytes
    sizes.append(current)
    for size in sizes:
        dist.all_reduce(torch.zeros(size // 4))
    return sizes'''

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
    "file_ring": ("part1_ring_allreduce.ipynb", "task1_ring_all_reduce", FILE_RING, 5.0),
    "file_broadcast": ("part1_ring_allreduce.ipynb", "task2_tree_broadcast", FILE_BROADCAST, 3.0),
    "file_buckets": ("part2_data_parallel.ipynb", "task1_allreduce_gradients", FILE_BUCKETS, 4.0),
    "root_predicts": ("part3_distributed_eval.ipynb", "task1_distributed_predict", ROOT_PREDICTS, 3.0),
}


IMPORTS_ALL_REDUCE = '''from torch.distributed import all_reduce


def allreduce_gradients(model, bucket_bytes):
    """Greedy buckets over the reversed parameters, one all_reduce each, averaged in place."""
    buckets = [[]]
    for p in reversed(list(model.parameters())):
        filled = sum(g.numel() * g.element_size() for g in buckets[-1])
        if buckets[-1] and filled + p.grad.numel() * p.grad.element_size() > bucket_bytes:
            buckets.append([])
        buckets[-1].append(p.grad)
    sizes = []
    for grads in buckets:
        flat = torch.cat([g.reshape(-1) for g in grads])
        all_reduce(flat)
        flat /= dist.get_world_size()
        for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(piece.view_as(g))
        sizes.append(flat.numel() * flat.element_size())
    return sizes'''

HONEST = {  # student: (notebook, solution cell's grade id, source): full marks on that notebook
    "imports_all_reduce": ("part2_data_parallel.ipynb", "task1_allreduce_gradients", IMPORTS_ALL_REDUCE),
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
    for student, (notebook, grade_id, source, *_) in {**CHEATS, **HONEST}.items():
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


@pytest.mark.parametrize("student", sorted(HONEST))
def test_honest_work_written_another_way_keeps_every_point(graded, student):
    notebook = HONEST[student][0]
    row = graded["status"][(student, HW1)]
    assert row["status"] == "graded", row["reason"]
    assert float(row["score"]) == assignments.max_points(reference()[notebook]), row
