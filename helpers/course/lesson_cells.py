"""How much of a lecture is written in its cells: the code cells that write the lesson, counted.

A lesson cell defines a function or class of five lines or more, or holds five or more lines of code of which at
least three call a library other than ``helpers`` (a name the notebook imports from torch, time, threading, ...):
the code a section teaches, written where the instructor can edit it. The cell that hands ``lesson_figures`` back
to the tests is not counted. ``python -m helpers.course.lesson_cells lectures`` prints the count per notebook.
"""
from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

DEFINITION_LINES, BLOCK_LINES, LIBRARY_CALL_LINES = 5, 5, 3
FIGURES_CELL = "lesson_figures = "


@dataclass(frozen=True)
class LessonCells:
    notebook: str
    code_cells: int
    lesson_cells: int

    @property
    def share(self) -> float:
        return self.lesson_cells / self.code_cells if self.code_cells else 0.0


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse("\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()))
    except SyntaxError:
        return None


def library_names(sources: list[str]) -> set[str]:
    """Names the notebook binds to modules other than ``helpers`` (``torch``, ``F``, ``time``, ``ThreadPoolExecutor``...)."""
    names = set()
    for tree in filter(None, map(_parse, sources)):
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("helpers")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and not node.module.startswith("helpers"):
                names |= {a.asname or a.name for a in node.names}
    return names


def _called_name(node: ast.AST) -> str | None:
    """The name a call chain starts from: ``torch`` for ``torch.nn.functional.relu(x)``, ``a`` for ``a.sum().item()``."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def writes_lesson(source: str, libraries: set[str]) -> bool:
    tree = _parse(source)
    if tree is None:
        return False
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.end_lineno - node.lineno + 1 >= DEFINITION_LINES:
            return True
    code_lines = [line for line in source.splitlines() if line.strip() and not line.strip().startswith("#")]
    calling = {node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call) and _called_name(node.func) in libraries}
    return len(code_lines) >= BLOCK_LINES and len(calling) >= LIBRARY_CALL_LINES


def count_lesson_cells(path: str | Path) -> LessonCells:
    """Code cells and lesson cells of the notebook at ``path``."""
    cells = nbformat.read(path, as_version=4).cells
    sources = [c.source for c in cells if c.cell_type == "code" and FIGURES_CELL not in c.source]
    libraries = library_names(sources)
    return LessonCells(Path(path).name, len(sources), sum(writes_lesson(s, libraries) for s in sources))


if __name__ == "__main__":
    from helpers.course.notebooks import find_notebooks

    for notebook in find_notebooks(*(sys.argv[1:] or ["lectures"])):
        counted = count_lesson_cells(notebook)
        print(f"{counted.lesson_cells:3d} of {counted.code_cells:3d} code cells write the lesson ({counted.share:4.0%})  {notebook}")
