"""HW2's tests check the property, not a proxy a student controls: each class of shortcut scores 0 on the task it targets.

Each case is a submission of the real assignment whose solution cell holds the shortcut; it runs under papermill
in a copy of the assignment folder (with ``hw2_lab.py`` beside it), trimmed to the cells the task needs, and is
scored the way nbgrader scores it: a graded cell earns its points when it runs without an error. The honest
reference, trimmed the same way, earns every point of the same cells.

- a host read every step made from code that claims to be torch's (a module named ``torch...``): the sync counter
  sees the op at the dispatcher, whoever calls it;
- a host read every step made on a thread of a pool started before the counter opens: the counter counts in
  every thread of the process, not only in the one that opened it;
- a loss scaler that wraps ``torch.amp.GradScaler`` (which the task forbids), held where an attribute scan cannot
  see it: its kernels are caught at the dispatcher;
- thin imports of kit code under the task's names: the kit exports none of them.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest

from helpers.course import assignments

from .grading_support import ROOT, execute_allowing_errors

pytestmark = [pytest.mark.notebooks, pytest.mark.grading]  # papermill runs of the assignment's notebooks

HW2 = ROOT / "assignments" / "source" / "hw2_profiling"

# train_fast as the task asks, except for one host read of the loss every step, made by the `_read` each shortcut defines.
TRAIN_FAST_READING_EVERY_STEP = '''

def train_fast(model, images, labels, epochs=1, batch_size=64, lr=0.05, device=None):
    device = torch.device(device or "cpu")
    model.to(device)
    images, labels = images.to(device), labels.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    steps = (len(images) + batch_size - 1) // batch_size
    means = []
    for _ in range(epochs):
        total = 0.0
        for start in range(0, len(images), batch_size):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(normalize(images[start:start + batch_size])), labels[start:start + batch_size])
            loss.backward()
            optimizer.step()
            total += _read(loss)  # a host read every step
        means.append(total / steps)
    return torch.tensor(means, dtype=torch.float64)
'''

SYNC_FROM_TORCH_NAMED_MODULE = '''import types

_disguised = types.ModuleType("torch._hidden_reader")  # a module whose name looks like torch's
exec("def read(loss):\\n    return loss.item()", _disguised.__dict__)
_read = _disguised.read
''' + TRAIN_FAST_READING_EVERY_STEP

SYNC_ON_A_POOL_THREAD = '''import concurrent.futures

_reader = concurrent.futures.ThreadPoolExecutor(1)  # started before any counter opens
_reader.submit(lambda: None).result()


def _read(loss):
    return _reader.submit(loss.item).result()  # the read happens on the pool's thread
''' + TRAIN_FAST_READING_EVERY_STEP

GRAD_SCALER_WRAPPER = '''_SCALERS = {}  # kept outside the object, where a look at its attributes does not find it


class LossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=100):
        _SCALERS[id(self)] = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_factor=growth_factor,
                                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
        self.unscaled = False

    @property
    def loss_scale(self):
        return float(_SCALERS[id(self)].get_scale())

    def scale(self, loss):
        return _SCALERS[id(self)].scale(loss)

    def unscale_(self, optimizer):
        if self.unscaled:
            raise RuntimeError("unscale_() was already called in this step")
        _SCALERS[id(self)].unscale_(optimizer)
        self.unscaled = True
        found = _SCALERS[id(self)]._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        return not any(float(v) for v in found.values())

    def step(self, optimizer):
        if not self.unscaled:
            self.unscale_(optimizer)
        self.unscaled = False
        found = _SCALERS[id(self)]._per_optimizer_states[id(optimizer)]["found_inf_per_device"]
        skipped = any(float(v) for v in found.values())
        _SCALERS[id(self)].step(optimizer)
        return not skipped

    def update(self):
        _SCALERS[id(self)].update()
'''

FUSED_KERNEL_BY_HAND = '''class LossScaler:
    """Calls GradScaler's fused kernel directly, without the class."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=100):
        self.loss_scale = float(init_scale)
        self.growth_factor, self.backoff_factor, self.growth_interval = growth_factor, backoff_factor, growth_interval
        self.good, self.finite, self.skipped = 0, None, False

    def scale(self, loss):
        return loss * self.loss_scale

    def unscale_(self, optimizer):
        if self.finite is not None:
            raise RuntimeError("unscale_() was already called in this step")
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        found = torch.zeros(1, device=grads[0].device)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.full((1,), 1 / self.loss_scale, device=found.device))
        self.finite = not bool(found.item())
        return self.finite

    def step(self, optimizer):
        if self.finite is None:
            self.unscale_(optimizer)
        self.skipped, self.finite = not self.finite, None
        if not self.skipped:
            optimizer.step()
        return not self.skipped

    def update(self):
        if self.skipped:
            self.loss_scale *= self.backoff_factor
            self.good = 0
            return
        self.good += 1
        if self.good == self.growth_interval:
            self.loss_scale *= self.growth_factor
            self.good = 0
