"""Every lecture notebook executes top to bottom under papermill (quick profile)."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.course.notebooks import execute_notebook, find_notebooks

pytestmark = pytest.mark.notebooks

ROOT = Path(__file__).resolve().parents[1]
LECTURES = find_notebooks(ROOT / "lectures")


def test_the_kit_has_lecture_notebooks():
    assert LECTURES, "no notebooks under lectures/"


@pytest.mark.parametrize("notebook", LECTURES, ids=[str(p.relative_to(ROOT / "lectures")) for p in LECTURES])
def test_lecture_runs(notebook, tmp_path):
    run = execute_notebook(notebook, tmp_path, parameters={"quick": True}, root=ROOT / "lectures", html=False)
    if run.status != "ok":
        pytest.fail(f"{run.notebook} failed after {run.seconds:.0f} s:\n{run.error}", pytrace=False)
