"""No assignment answer in the kit: what a student writes is neither exported by `helpers` nor defined in a lecture.

The answer's names are read from each assignment's sources: every function or class defined in, or holding, a
``### BEGIN SOLUTION`` ... ``### END SOLUTION`` region of a source notebook or .py file (methods aside: their
names are a class's business). A `helpers` public face (``helpers`` and each ``helpers.<block>``) must not export
such a name, and no lecture notebook may define it.
"""
from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

from helpers.course import assignments

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "assignments" / "source"
ASSIGNMENTS = sorted(p.name for p in SOURCE.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))) if SOURCE.exists() else []
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def _python(source: str) -> str:
    """A cell's source as plain Python: IPython magics and shell lines become ``pass`` (line numbers kept)."""
    return "\n".join(re.sub(r"^(\s*)[%!].*$", r"\1pass", line) for line in source.splitlines())


def _definitions(tree: ast.AST):
    """(node, inside_a_class) for every function and class definition of ``tree``, at any depth."""
    def walk(node, in_class):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield child, in_class
            yield from walk(child, isinstance(child, ast.ClassDef))
    yield from walk(tree, False)


def solution_names(source: str) -> set[str]:
    """Names of the functions and classes defined in, or around, the solution regions of one cell or file."""
    regions, start = [], None
    for number, line in enumerate(source.splitlines(), 1):
        if BEGIN in line:
            start = number
        elif END in line and start is not None:
            regions.append((start, number))
            start = None
    if not regions:
        return set()
    tree = ast.parse(_python(source))
    return {node.name for node, in_class in _definitions(tree) if not in_class
            and any(node.lineno <= end and (node.end_lineno or node.lineno) >= begin for begin, end in regions)}


def assignment_sources(assignment: str) -> list[tuple[str, str]]:
    """(where, source) of every code cell of the assignment's notebooks and every .py file beside them."""
    folder = SOURCE / assignment
    found = []
    for path in assignments.notebooks(folder):
        nb = nbformat.read(path, as_version=4)
        found += [(f"{path.name} cell {i}", c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    found += [(str(p.relative_to(folder)), p.read_text()) for p in sorted(folder.rglob("*.py"))]
    return found


def answer_names(assignment: str) -> dict[str, str]:
    return {name: where for where, source in assignment_sources(assignment) for name in solution_names(source)}


def public_faces() -> dict[str, set[str]]:
    faces = {"helpers": importlib.import_module("helpers")}
    for init in sorted((ROOT / "helpers").glob("*/__init__.py")):
        faces[f"helpers.{init.parent.name}"] = importlib.import_module(f"helpers.{init.parent.name}")
    return {name: set(getattr(module, "__all__", None) or [n for n in dir(module) if not n.startswith("_")]) for name, module in faces.items()}


def lecture_definitions() -> dict[str, set[str]]:
    defined = {}
    for path in sorted((ROOT / "lectures").rglob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        names = set()
        for cell in nb.cells:
            if cell.cell_type == "code":
                try:
                    names |= {node.name for node, _ in _definitions(ast.parse(_python(cell.source)))}
                except SyntaxError:
                    continue
        defined[str(path.relative_to(ROOT))] = names
    return defined


def test_solution_names_are_read_from_regions_and_the_functions_around_them():
    source = ("def outside():\n    pass\n\ndef task(x):\n    ### BEGIN SOLUTION\n    def helper(y):\n        return y\n"
              "    class Step:\n        def forward(self):\n            pass\n    return helper(x)\n    ### END SOLUTION\n\n"
              "### BEGIN SOLUTION\nclass Answer:\n    def method(self):\n        pass\n### END SOLUTION\n%time task(1)\n")
    assert solution_names(source) == {"task", "helper", "Step", "Answer"}
    assert solution_names("def no_region():\n    return 1\n") == set()


@pytest.mark.instructor  # reads the assignments' solutions
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_no_helpers_face_exports_and_no_lecture_defines_an_answer(assignment):
    answers = answer_names(assignment)
    assert answers, f"{assignment}: no function or class found in a solution region"
    problems = [f"{face} exports {name!r} ({answers[name]})" for face, names in public_faces().items() for name in sorted(names & set(answers))]
    problems += [f"{lecture} defines {name!r} ({answers[name]})" for lecture, names in lecture_definitions().items() for name in sorted(names & set(answers))]
    assert not problems, f"{assignment}: the kit holds answers:\n" + "\n".join(problems)


@pytest.mark.instructor  # reads the assignments' solutions and hidden tests
def test_no_plain_file_holds_half_of_any_solution_or_hidden_test():
    """Every solution and hidden-test region of the sources against every tracked file that is not sealed (the
    answers of a task must not be readable in the kit a student clones: .gitattributes seals the rest)."""
    from helpers.course import sealed

    regions = sealed.answer_regions(SOURCE)
    assert len(regions) >= 40, f"only {len(regions)} solution or hidden-test regions found under {SOURCE}"
    found = sealed.leaks(regions, sealed.plain_tracked_files(ROOT))
    assert not found, "plain files hold answers (seal them in .gitattributes, or rewrite the kit's code):\n" + "\n".join(
        f"  {leak.file}: {leak.share:.0%} of the {leak.region.kind} of {leak.region.where}" for leak in found)


def test_the_leak_check_finds_a_copied_answer_and_ignores_idioms():
    from helpers.course import sealed

    answer = sealed.Region("hw/part.ipynb cell 1", "solution", tuple(" ".join(line.split()) for line in (
        "buckets = plan_buckets(parameters, cap_bytes)", "flat = torch.cat([p.grad.flatten() for p in bucket])",
        "dist.all_reduce(flat, op=dist.ReduceOp.SUM)", "offset = offset + p.numel()", "return x")))
    copied = "\n".join(["buckets = plan_buckets(parameters, cap_bytes)", "   flat = torch.cat([p.grad.flatten()  for p in bucket])",
                        "dist.all_reduce(flat, op=dist.ReduceOp.SUM)"])
    files = {"copy.py": copied, "other.py": "print('hello world, nothing here')"}
    assert [(leak.file, round(leak.share, 2)) for leak in sealed.leaks([answer], files)] == [("copy.py", 0.75)]
    idiom = {f"f{i}.py": "offset = offset + p.numel()\nflat = torch.cat([p.grad.flatten() for p in bucket])" for i in range(5)}
    assert sealed.leaks([answer], {**idiom, "copy.py": "offset = offset + p.numel()"}) == []  # shared by many files: an idiom
