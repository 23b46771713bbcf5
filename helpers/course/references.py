"""The instructors' files that later tasks' tests use, so that a broken task costs only its own points.

An assignment's ``assignment.toml`` may declare, per notebook, the cells of the source notebook (setup cells and the
instructors' solutions) that make such files, and the code that writes them into the folder ``REFERENCES``::

    [references."part2_export_and_optimise.ipynb"]
    cells = ["setup_part2", "task1_export", "task2_quantize"]
    make = "export_end_to_end(served_model(), REFERENCES / 'model.onnx')"

Before grading, the grader makes them once (``make``), in a process of their own that no submission's code runs in,
in a copy of the released support files; every sandbox then sees the folder read-only, named by ``REFERENCES_ENV``.
A test cell asks for a file with ``instructors_file(name)``: the instructors' file when graded, None in the student's
own run (whose tests then use the student's own file). What such a file holds is readable by the submission while it
is graded, so a test that uses it must not be passable by copying it (grade the earlier task on inputs no reference
file answers, e.g. another model).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REFERENCES_ENV = "EDL_GRADING_REFERENCES"  # the folder of the instructors' files, set by the grader's sandbox
SANDBOX_REFERENCES = "/grading/references"  # where the sandbox binds it, read-only
TIMEOUT_S = 600


class ReferenceError(RuntimeError):
    """The instructors' files could not be made: the grader's fault, never a student's."""


def instructors_file(name: str) -> Path | None:
    """The instructors' file ``name`` when this notebook is graded (a broken earlier task then costs nothing here), else None.

    The sandbox's read-only folder comes first: a submission can change its environment, not that mount.
    """
    for folder in (SANDBOX_REFERENCES, os.environ.get(REFERENCES_ENV)):
        if folder and (Path(folder) / name).exists():
            return Path(folder) / name
    return None


def declared(data: dict, where: str) -> dict[str, tuple[tuple[str, ...], str]]:
    """{notebook file name: (cell grade ids, make code)} from an assignment.toml's ``references`` table, checked."""
    table = data.get("references", {})
    found = {}
    for notebook, entry in (table.items() if isinstance(table, dict) else [("", table)]):
        cells, make = (entry.get("cells"), entry.get("make")) if isinstance(entry, dict) else (None, None)
        if not (notebook.endswith(".ipynb") and isinstance(cells, list) and all(isinstance(c, str) for c in cells) and isinstance(make, str)):
            raise ValueError(f"{where}: references must map a notebook file name to {{cells = [grade ids], make = \"code\"}}, "
                             f"e.g. [references.\"part2.ipynb\"] cells = [\"setup\", \"task1\"] make = \"f(REFERENCES / 'x')\"")
        found[notebook] = (tuple(cells), make)
    return found


def make(source: Path, release: Path, wanted: dict[str, tuple[tuple[str, ...], str]], out: Path, digest=None) -> Path:
    """Run each notebook's declared cells of ``source`` and its ``make`` code, writing into ``out``; returns ``out``.

    Runs in a child process whose working folder holds the released support files (so the cells import them as students
    do), readable by the sandboxes' users afterwards. ``digest`` (a hashlib object), when given, is updated with the
    code run, on which grades then depend. Raises ReferenceError with the child's last lines on a failure.
    """
    from helpers.course import assignments

    out.mkdir(parents=True, exist_ok=True)
    for notebook, (cell_ids, code) in wanted.items():
        nb = assignments.read(source / notebook)
        by_id = {assignments.grade_id(c): c.source for c in nb.cells if c.cell_type == "code" and assignments.grade_id(c)}
        missing = [c for c in cell_ids if c not in by_id]
        if missing:
            raise ReferenceError(f"{source / notebook} has no cell {', '.join(missing)} (assignment.toml's references name it)")
        with tempfile.TemporaryDirectory(prefix="edl-references-") as work:
            for path in release.iterdir():
                if path.is_file() and path.suffix != ".ipynb":
                    shutil.copy(path, work)
            job = {"cells": [[c, by_id[c]] for c in cell_ids] + [["make", code]], "out": str(out.resolve())}
            if digest is not None:
                digest.update(json.dumps([notebook, job["cells"]]).encode())
            kit = str(Path(__file__).resolve().parents[2])
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (kit, os.environ.get("PYTHONPATH")) if p)}
            try:
                done = subprocess.run([sys.executable, "-c", "from helpers.course.references import _run; _run()"], input=json.dumps(job),
                                      capture_output=True, text=True, cwd=work, env=env, timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired as err:
                raise ReferenceError(f"making the references of {notebook} took over {TIMEOUT_S} s") from err
            if done.returncode != 0:
                tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
                raise ReferenceError(f"making the references of {notebook} failed (exit status {done.returncode}):\n{tail}")
    for path in [out, *out.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    return out


def _run() -> None:
    """In the child: run the job's cells in one namespace, each under a file name ``inspect`` can read back."""
    import linecache

    job = json.loads(sys.stdin.read())
    sys.path.insert(0, os.getcwd())
    namespace = {"__name__": "__main__", "REFERENCES": Path(job["out"])}
    for label, source in job["cells"]:
        filename = f"<reference cell {label}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - the instructors' own cells, from the source notebook
