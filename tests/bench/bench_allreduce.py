"""Lecture 3's hand-written all-reduce (recursive doubling from send/recv) against dist.all_reduce: world sizes 2-4, 1 KiB to 64 MiB.

The all-reduce is taken from the lecture's own cell (the notebook is its only source), so the bench times what
the lecture runs.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import nbformat

from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.distributed.experiments import KIB, MIB, all_reduce_sweep, calibrate_link, traffic_check

from . import BenchResult, Target

LECTURE = Path(__file__).resolve().parents[2] / "lectures" / "03-data-parallel" / "03-data-parallel-training.ipynb"
MINE, TORCH = "butterfly", "dist.all_reduce"


def lecture_function(name: str, notebook: Path = LECTURE):
    """The function ``name`` as the lecture's cell defines it (the cell's imports come from the notebook's first import cell)."""
    cells = [c.source for c in nbformat.read(notebook, as_version=4).cells if c.cell_type == "code"]
    for source in cells:
        tree = ast.parse(source)
        found = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == name]
        if found:
            namespace = {"__name__": "lecture_cells"}
            exec("import torch\nimport torch.distributed as dist\n" + ast.unparse(found[0]), namespace)
            return namespace[name]
    raise LookupError(f"{notebook.name} defines no function {name!r}")


@dataclass
class RatioRow:
    world_size: int = column("N")
    message_bytes: int = column("message", format_bytes)
    mine_seconds: float = column("butterfly", format_seconds)
    torch_seconds: float = column("dist.all_reduce", format_seconds)
    ratio: float = column("butterfly / all_reduce", ".2f")


class MineVsTorch(Report):
    title = "Recursive-doubling all-reduce (send/recv, Lecture 3) vs dist.all_reduce"


def run(quick: bool) -> BenchResult:
    world_sizes = (2,) if quick else (2, 3, 4)
    sizes = (KIB, 64 * KIB) if quick else (KIB, 16 * KIB, 256 * KIB, 4 * MIB, 64 * MIB)
    link = calibrate_link(sizes_bytes=(4, 64 * KIB, MIB) if quick else (4, 4 * KIB, 64 * KIB, MIB, 8 * MIB), repeats=5 if quick else 10)
    butterfly = lecture_function("butterfly_all_reduce")
    sweep = all_reduce_sweep({MINE: butterfly}, world_sizes, sizes, repeats=2 if quick else 5, link=link.link)
    rows = []
    for world in world_sizes:
        for size in sizes:
            mine, torch_ = sweep.find(implementation=MINE, world_size=world, message_bytes=size).seconds, sweep.find(implementation=TORCH, world_size=world, message_bytes=size).seconds
            rows.append(RatioRow(world, size, mine, torch_, mine / torch_))
    ratios = MineVsTorch(rows, ["Both timed as the slowest rank's median over repeats, after a warm-up; gloo on this machine's CPU cores."])
    traffic = traffic_check({MINE: butterfly}, world_sizes=(2, 3) if quick else (2, 3, 4), numel=1001)
    correct = all(r.correct for r in traffic.rows)
    largest = max(r.message_bytes for r in rows)
    at_two = next(r for r in rows if r.world_size == 2 and r.message_bytes == largest)
    targets = [
        Target.at_least("the lecture's all-reduce equals dist.all_reduce (1 = all N)", float(correct), 1.0),
    ]
    timing = f"butterfly / dist.all_reduce time, N = 2, {format_bytes(largest)}"
    targets.append(Target.not_here(timing, "<= 3x", "quick run: too few repeats to judge") if quick else Target.at_most(timing, at_two.ratio, 3.0, "x"))
    return BenchResult("allreduce", [ratios, sweep, link, traffic], targets)
