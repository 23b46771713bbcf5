"""Run notebooks headlessly with papermill, export them to HTML, and keep the stored copies clean.

Used by ``make lectures`` and by the tests, so both run notebooks the same way:

    python -m helpers.course.notebooks run lectures --out build/lectures [-p quick=True]
    python -m helpers.course.notebooks strip lectures assignments/source
"""
from __future__ import annotations

import argparse
import ast
import atexit
import functools
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import nbformat
from jupyter_client.manager import KernelManager
from traitlets import default

from helpers.core.report import Report, column

CELL_TIMEOUT_S = 600
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def find_notebooks(*roots: str | Path) -> list[Path]:
    """Every .ipynb under ``roots`` (files are taken as given), sorted, without checkpoint copies."""
    found: list[Path] = []
    for root in map(Path, roots):
        candidates = [root] if root.is_file() else root.rglob("*.ipynb")
        found += [p for p in candidates if ".ipynb_checkpoints" not in p.parts]
    return sorted(found)


@dataclass
class NotebookRun:
    notebook: str = column("notebook")
    status: str = column("status")
    seconds: float = column("seconds", ".1f")
    error: str | None
    output: Path
    html: Path | None
    figures: dict | None = None  # the notebook's ``lesson_figures`` after its run (see LESSON_FIGURES), None if it defines none


# The convention that lets tests check what a lecture measured without reading its prose: a lecture's last code
# cell defines ``lesson_figures = {"name": value, ...}`` from the variables it measured (numbers, strings, lists).
# The runner adds one cell after it that hands the dict back as JSON, reads it, and removes that cell again.
LESSON_FIGURES = "lesson_figures"
_FIGURES_MIME = "application/vnd.edl-kit.lesson-figures+json"
_FIGURES_TAG = "edl-lesson-figures"
_FIGURES_SOURCE = f"""\
# added by helpers.course.notebooks: hands back the lecture's {LESSON_FIGURES} (removed from the executed copy)
if "{LESSON_FIGURES}" in globals():
    import json as _json
    from IPython.display import display as _display
    _display({{"{_FIGURES_MIME}": _json.loads(_json.dumps({LESSON_FIGURES}, default=lambda v: float(v) if hasattr(v, "__float__") else str(v)))}}, raw=True)
"""


