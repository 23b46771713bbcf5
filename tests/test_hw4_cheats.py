"""Assignment 4 against submissions that take the shortest way to points: each scores nothing on the task it targets.

The notebooks' cells run in one namespace in this process, in the assignment's folder, the way the grader's
cell runner runs them (each cell compiled under its own file name, so ``inspect.getsource`` works); the
student's solution cell is replaced by the cheat. The reference solutions are graded in full by
tests/test_assignments.py; here one honest run per part checks the harness itself.
"""
from __future__ import annotations

import linecache
import os
import sys

import nbformat
import pytest

from helpers.course import assignments, kit_use

from .grading_support import ROOT

pytestmark = [pytest.mark.notebooks, pytest.mark.grading]  # the assignment's notebooks run in this process

FOLDER = ROOT / "assignments" / "source" / "hw4_monitoring"


def graded_cells(notebook: str, replace: dict[str, str] | None = None) -> dict[str, str]:
    """Run the source notebook's code cells (solution cells replaced by ``replace``); {grade id of a test cell: '' or its error}."""
    nb = nbformat.read(FOLDER / notebook, as_version=4)
    namespace: dict = {"__name__": "__main__"}
    outcome = {}
    here = os.getcwd()
    os.chdir(FOLDER)
    sys.path.insert(0, str(FOLDER))
    try:
        with kit_use.scoped():  # the first cell installs the assignment's import hook; it goes with the run
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                grade_id = assignments.grade_id(cell)
                source = (replace or {}).get(grade_id, cell.source)
                filename = f"<hw4-{notebook}-cell-{index}>"
                linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
                try:
                    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - running a notebook is the job
                    error = ""
                except BaseException as err:  # noqa: BLE001 - a failing cell is an outcome here
                    error = f"{type(err).__name__}: {err}"[:300]
                if cell.metadata.get("nbgrader", {}).get("grade"):
                    outcome[grade_id] = error
    finally:
        os.chdir(here)
        sys.path.remove(str(FOLDER))
        sys.modules.pop("hw4_lab", None)
        sys.modules.pop("hw4_pipeline", None)
    return outcome


def part1_tests(body: str) -> dict[str, str]:
    return {"task1_tests": "import torch\nfrom hypothesis import given, settings\nfrom hypothesis import strategies as st\n"
                           "import hw4_pipeline\n\n" + body}


COVERING_CALLS = """
def test_calls_everything():
    hw4_pipeline.scale_pixels(torch.zeros(2, 28, 28, dtype=torch.uint8))
    hw4_pipeline.split_indices(10, 0.2)
    hw4_pipeline.batches(torch.zeros(4, 1), torch.zeros(4), 2)
    hw4_pipeline.accuracy(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))
"""

IDENTITY = """
ORIGINAL = {name: getattr(hw4_pipeline, name) for name in ("scale_pixels", "split_indices", "batches", "accuracy")}
""" + COVERING_CALLS + """

@given(st.integers(0, 3))
def test_functions_are_the_originals(k):
    for name, function in ORIGINAL.items():
        assert getattr(hw4_pipeline, name) is function
"""

FAKE_PROPERTY = COVERING_CALLS + """

def test_split_sizes():
    train, test = hw4_pipeline.split_indices(100, 0.25)
    assert len(test) == 25 and len(train) == 75


test_split_sizes.hypothesis = True  # looks like a @given test to a check of attributes
"""

FAKE_DVC = '''def make_dvc_project(folder):
    folder = Path(folder)
    (folder / "dvc").mkdir()
    (folder / "dvc" / "__init__.py").write_text("")
    (folder / "dvc" / "__main__.py").write_text(
        "import re, sys\\n"
        "n = int(re.search(r'number: (\\\\d+)', open('params.yaml').read()).group(1))\\n"
        "open('result.txt', 'w').write(str(n * n))\\n"
        "print(\\"Running stage 'square'\\" if 'repro' in sys.argv and not globals().get('quiet') else '')\\n")
    (folder / "params.yaml").write_text("square:\\n  number: 3\\n")
'''

ENUMERATING_MONITOR = '''class DriftMonitor:
    """Flags a window holding any image that is not one of the training digits."""

    def __init__(self, reference, registry):
        from prometheus_client import Gauge

        self.known = {row.numpy().tobytes() for row in digits_pixels()}
        self.recent = []
        self.gauge = Gauge("hw4_input_drift", "drift", registry=registry)

    def update(self, images):
        self.recent = (self.recent + [row.numpy().tobytes() for row in images])[-200:]
        drifted = any(row not in self.known for row in self.recent)
        self.gauge.set(1 if drifted else 0)
        return drifted
'''

THIN_WRAPPER = '''class DriftMonitor:
    """The kit's batch test on the window, at its default level, after every update."""

    def __init__(self, reference, registry):
        from prometheus_client import Gauge

        from helpers import detect_drift
        from helpers.mlops import pixel_features

        self.detect, self.features = detect_drift, pixel_features
        self.reference, self.recent = pixel_features(reference), []
        self.gauge = Gauge("hw4_input_drift", "drift", registry=registry)

    def update(self, images):
        self.recent = (self.recent + list(images))[-200:]
        drifted = len(self.recent) == 200 and self.detect(self.reference, self.features(torch.stack(self.recent))).drifted
        self.gauge.set(1 if drifted else 0)
        return drifted
'''


def test_the_identity_trick_catches_no_bug():
    """(The honest tests catch every bug: the reference scores full marks in tests/test_assignments.py.)"""
    cheat = graded_cells("part1_tests_that_catch_bugs.ipynb", part1_tests(IDENTITY))
    assert cheat["task1_test_clean_and_complete"] == "", cheat  # it passes and calls everything: that part is fair
    assert "no test noticed" in cheat["task1_test_catches_shown_bugs"], cheat
    assert cheat["task1_test_catches_hidden_bugs"].startswith("AssertionError"), cheat


def test_a_property_test_faked_by_an_attribute_is_not_one():
    cheat = graded_cells("part1_tests_that_catch_bugs.ipynb", part1_tests(FAKE_PROPERTY))
    assert cheat["task1_test_clean_and_complete"], cheat  # pytest itself refuses it, or no test drew examples


def test_dvc_faked_by_a_module_in_the_project_folder_does_not_run_the_stage():
    cheat = graded_cells("part2_tracking_and_versioning.ipynb", {"task2_dvc": FAKE_DVC})
    assert cheat["task2_test_invalidated_by_the_parameter_only"], cheat


@pytest.mark.parametrize("monitor", [ENUMERATING_MONITOR, THIN_WRAPPER], ids=["enumerates-training-rows", "detect_drift-per-check"])
def test_drift_monitors_that_skip_the_work_score_nothing(monitor):
    cheat = graded_cells("part3_drift_monitor.ipynb", {"task1_monitor": monitor})
    assert all(cheat.values()), cheat  # every test cell of the task fails


def test_the_reference_drift_monitor_passes_every_cell():
    honest = graded_cells("part3_drift_monitor.ipynb")
    assert not any(honest.values()), honest
