"""Lectures 6, 7 and 9 judge what they measured: repeats or seeds behind every verdict, open loops long enough to
show a queue, and the batcher a cell the lecture runs.

These read the notebooks' cells (no execution): the parameters in both profiles, the calls that take the
measurements, and the verdict helpers written in cells, run here on made-up records whose answer is known.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import nbformat
import numpy as np
import pytest

LECTURES = Path(__file__).resolve().parents[1] / "lectures"
WEB = LECTURES / "06-web-services" / "06-web-services.ipynb"
FORMATS = LECTURES / "07-deploying-software" / "07-formats-runtimes-batching.ipynb"
TRACKING = LECTURES / "09-experiment-tracking" / "09-experiment-tracking.ipynb"


def code_cells(path: Path) -> list[str]:
    """The notebook's Python cells (a cell magic such as %%writefile writes a file, not code the kernel runs)."""
    return [cell.source for cell in nbformat.read(path, as_version=4).cells
            if cell.cell_type == "code" and not cell.source.startswith("%%")]


def parameters(path: Path, quick: bool) -> dict:
    """The parameters cell's values, with the `if quick:` block of the setup cell applied when ``quick``."""
    cells = code_cells(path)
    values: dict = {}
    exec(cells[0], values)  # noqa: S102 - the notebook's own parameters cell
    values["quick"] = quick
    for cell in cells[1:3]:
        for node in ast.parse(cell).body:
            if isinstance(node, ast.If) and ast.unparse(node.test) == "quick":
                exec(ast.unparse(node), values)  # noqa: S102
    return values


def cell_function(path: Path, name: str):
    """A function defined in one of the notebook's cells, compiled on its own (numpy as np in its globals)."""
    for cell in code_cells(path):
        for node in ast.parse(cell).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found = {"np": np}
                exec(ast.unparse(node), found)  # noqa: S102
                return found[name]
    raise LookupError(f"{path.name} defines no function {name}")


def calls(path: Path, function: str) -> list[ast.Call]:
    return [node for cell in code_cells(path) for node in ast.walk(ast.parse(cell))
            if isinstance(node, ast.Call) and ast.unparse(node.func) == function]


def keyword(call: ast.Call, name: str) -> str | None:
    return next((ast.unparse(k.value) for k in call.keywords if k.arg == name), None)


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_every_verdict_has_three_runs_or_seeds_in_both_profiles(quick):
    assert parameters(WEB, quick)["repeats"] >= 3
    assert parameters(FORMATS, quick)["repeats"] >= 3
    assert len(parameters(TRACKING, quick)["seeds"]) >= 3


def test_lecture_6_repeats_its_sweep_and_servers_and_runs_its_open_loop_by_time():
    (sweep,) = calls(WEB, "load_test")
    (servers,) = calls(WEB, "compare_servers")
    assert keyword(sweep, "repeats") == keyword(servers, "repeats") == "repeats"
    (opened,) = calls(WEB, "open_loop_test")
    assert keyword(opened, "max_requests") == "None" and keyword(opened, "max_seconds") == "open_loop_seconds"
    for quick in (False, True):  # long enough for a queue 1.3x past capacity to outgrow the closed loop's clients
        assert parameters(WEB, quick)["open_loop_seconds"] >= 1.5


def record(due: float, latency: float):
    return SimpleNamespace(scheduled=due, finished=due + latency, latency=latency, error="")


def test_lecture_6_tells_a_growing_queue_from_a_steady_one():
    over_the_run = cell_function(WEB, "over_the_run")
    due = np.linspace(0.0, 5.0, 1001)
    steady = SimpleNamespace(records=[record(t, 0.01) for t in due])
    growing = SimpleNamespace(records=[record(t, 0.3 * t) for t in due])  # each second of sending adds 0.3 s of queue
    quarters, waiting = over_the_run(steady)
    assert max(quarters) == pytest.approx(0.01) and waiting <= 3
    quarters, waiting = over_the_run(growing)
    assert quarters[-1] > 2 * quarters[0] and waiting > 16


def test_lecture_7_runs_its_batcher_from_a_cell_and_repeats_its_comparisons():
    sources = "\n".join(code_cells(FORMATS))
    assert "inspect.getsource" not in sources and "class DynamicBatcher" in sources
    tree = ast.parse(code_cells(FORMATS)[1])  # the imports cell
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert "DynamicBatcher" not in imported, "the lecture must run the batcher its cell defines"
    for function in ("batching_tradeoff", "kit_vs_ray_serve"):
        (call,) = calls(FORMATS, function)
        assert keyword(call, "repeats") == "repeats", function


def test_lecture_7_counts_a_latency_gap_only_past_both_readings_spread():
    compared = cell_function(FORMATS, "compared")
    one, two = SimpleNamespace(latency=1.0, iqr=0.1), SimpleNamespace(latency=0.85, iqr=0.1)
    assert compared(one, two).startswith("no different")
    assert compared(one, SimpleNamespace(latency=0.5, iqr=0.1)) == "faster, 2.00x"
    assert compared(one, SimpleNamespace(latency=300.0, iqr=0.1)) == "slower, 300.00x the time"


def test_lecture_9_selects_over_seeds_and_says_when_it_is_a_tie():
    sources = "\n".join(code_cells(TRACKING))
    assert "for seed in seeds" in sources and "val_accuracy_min" in sources and "val_accuracy_max" in sources
    assert "A tie" in sources and "A clear lead" in sources


def test_lecture_7_judges_the_batching_setting_it_chose_before_the_run_and_times_each_runtime_once():
    sources = "\n".join(code_cells(FORMATS))
    assert "max(tradeoff.rows" not in sources and "judged = tradeoff.rows[1]" in sources  # no best-of-several picked afterwards
    assert "statistics.quantiles" not in sources and "session.run(None, feed)" in sources  # the by-hand call reads the table's timings
    (latency_call,) = calls(FORMATS, "runtime_latency")
    assert len(calls(FORMATS, "timeit")) == 1  # only the GPU branch of cost_of_one_call times the model again


def test_lecture_7_judges_no_latency_gap_without_enough_blocks_for_a_spread():
    compared = cell_function(FORMATS, "compared")
    one_block = SimpleNamespace(latency=0.5, iqr=0.0, blocks=1)  # a single block: an IQR of 0 that says nothing
    assert compared(SimpleNamespace(latency=1.0, iqr=0.1, blocks=10), one_block).startswith("not judged")
    assert compared(SimpleNamespace(latency=1.0, iqr=0.1, blocks=10), SimpleNamespace(latency=0.5, iqr=0.1, blocks=10)) == "faster, 2.00x"