def _with_figures_cell(path: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
    cell = nbformat.v4.new_code_cell(_FIGURES_SOURCE, metadata={"tags": [_FIGURES_TAG]})
    cell.id = "edl-lesson-figures"
    nb.cells.append(cell)
    return nb


def take_figures(output: Path, source: Path) -> dict | None:
    """The ``lesson_figures`` the executed notebook at ``output`` handed back; the runner's cell is removed from it
    (and papermill's record of the input becomes the ``source`` path it was read from)."""
    nb = nbformat.read(output, as_version=4)
    if isinstance(nb.metadata.get("papermill", {}).get("input_path"), dict):
        nb.metadata.papermill.input_path = str(source)
    ours = [c for c in nb.cells if _FIGURES_TAG in c.get("metadata", {}).get("tags", [])]
    if not ours:
        return None
    figures = next((o["data"][_FIGURES_MIME] for o in ours[0].get("outputs", []) if _FIGURES_MIME in o.get("data", {})), None)
    nb.cells = [c for c in nb.cells if c not in ours]
    nbformat.write(nb, output)
    return figures


class RunReport(Report):
    """One row per executed notebook: its status and how long it took."""

    title = "Notebook runs"

    @property
    def failed(self) -> list[NotebookRun]:
        return [r for r in self.rows if r.status != "ok"]


def describe_failure(err: BaseException) -> str:
    """A readable account of a failed execution: which cell, its source, and the error."""
    from papermill.exceptions import PapermillExecutionError

    if isinstance(err, PapermillExecutionError):
        trace = _ANSI.sub("", "\n".join(err.traceback))
        return (
            f"cell {err.cell_index} (execution count {err.exec_count}) raised {err.ename}: {err.evalue}\n"
            f"--- cell source ---\n{err.source}\n--- traceback ---\n{trace}"
        )
    return f"{type(err).__name__}: {err}"


@functools.cache
def _socket_folder() -> str:
    """One private folder per process for the kernels' Unix sockets, removed when the process ends."""
    folder = tempfile.mkdtemp(prefix="edl-kernels-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


class LocalKernelManager(KernelManager):
    """A kernel reached through Unix-domain sockets (ZeroMQ's ipc transport) instead of localhost TCP.

    The kernel and the runner share this machine, so nothing needs a network port, and the
    kernel does not warn on every start that its TCP traffic is unencrypted.
    """

    @default("transport")
    def _local_transport(self):
        return "ipc" if sys.platform != "win32" else "tcp"

    @default("ip")
    def _socket_prefix(self):
        # jupyter_client puts ipc sockets in the working directory (the notebook's folder) unless told otherwise;
        # a kernel that dies leaves them there, where they break copies of the folder. They go to /tmp instead.
        if self.transport != "ipc":
            return super()._ip_default()
        return os.path.join(_socket_folder(), "kernel")

    async def _async_interrupt_kernel(self) -> None:
        # jupyter_client interrupts a kernel (SIGINT) before asking it to shut down; one still finishing its last
        # message then logs "KeyboardInterrupt caught in kernel." in the middle of `make lectures`' table. A finished
        # notebook's kernel has nothing to interrupt: the shutdown request alone ends it (and a hung one is killed).
        if self.shutting_down:
            return
        await super()._async_interrupt_kernel()


def execute_notebook(
    path: str | Path,
    output_dir: str | Path,
    parameters: dict[str, Any] | None = None,
    root: str | Path | None = None,
    html: bool = True,
    cell_timeout: int = CELL_TIMEOUT_S,
) -> NotebookRun:
    """Execute ``path`` with papermill into ``output_dir`` (mirroring its place under ``root``).

    The notebook runs in its own folder, so relative paths in it behave as in
    JupyterLab. Failures are caught and described, never raised.
    """
    import papermill

    path = Path(path).resolve()
    root = Path(root).resolve() if root else path.parent
    relative = path.relative_to(root)
    output = Path(output_dir).resolve() / relative
    output.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    error = None
    try:
        papermill.execute_notebook(
            _with_figures_cell(path),
            str(output),
            parameters=parameters or {},
            cwd=str(path.parent),
            progress_bar=False,
            execution_timeout=cell_timeout,
            kernel_manager_class=LocalKernelManager,
        )
    except Exception as err:  # noqa: BLE001 - every failure becomes a row, never a crash
        error = describe_failure(err)
    seconds = time.perf_counter() - start
    figures = take_figures(output, path) if output.exists() else None
    html_path = export_html(output) if html and output.exists() else None
    return NotebookRun(str(relative), "ok" if error is None else "failed", seconds, error, output, html_path, figures)


# nbconvert's lab template less every script it would fetch from a CDN: an exported lecture reads offline.
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
"""


def export_html(notebook: Path) -> Path:
    """Write ``notebook`` as a standalone HTML page beside it, readable offline: widgets frozen to what they showed.

    Images are embedded; no widget renderer is loaded (see helpers.course.static_widgets), and nothing
    comes from the network: nbconvert's lab template without its CDN scripts (require.js, MathJax,
    Mermaid; the lectures typeset no formulas, so none shows as raw LaTeX).
    """
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    from helpers.course.static_widgets import freeze_widgets

    nb = nbformat.read(notebook, as_version=4)
    freeze_widgets(nb)
    exporter = HTMLExporter(extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})], template_file="offline.html.j2")
    body, _ = exporter.from_notebook_node(nb)
    target = notebook.with_suffix(".html")
    target.write_text(body, encoding="utf-8")
    return target


def run_all(roots: Sequence[str | Path], output_dir: str | Path, parameters: dict[str, Any] | None = None) -> RunReport:
    """Execute every notebook under ``roots``, printing a line per notebook as it finishes."""
    runs = []
    for root in roots:
        base = Path(root) if Path(root).is_dir() else Path(root).parent
        for notebook in find_notebooks(root):
            run = execute_notebook(notebook, output_dir, parameters, root=base)
            print(f"{run.status:>6}  {run.seconds:7.1f} s  {run.notebook}", flush=True)
            runs.append(run)
    return RunReport(runs)


# What the kit's kernel (ipykernel, "python3") reports about itself, less the Python version, which differs
# between machines: stored notebooks carry exactly this, and `make lab` adds the running version when it
# opens one, so that JupyterLab finds nothing to update and the notebook opens unmodified.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {
    "codemirror_mode": {"name": "ipython", "version": 3},
    "file_extension": ".py",
    "mimetype": "text/x-python",
    "name": "python",
    "nbconvert_exporter": "python",
    "pygments_lexer": "ipython3",
}


def clean(nb) -> None:
    """Remove outputs, execution counts and run metadata from a notebook (a NotebookNode or its JSON dict), in place.

    The kernel's metadata is set to the kit's stored form (``KERNELSPEC``, ``LANGUAGE_INFO``: no Python version).
    """
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
        cell.get("metadata", {}).pop("execution", None)
        cell.get("metadata", {}).pop("papermill", None)
    for key in ("papermill", "widgets"):
        nb["metadata"].pop(key, None)
    nb["metadata"]["kernelspec"] = dict(KERNELSPEC)
    nb["metadata"]["language_info"] = {**LANGUAGE_INFO, "codemirror_mode": dict(LANGUAGE_INFO["codemirror_mode"])}


def stored_form(nb) -> str:
    """The text a notebook is stored as: nbformat's own serialisation (what JupyterLab saves), ending in a newline."""
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def is_clean(path: str | Path) -> bool:
    """True when the stored notebook is, byte for byte, what ``make strip`` would write (and JupyterLab would save)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    clean(nb)
    return path.read_text(encoding="utf-8") == stored_form(nb)


def strip_outputs(path: str | Path) -> bool:
    """Remove outputs, execution counts and run metadata from a stored notebook, in its stored form; True if it changed."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    nb = nbformat.reads(text, as_version=4)
    clean(nb)
    after = stored_form(nb)
    if after != text:
        path.write_text(after, encoding="utf-8")
    return after != text


def has_outputs(path: str | Path) -> bool:
    """True when any code cell of the stored notebook keeps outputs or an execution count."""
    nb = nbformat.read(Path(path), as_version=4)
    return any(c.cell_type == "code" and (c.outputs or c.execution_count is not None) for c in nb.cells)


def parse_parameters(pairs: Iterable[str]) -> dict[str, Any]:
    """['quick=True', 'device=cpu'] -> {'quick': True, 'device': 'cpu'} (values as Python literals when they parse)."""
    parameters = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.isidentifier():
            raise SystemExit(f"-p expects NAME=VALUE (e.g. -p quick=True), got {pair!r}")
        try:
            parameters[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parameters[key] = value
    return parameters


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m helpers.course.notebooks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="execute notebooks and export HTML")
    run.add_argument("roots", nargs="+", help="folders or notebooks")
    run.add_argument("--out", default="build/notebooks", help="where executed notebooks and HTML go")
    run.add_argument("-p", "--parameter", action="append", default=[], help="NAME=VALUE injected into the parameters cell")
    strip = commands.add_parser("strip", help="remove outputs from stored notebooks")
    strip.add_argument("roots", nargs="+")
    args = parser.parse_args(argv)

    if args.command == "strip":
        changed = [p for p in find_notebooks(*args.roots) if strip_outputs(p)]
        print("\n".join(f"stripped {p}" for p in changed) or "all notebooks already clean")
        return 0
    parameters = parse_parameters(args.parameter)
    try:
        check_device_knobs(parameters)
    except ValueError as err:
        print(f"nothing was run: {err}", file=sys.stderr)
        return 2
    if not any(find_notebooks(root) for root in args.roots):
        print(f"no notebooks found under {', '.join(args.roots)}", file=sys.stderr)
        return 1
    out = Path(args.out)
    staging = out.with_name(out.name + ".running")
    shutil.rmtree(staging, ignore_errors=True)
    report = run_all(args.roots, staging, parameters)
    print()
    print(report)
    if report.failed:
        failed = out.with_name(out.name + ".failed")
        shutil.rmtree(failed, ignore_errors=True)
        staging.rename(failed)
        for failure in report.failed:
            print(f"\nFAILED {failure.notebook}: {failure.error}", file=sys.stderr)
        kept = f"the last good build in {out.resolve()} is untouched; " if out.exists() else ""
        print(f"\n{kept}this run's notebooks and HTML: {failed.resolve()}", file=sys.stderr)
        return 1
    shutil.rmtree(out, ignore_errors=True)
    staging.rename(out)
    print(f"\nexecuted notebooks and HTML: {out.resolve()}")
    return 0


def check_device_knobs(parameters: dict[str, Any]) -> None:
    """Validate the device asked for, once and before any notebook runs, naming the knob that holds it."""
    from helpers.core.device import ENV_VAR, normalise_device_name

    if parameters.get("device") is not None:
        parameters["device"] = normalise_device_name(parameters["device"], "DEVICE= (make lectures) or -p device=")
    if os.environ.get(ENV_VAR):
        normalise_device_name(os.environ[ENV_VAR], f"the environment variable {ENV_VAR}")


if __name__ == "__main__":
    sys.exit(main())
