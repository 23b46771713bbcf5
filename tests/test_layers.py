"""The layering of helpers/: the core imports no block, blocks meet only through public faces, lectures use public names."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "helpers"
BLOCKS = sorted(p.name for p in HELPERS.iterdir() if (p / "__init__.py").exists() and p.name not in ("core", "course"))


def imported_modules(path: Path) -> list[str]:
    """Every absolute ``helpers...`` module a file imports (``from helpers.x import y`` counts as ``helpers.x``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return [m for m in found if m == "helpers" or m.startswith("helpers.")]


def modules_of(package: str) -> list[Path]:
    return sorted((HELPERS / package).glob("*.py"))


def test_the_blocks_are_there():
    assert {"hardware", "distributed", "training", "serving", "mlops"} <= set(BLOCKS)


@pytest.mark.parametrize("path", modules_of("core"), ids=lambda p: p.name)
def test_the_core_imports_no_block(path):
    upward = [m for m in imported_modules(path) if m.split(".")[1:2] and m.split(".")[1] not in ("core",)]
    assert not upward, f"helpers/core/{path.name} imports {upward}: the core must not depend on a course block"


@pytest.mark.parametrize("path", [p for b in BLOCKS for p in modules_of(b)], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_block_reaches_other_blocks_only_through_their_public_faces(path):
    block = path.parent.name
    for module in imported_modules(path):
        parts = module.split(".")
        if len(parts) >= 2 and parts[1] in BLOCKS and parts[1] != block:
            assert len(parts) == 2, f"{block}/{path.name} imports {module}: use the public face helpers.{parts[1]}"
        assert parts[1:2] != ["course"], f"{block}/{path.name} imports course tooling ({module})"


LECTURES = sorted((ROOT / "lectures").glob("*/*.ipynb"))
IMPORT_LINE = re.compile(r"^\s*from (helpers[\w.]*) import", re.M)


@pytest.mark.parametrize("notebook", LECTURES, ids=lambda p: p.name)
def test_lectures_import_only_public_faces(notebook):
    cells = json.loads(notebook.read_text())["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    private = [m for m in IMPORT_LINE.findall(code) if m.count(".") > 1]
    assert not private, f"{notebook.name} imports from {private}: import from the block's public face (helpers.<block>)"


def test_importing_helpers_loads_no_heavy_optional_part():
    code = ("import sys, helpers; heavy = ['torch.distributed', 'ipywidgets', 'matplotlib.pyplot', 'fastapi', 'mlflow']; "
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"import helpers loaded {out.stdout.strip()}: keep them behind lazy public faces"
