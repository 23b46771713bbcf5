"""Lecture 5c judges its timings by their spread: a compiled kernel, or an optimizer, counts as faster or slower only
when its readings clear the other's, and the summary reads the same verdicts as the cells above it.

These read the notebook's cells (no execution) and run its verdict helpers on made-up timings whose answer is known.
"""
from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import nbformat

from helpers.core import format_seconds

NOTEBOOK = Path(__file__).resolve().parents[1] / "lectures" / "05-profiling-efficient-training" / "05c-arithmetic-fusion-and-compile.ipynb"


def code_cells() -> list[str]:
    return [cell.source for cell in nbformat.read(NOTEBOOK, as_version=4).cells if cell.cell_type == "code"]


def cell_function(name: str):
    for cell in code_cells():
        for node in ast.parse(cell).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                found = {"format_seconds": format_seconds}
                exec(ast.unparse(node), found)  # noqa: S102 - the notebook's own helper
                return found[name]
    raise LookupError(f"{NOTEBOOK.name} defines no function {name}")


def test_fusion_follows_the_rounds_not_the_medians():
    fusion_verdict = cell_function("fusion_verdict")
    overlapping = {"eager": 1.0, "compiled": 1.3, "eager range": (0.9, 1.4), "compiled range": (1.1, 1.6), "outcome": "a tie"}
    assert "tie" in fusion_verdict(overlapping) and "SLOWER" not in fusion_verdict(overlapping)  # a 1.3x gap, yet overlapping rounds
    apart = {"eager": 2.0, "compiled": 1.0, "eager range": (1.9, 2.1), "compiled range": (0.9, 1.1), "outcome": "faster"}
    assert fusion_verdict(apart).startswith("compiled ran 2.00x faster")


def test_an_optimizer_counts_as_faster_only_past_the_other_ones_fastest():
    verdict_by_rounds = cell_function("verdict_by_rounds")
    loop = SimpleNamespace(fastest=3.9e-3, median=4.5e-3)
    assert "tie" in verdict_by_rounds("foreach", SimpleNamespace(fastest=3.6e-3, median=4.2e-3), "the loop", loop)
    assert "faster" in verdict_by_rounds("fused", SimpleNamespace(fastest=1.0e-3, median=1.1e-3), "the loop", loop)
    assert "SLOWER" in verdict_by_rounds("foreach", SimpleNamespace(fastest=5.0e-3, median=5.5e-3), "the loop", loop)


def test_the_summary_reads_the_cells_verdicts():
    summary = next(cell for cell in code_cells() if cell.startswith('print(f"Measured here'))
    assert "fusion_verdict(" in summary and "optimizer_verdicts" in summary
    assert "verdict(\"compiled\"" not in summary and "above the weights" in summary
