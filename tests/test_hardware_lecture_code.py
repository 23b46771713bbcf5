"""Code written once: where a hardware lecture's cell and a helpers module hold the same definition, they are identical.

The lecture's cell is the source (it is what the lecture teaches and runs); the module is the same code for the
benchmarks and the tests. Editing one without the other fails here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LECTURES = ROOT / "lectures" / "01-gpu-architecture"

SHARED = [  # (notebook, module file, names defined in both)
    ("03-gpu-programming-model.ipynb", "helpers/hardware/triton_kernels.py",
     ["naive_matmul_kernel", "naive_matmul", "tiled_matmul_kernel", "tiled_matmul"]),
    ("03-gpu-programming-model.ipynb", "helpers/hardware/cpu_kernels.py", ["naive_ijk", "reordered_ikj", "blocked_ikj"]),
    ("02-hardware-ecosystem.ipynb", "helpers/core/models.py", ["LeNet", "BasicFCModel"]),
]


def definitions(source: str) -> dict[str, str]:
    """The exact text of every top-level function and class in ``source``, decorators included."""
    lines = source.splitlines()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
            found[node.name] = "\n".join(lines[start:node.end_lineno])
    return found


def notebook_definitions(path: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    for cell in nbformat.read(path, as_version=4).cells:
        if cell.cell_type == "code":
            for name, text in definitions(cell.source).items():
                assert name not in found, f"{path.name} defines {name} twice"
                found[name] = text
    return found


@pytest.mark.parametrize(("notebook", "module", "names"), SHARED, ids=[f"{n}:{Path(m).stem}" for n, m, _ in SHARED])
def test_cells_and_module_hold_the_same_code(notebook, module, names):
    cells = notebook_definitions(LECTURES / notebook)
    code = definitions((ROOT / module).read_text())
    for name in names:
        assert name in cells, f"{notebook} no longer defines {name}: update SHARED here"
        assert name in code, f"{module} no longer defines {name}: update SHARED here"
        assert cells[name] == code[name], f"{name} differs between {notebook} and {module}: copy the cell's version into the module"


def test_a_changed_cell_is_caught():
    cell = "@jit\ndef f(x):\n    return x + 1\n"
    assert definitions(cell)["f"] != definitions(cell.replace("+ 1", "+ 2"))["f"]
    assert definitions(cell)["f"].startswith("@jit")
