"""The layering of helpers/: the core imports no block, blocks meet only through public faces, lectures use public names."""
from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "helpers"
BLOCKS = sorted(p.name for p in HELPERS.iterdir() if (p / "__init__.py").exists() and p.name not in ("core", "course"))


def _code(path: Path) -> str:
    """A .py file's text, or a notebook's code cells with IPython's magics and shell lines left out."""
    if path.suffix != ".ipynb":
        return path.read_text()
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    lines = [line for c in cells for line in "".join(c["source"]).splitlines() + [""]]
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


def _is_module(dotted: str) -> bool:
    """True when ``helpers.x.y`` names a module or package of the kit (not a function or class)."""
    path = ROOT.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def imported_modules(path: Path) -> list[str]:
    """Every absolute ``helpers...`` module a file (or notebook) imports, in any form.

    ``import helpers.x.y`` counts as ``helpers.x.y``; ``from helpers.x import y`` as ``helpers.x``, or as
    ``helpers.x.y`` when ``y`` is a submodule; ``importlib.import_module("helpers.x.y")`` as ``helpers.x.y``.
    """
    found = []
    for node in ast.walk(ast.parse(_code(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if _is_module(f"{node.module}.{a.name}")]
            found += subs or [node.module]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in ("import_module", "__import__"):
                found.append(node.args[0].value)
    return [m for m in found if m == "helpers" or m.startswith("helpers.")]


def test_every_import_form_is_seen(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text("import helpers.distributed.ddp_train\nfrom helpers.core import procs, timeit\nfrom helpers.serving import start_service\n"
                      "import importlib\nimportlib.import_module('helpers.serving.grpc_service')\n")
    assert imported_modules(source) == ["helpers.distributed.ddp_train", "helpers.core.procs", "helpers.serving", "helpers.serving.grpc_service"]


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
ASSIGNMENT_SOURCES = sorted(p for p in (ROOT / "assignments" / "source").rglob("*") if p.suffix in (".py", ".ipynb") and ".ipynb_checkpoints" not in p.parts)


def _face_exports(module: str) -> bool:
    """True for ``helpers.<block>.<name>`` where the block's face lists ``name`` (a module it exports on purpose, such as a torchrun script)."""
    face, _, name = module.rpartition(".")
    return face.count(".") == 1 and name in getattr(importlib.import_module(face), "__all__", ())


def private_imports(path: Path) -> list[str]:
    """The helpers modules ``path`` imports that are not ``helpers`` or a block's public face ``helpers.<block>``."""
    return [m for m in imported_modules(path) if (m.count(".") > 1 and not _face_exports(m)) or m == "helpers.course"]


@pytest.mark.parametrize("notebook", LECTURES, ids=lambda p: p.name)
def test_lectures_import_only_public_faces(notebook):
    private = private_imports(notebook)
    assert not private, f"{notebook.name} imports {private}: import from the block's public face (helpers.<block>)"


# the course tooling an assignment reaches: the first cell's enforce() (the assignment's own limits), and the
# instructors' files that a later task's tests use when graded (a broken earlier task then costs nothing)
STUDENT_FACING_COURSE = {"helpers.course.kit_use", "helpers.course.references"}


@pytest.mark.instructor  # reads the assignments' sources
@pytest.mark.parametrize("source", ASSIGNMENT_SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_assignments_import_only_public_faces_and_their_own_files(source):
    """An assignment uses the kit as a student sees it: public faces, and its own support files beside it."""
    private = [m for m in private_imports(source) if m not in STUDENT_FACING_COURSE]
    assert not private, f"{source.parent.name}/{source.name} imports {private}: use the public face helpers.<block> (or a support file in its folder)"


def test_importing_helpers_loads_no_heavy_optional_part():
    code = ("import sys, helpers; heavy = ['torch.distributed', 'ipywidgets', 'matplotlib.pyplot', 'fastapi', 'mlflow']; "
            "print([m for m in heavy if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"import helpers loaded {out.stdout.strip()}: keep them behind lazy public faces"


def architecture_sections() -> dict[str, str]:
    """ARCHITECTURE.md's text per package: the section headed ``## <package>: ...``."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    return {part.split(":")[0].strip(): part for part in text.split("\n## ")[1:]}


@pytest.mark.parametrize("package", sorted(p.name for p in HELPERS.iterdir() if (p / "__init__.py").exists()))
def test_architecture_names_every_module_of_the_package(package):
    section = architecture_sections().get(package, "")
    modules = sorted(p.relative_to(HELPERS / package).as_posix() for p in (HELPERS / package).rglob("*.py") if p.name != "__init__.py")
    missing = [m for m in modules if f"`{m}`" not in section]
    assert not missing, f"ARCHITECTURE.md's '## {package}' table does not name {missing}: add a row (| `module.py` | its job |)"
