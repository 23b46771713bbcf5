"""What of the kit an assignment may use, and the import hook that holds its notebooks to it.

Each assignment declares it in ``assignments/source/<id>/assignment.toml`` (released with the notebooks)::

    kit = ["helpers.core.launch", "helpers.distributed.count_traffic"]   # modules or names; their parents are reachable
    timing_sensitive = ["part2_export_and_optimise.ipynb"]               # graded alone when JOBS > 1
    support_modules = ["hw3_lab"]                                        # the released .py files, which import freely
    language_model = true                                                # its notebooks load SmolLM2 (weights cached first)
    [references."part2.ipynb"]                                           # instructors' files for later tasks' tests
    cells = ["setup", "task1"]                                           # (see helpers.course.references)
    make = "task1_function(REFERENCES / 'file')"

``enforce()`` (the assignment's first cell, with the notebook's folder as the working directory) and the
grading runner (before any student code) install the hook: code of the notebook, or a module of the
student's own, that imports anything else of ``helpers`` gets an ImportError naming the declaration, and
what it imports is a view of the package that shows only the declared names (``helpers.serving.x`` through
an allowed parent raises the same error). The kit itself and the assignment's support modules import freely.

It closes the thin imports (``import``, ``from``, ``__import__`` called directly, ``importlib``, attributes of a face); it is not a wall
against code that digs out the module objects themselves (``sys.modules``, ``gc``): the tests of each
assignment check the property they grade, and the graded notebook shows such digging to the TA.
"""
from __future__ import annotations

import builtins
import contextlib
import importlib
import os
import sys
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path

from helpers.course.references import declared

DECLARATION = "assignment.toml"
ALWAYS = "helpers.course.kit_use.enforce"  # the assignment's first cell calls it, graded or not


@dataclass(frozen=True)
class Declaration:
    kit: tuple[str, ...] | None  # None: no declaration, all of the kit
    timing_sensitive: tuple[str, ...] = ()
    support_modules: tuple[str, ...] = ()
    language_model: bool = False  # its notebooks load the kit's language model: the grader caches its weights first
    references: tuple[tuple[str, tuple[str, ...], str], ...] = ()  # (notebook, cells, make): see helpers.course.references
    referee: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (notebook, names its tests call): see helpers.course.referee


def declaration(folder: str | Path) -> Declaration:
    """The assignment's declaration from ``<folder>/assignment.toml`` (no file: no restriction, nothing timing-sensitive)."""
    path = Path(folder) / DECLARATION
    if not path.is_file():
        return Declaration(None)
    data = tomllib.loads(path.read_text())
    kit = data.get("kit")
    if kit is not None and not (isinstance(kit, list) and all(isinstance(k, str) and (k == "helpers" or k.startswith("helpers.")) for k in kit)):
        raise ValueError(f"{path}: kit must be a list of dotted names under helpers, e.g. [\"helpers.core.launch\"]")
    references = tuple((notebook, cells, make) for notebook, (cells, make) in declared(data, str(path)).items())
    return Declaration(tuple(kit) if kit is not None else None, tuple(data.get("timing_sensitive", ())), tuple(data.get("support_modules", ())),
                       bool(data.get("language_model", False)), references, refereed(data, str(path)))


