"""Code written once: where a lecture's cell and a helpers module hold the same definition, they are identical.

The lecture's cell is the source (it is what the lecture teaches and runs); the module is the same code for the
benchmarks and the tests. Editing one without the other fails here.
"""
from __future__ import annotations

import ast
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LECTURES = ROOT / "lectures"

SHARED = [  # (notebook under lectures/, module file, names defined in both)
    ("01-gpu-architecture/03-gpu-programming-model.ipynb", "helpers/hardware/triton_kernels.py",
     ["naive_matmul_kernel", "naive_matmul", "tiled_matmul_kernel", "tiled_matmul"]),
    ("01-gpu-architecture/03-gpu-programming-model.ipynb", "helpers/hardware/cpu_kernels.py", ["naive_ijk", "reordered_ikj", "blocked_ikj"]),
    ("01-gpu-architecture/02-hardware-ecosystem.ipynb", "helpers/core/models.py", ["LeNet", "BasicFCModel"]),
    ("04-memory-efficient-training/04-memory-efficient-training.ipynb", "helpers/distributed/offload.py", ["OffloadedAdam"]),
    ("04-memory-efficient-training/04-memory-efficient-training.ipynb", "helpers/distributed/alexnet_parallel.py", ["tower_forward"]),
    # torchrun starts its workers from the module's file: the cell is what the notebook runs, the file what torchrun runs
    ("03-data-parallel/03b-data-loading-and-elastic-training.ipynb", "helpers/distributed/elastic_train.py",
     ["tiny_model", "batch_indices", "save_atomically", "train"]),
    # the servers lecture 7 starts run the module's copy (a process of their own)
    ("07-deploying-software/07-formats-runtimes-batching.ipynb", "helpers/serving/batching.py", ["Pending", "DynamicBatcher"]),
    # the engine, make serve-llm and the benchmarks import the modules' copy of the model and the engine's pieces
    ("08-deploying-ml/08b-serving-language-models.ipynb", "helpers/serving/llama.py",
     ["RMSNorm", "rotary_angles", "rotary", "Group", "Batch", "Attention", "SwiGLU", "DecoderLayer", "Llama"]),
    ("08-deploying-ml/08b-serving-language-models.ipynb", "helpers/serving/llm_engine.py", ["BlockPool", "ngram_draft", "admit", "accept_drafts"]),
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


@pytest.mark.parametrize(("notebook", "module", "names"), SHARED, ids=[f"{Path(n).stem}:{Path(m).stem}" for n, m, _ in SHARED])
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