'''

THIN_PACKING = "from helpers.training import pack_batch, pack_sequences  # the kit's own, if it had them\n"
THIN_OLD_ANSWERS = "from helpers import BucketBatchSampler, pad_batch  # what the kit used to ship\n\npack_sequences = BucketBatchSampler\npack_batch = pad_batch\n"

# (notebook, task, solution grade_id, graded cells the shortcut targets (None: all of the task's), the shortcut)
CASES = {
    "host read from a torch-named module": ("part1_profile_and_fix.ipynb", 2, "task2_train_fast", ["task2_test_no_host_syncs"],
                                            SYNC_FROM_TORCH_NAMED_MODULE),
    "host read on a pool thread": ("part1_profile_and_fix.ipynb", 2, "task2_train_fast", ["task2_test_no_host_syncs"],
                                   SYNC_ON_A_POOL_THREAD),
    "GradScaler wrapped, held outside the object": ("part3_loss_scaling.ipynb", 1, "task1_loss_scaler", None, GRAD_SCALER_WRAPPER),
    "GradScaler's fused kernel called by hand": ("part3_loss_scaling.ipynb", 1, "task1_loss_scaler", None, FUSED_KERNEL_BY_HAND),
    "thin import of packing from the kit": ("part2_sequence_packing.ipynb", 1, "task1_pack_sequences", None, THIN_PACKING),
    "thin import of the kit's old padding answers": ("part2_sequence_packing.ipynb", 2, "task2_pack_batch", None, THIN_OLD_ANSWERS),
}


def task_notebook(notebook: str, task: int, solution: str | None = None) -> nbformat.NotebookNode:
    """The source notebook trimmed to its setup cells and task ``task``'s cells, the solution replaced by ``solution``."""
    nb = assignments.read(HW2 / notebook)
    kept = []
    for cell in nb.cells:
        grade_id, owner = assignments.grade_id(cell), assignments.task_of(cell)
        if cell.cell_type != "code":
            continue
        if owner is None and grade_id and grade_id.startswith(f"setup_task{task}"):
            owner = task
        if owner not in (None, task):
            continue
        if solution is not None and assignments.is_solution(cell) and owner == task:
            cell.source = solution
        kept.append(cell)
    nb.cells = kept
    return nb


def score(nb_path: Path, tmp_path: Path) -> dict[str, float]:
    """Points each graded cell earns when the notebook runs: all of them if it ran without an error, else none."""
    run = execute_allowing_errors(nb_path, tmp_path / f"executed-{nb_path.name}")
    earned = {}
    for index, cell in enumerate(run.notebook.cells):
        if assignments.is_graded_test(cell):
            points = float(assignments.nbgrader_metadata(cell).get("points", 0))
            earned[assignments.grade_id(cell)] = 0.0 if index in run.errored or index in run.unexecuted else points
    return earned


def graded_points(nb: nbformat.NotebookNode) -> dict[str, float]:
    return {assignments.grade_id(c): float(assignments.nbgrader_metadata(c).get("points", 0)) for c in nb.cells if assignments.is_graded_test(c)}


def run_task(folder: Path, nb: nbformat.NotebookNode, name: str) -> dict[str, float]:
    nbformat.write(nb, folder / f"{name}.ipynb")
    return score(folder / f"{name}.ipynb", folder)


@pytest.fixture(scope="module")
def reference_scores(tmp_path_factory):
    """The honest reference's points on each task a shortcut targets, run once per task."""
    folder = shutil.copytree(HW2, tmp_path_factory.mktemp("reference") / "hw2_profiling", ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    return {(notebook, task): run_task(folder, task_notebook(notebook, task), f"{Path(notebook).stem}-task{task}")
            for notebook, task, *_ in {case[:2]: case for case in CASES.values()}.values()}


@pytest.mark.parametrize("case", list(CASES))
def test_shortcut_scores_zero_where_the_reference_scores_full(case, reference_scores, tmp_path):
    notebook, task, _, targeted, shortcut = CASES[case]
    full = graded_points(task_notebook(notebook, task))
    assert reference_scores[(notebook, task)] == full, "the honest reference must earn every point of the task"
    folder = shutil.copytree(HW2, tmp_path / "hw2_profiling", ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    earned = run_task(folder, task_notebook(notebook, task, shortcut), "shortcut")
    targeted = targeted or list(full)
    assert {cell: earned[cell] for cell in targeted} == dict.fromkeys(targeted, 0.0), f"{case}: {earned}"