def refereed(data: dict, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """(notebook, names) from an assignment.toml's ``referee`` table: the notebooks whose tests run in a process of
    their own, and the names of the student's code those tests call (helpers.course.referee)."""
    table = data.get("referee", {})
    found = []
    for notebook, entry in (table.items() if isinstance(table, dict) else [("", table)]):
        names = entry.get("names") if isinstance(entry, dict) else None
        if not (notebook.endswith(".ipynb") and isinstance(names, list) and names and all(isinstance(n, str) and n.isidentifier() for n in names)):
            raise ValueError(f"{where}: referee must map a notebook file name to {{names = [the names its tests call]}}, "
                             f"e.g. [referee.\"part3.ipynb\"] names = [\"SLOEngine\"]")
        found.append((notebook, tuple(names)))
    return tuple(found)


class Rules:
    """The declared names of one assignment, and the views of ``helpers`` modules that show only them."""

    def __init__(self, assignment: str, kit: tuple[str, ...], student_dir: str, trusted_modules: tuple[str, ...]):
        self.assignment, self.kit = assignment, tuple(kit)
        self.student_dir, self.trusted_modules = os.path.realpath(student_dir), set(trusted_modules)
        self.faces: dict[str, types.ModuleType] = {}

    def allows(self, dotted: str) -> bool:
        return any(dotted == k or dotted.startswith(k + ".") or k.startswith(dotted + ".") for k in (*self.kit, ALWAYS))

    def refusal(self, dotted: str) -> str:
        return (f"{dotted} is not part of the kit that {self.assignment} may use (it may use: {', '.join(self.kit) or 'nothing of helpers'}; "
                f"declared in {self.assignment}/{DECLARATION}): the assignment asks you to write this yourself")

    def is_student(self, namespace) -> bool:
        """Code of the notebook (``__main__``) or of a module in the student's folder that is not a support module."""
        if not isinstance(namespace, dict):
            return False
        name, path = namespace.get("__name__"), namespace.get("__file__")
        if name == "__main__" or (name is None and path is None):
            return True
        if not isinstance(path, str) or (name or "").split(".")[0] in self.trusted_modules:
            return False  # a file run without a module name (a config file that traitlets executes) is judged by its folder
        return os.path.dirname(os.path.realpath(path)).startswith(self.student_dir)

    def face(self, module: types.ModuleType) -> types.ModuleType:
        """A module object showing only the declared names of ``module`` (sub-packages as faces too)."""
        if module.__name__ not in self.faces:
            rules = self

            class KitFace(types.ModuleType):
                def __getattr__(self, attribute):
                    dotted = f"{module.__name__}.{attribute}"
                    if not rules.allows(dotted):
                        raise ImportError(rules.refusal(dotted), name=dotted)
                    value = getattr(module, attribute)
                    return rules.face(value) if isinstance(value, types.ModuleType) and value.__name__.startswith("helpers") else value

                def __dir__(self):
                    return [n for n in dir(module) if rules.allows(f"{module.__name__}.{n}")]

            self.faces[module.__name__] = KitFace(module.__name__, module.__doc__)
        return self.faces[module.__name__]


_installed: list[Rules] = []  # the rules this process holds to: installed once (by the grading runner, or the first cell)


def install(assignment: str, kit: tuple[str, ...] | list[str] | None, student_dir: str = ".", trusted_modules=()) -> Rules | None:
    """Hold imports of ``helpers`` by student code to ``kit`` from now on in this process (None: no restriction).

    Once per process: a second call (the notebook's first cell, when the grading runner installed the hook
    before it) changes nothing, so the hook the runner guards stays the one in place."""
    if kit is None:
        return None
    if _installed:
        return _installed[0]
    rules = Rules(assignment, tuple(kit), student_dir, tuple(trusted_modules))
    original_import, original_import_module = builtins.__import__, importlib.import_module

    def kit_import(name, globals=None, locals=None, fromlist=(), level=0):
        module = original_import(name, globals, locals, fromlist, level)
        # an import statement passes its module's globals; a direct call may leave them out: then the caller is judged
        importer = globals if globals is not None else sys._getframe(1).f_globals
        if level or not (name == "helpers" or name.startswith("helpers.")) or not rules.is_student(importer):
            return module
        if not fromlist:
            if not rules.allows(name):
                raise ImportError(rules.refusal(name), name=name)
            return rules.face(module)
        for item in fromlist:
            dotted = f"{name}.{item}"
            if item == "*" or not rules.allows(dotted):
                raise ImportError(rules.refusal(dotted), name=dotted)
        return rules.face(module)

    def import_module(name, package=None):
        module = original_import_module(name, package)
        caller = sys._getframe(1).f_globals
        if module.__name__.startswith("helpers") and rules.is_student(caller):
            if not rules.allows(module.__name__):
                raise ImportError(rules.refusal(module.__name__), name=module.__name__)
            return rules.face(module)
        return module

    builtins.__import__ = importlib.__import__ = kit_import
    importlib.import_module = import_module
    _installed.append(rules)
    return rules


@contextlib.contextmanager
def scoped():
    """Run notebooks in this process (the kit's tests do): their first cell installs its own rules, and afterwards
    the process is as it was (its import functions and rules restored)."""
    saved = builtins.__import__, importlib.__import__, importlib.import_module, list(_installed)
    _installed.clear()
    try:
        yield
    finally:
        builtins.__import__, importlib.__import__, importlib.import_module = saved[:3]
        _installed[:] = saved[3]


def enforce(folder: str | Path = ".") -> None:
    """The assignment's first cell: hold this notebook to its folder's assignment.toml (no file: nothing changes)."""
    folder = Path(folder).resolve()
    declared = declaration(folder)
    install(folder.name, declared.kit, str(folder), declared.support_modules)
