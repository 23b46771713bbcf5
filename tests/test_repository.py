"""House rules of the kit: clean notebooks, parameters cells, matching pins, the README's two commands."""
from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import nbformat
import pytest
import yaml

from helpers.course import sealed
from helpers.course.lesson_cells import count_lesson_cells, writes_lesson
from helpers.course.notebooks import find_notebooks, has_outputs, is_clean

ROOT = Path(__file__).resolve().parents[1]


def stored_notebooks() -> set[Path]:
    """Notebooks git tracks, plus any under lectures/ and assignments/source/ not yet committed."""
    listed = subprocess.run(["git", "ls-files", "*.ipynb"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    sources = [d for d in (ROOT / "lectures", ROOT / "assignments" / "source") if d.exists()]
    return {p for p in {ROOT / p for p in listed} | set(find_notebooks(*sources)) if not sealed.is_ciphertext(p)}  # sealed ones: ciphertext


def test_stored_notebooks_have_no_outputs():
    notebooks = stored_notebooks()
    assert notebooks, "found no notebooks at all"
    dirty = [str(p.relative_to(ROOT)) for p in sorted(notebooks) if p.exists() and has_outputs(p)]
    assert not dirty, f"notebooks stored with outputs (run `make strip`): {dirty}"


def test_stored_notebooks_are_what_make_strip_writes():
    """Kernel metadata included: a notebook stored in this form opens unmodified in `make lab` (test_lab_browser)."""
    unclean = [str(p.relative_to(ROOT)) for p in sorted(stored_notebooks()) if p.exists() and not is_clean(p)]
    assert not unclean, f"notebooks not stored as `make strip` writes them (run `make strip`): {unclean}"


@pytest.mark.parametrize("notebook", find_notebooks(ROOT / "lectures"), ids=lambda p: p.name)
def test_each_lecture_writes_its_lessons_in_its_cells(notebook):
    """At least three code cells, and 30% of them, write what the lecture teaches (helpers.course.lesson_cells)."""
    counted = count_lesson_cells(notebook)
    assert counted.lesson_cells >= 3 and counted.share >= 0.30, (
        f"{notebook.name}: {counted.lesson_cells} of {counted.code_cells} code cells write the lesson; write the mechanisms "
        "the sections teach in their cells (README: Adding a lecture)")


@pytest.mark.parametrize("source, lesson", [
    ("def step(model, x):\n    loss = model(x).sum()\n    loss.backward()\n    return loss\n\n", False),  # four lines
    ("def step(model, x):\n    y = model(x)\n    loss = y.sum()\n    loss.backward()\n    return loss\n", True),
    ("a = torch.ones(3)\nb = torch.zeros(3)\nc = torch.cat([a, b])\nprint(c)\nd = c\n", True),  # three torch calls in five lines
    ("a = torch.ones(3)\nb = sweep(a)\nc = sweep(b)\nprint(c)\nd = report(c)\n", False),  # one: the rest is the kit's
    ("x = torch.ones(3)\n\n# a comment\ny = torch.zeros(3)\nz = torch.cat([x, y])\n", False),  # four lines of code
])
def test_what_counts_as_a_lesson_cell(source, lesson):
    assert writes_lesson(source, {"torch"}) is lesson


@pytest.mark.parametrize("notebook", find_notebooks(ROOT / "lectures"), ids=lambda p: p.name)
def test_lecture_has_a_parameters_cell_with_device_and_quick(notebook):
    nb = nbformat.read(notebook, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert re.search(r"^device\s*=", tagged[0].source, re.M) and re.search(r"^quick\s*=\s*False", tagged[0].source, re.M)


def pyproject_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def pins_from_pyproject() -> set[str]:
    return set(pyproject_dependencies())


def pins_from_environment() -> set[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {p for p in pip if not p.startswith("-e")}


def test_environment_yml_mirrors_pyproject_pins():
    pyproject, conda = pins_from_pyproject(), pins_from_environment()
    assert pyproject == conda, f"only in pyproject: {sorted(pyproject - conda)}; only in environment.yml: {sorted(conda - pyproject)}"


def test_every_dependency_is_listed_once():
    names = [re.split(r"[=<>!~\[ ]", p, maxsplit=1)[0].lower().replace("_", "-") for p in pyproject_dependencies()]
    assert len(names) == len(set(names)), f"listed more than once: {sorted({n for n in names if names.count(n) > 1})}"


def test_every_dependency_is_pinned_exactly():
    loose = [p for p in pins_from_pyproject() if "==" not in p]
    assert not loose, f"pin these exactly: {loose}"


def test_readme_quick_start_is_exactly_two_commands():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```(?:sh|bash)?\n(.*?)```", section, re.S).group(1)
    commands = [line for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert commands == ["make lectures", "make test"]


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_setup_reinstalls_only_when_pyproject_changed_after_the_last_install(tmp_path):
    # `make -q` exits 0 when the target has nothing left to do; a venv elsewhere (VENV=) keeps this checkout's own
    def up_to_date():
        return subprocess.run(["make", "-q", "setup", f"VENV={tmp_path / 'venv'}"], cwd=ROOT, capture_output=True).returncode == 0
    assert not up_to_date()  # never installed
    stamp = tmp_path / "venv" / ".installed"
    stamp.parent.mkdir()
    stamp.touch()
    pyproject = (ROOT / "pyproject.toml").stat().st_mtime
    os.utime(stamp, (pyproject + 60, pyproject + 60))
    assert up_to_date()  # a second `make setup` is a no-op
    os.utime(stamp, (pyproject - 60, pyproject - 60))
    assert not up_to_date()  # the pins changed since: install again
