"""A cycle-by-cycle systolic-array matmul (weight-, input- and output-stationary), checked against torch.matmul.

In the weight-stationary array a TPU uses, processing element (k, n) holds
weight W[k, n]. Row m of the inputs enters row k of the array skewed by k
cycles and moves one PE to the right per cycle; partial sums move one PE down
per cycle, and C[m, n] leaves the bottom of column n. Every cycle, each PE does
at most one multiply-accumulate. Counting the cycles and the busy PEs gives the
latency and utilisation that the closed-form formulas predict.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from matplotlib.ticker import MaxNLocator

from helpers.core import plots
from helpers.core.device import Fact
from helpers.core.report import Report, column

DATAFLOWS = ("weight", "input", "output")
STATIONARY = {"weight": "weights W[k, n]", "input": "inputs A[m, k]", "output": "outputs C[m, n]"}
IDLE = -1  # marks a PE that does no useful work in a cycle


@dataclass
class Pass:
    """One pass of a tile of the problem through the array: its product and who worked when."""

    product: torch.Tensor
    busy: list[int]  # busy PEs in each cycle
    grids: list[torch.Tensor]  # per cycle, the output row (m) or reduction step (k) each PE works on, or IDLE


def weight_stationary_pass(inputs: torch.Tensor, weights: torch.Tensor) -> Pass:
    """Stream ``inputs`` (M x K) through a K x N array holding ``weights`` (K x N); returns inputs @ weights.

    Registers: ``a`` (the input value each PE passes right), ``psum`` (the partial
    sum it passes down) and ``row`` (which input row m that work belongs to).
    """
    (m_rows, k_dim), n_dim = inputs.shape, weights.shape[1]
    a = torch.zeros(k_dim, n_dim, dtype=inputs.dtype)
    psum = torch.zeros_like(a)
    row = torch.full((k_dim, n_dim), IDLE)
    product = torch.zeros(m_rows, n_dim, dtype=inputs.dtype)
    busy, grids = [], []
    ks = torch.arange(k_dim)
    for cycle in range(m_rows + k_dim + n_dim - 2 + 1):  # one spare cycle: the simulation must find the array empty
        entering = cycle - ks  # array row k receives input row (cycle - k): the skew
        valid = (entering >= 0) & (entering < m_rows)
        new_a = torch.cat([torch.where(valid, inputs[entering.clamp(0, m_rows - 1), ks], 0).unsqueeze(1), a[:, :-1]], 1)
        new_row = torch.cat([torch.where(valid, entering, IDLE).unsqueeze(1), row[:, :-1]], 1)
        from_above = torch.cat([torch.zeros(1, n_dim, dtype=inputs.dtype), psum[:-1]], 0)
        above_row = torch.cat([new_row[:1], row[:-1]], 0)
        active = new_row != IDLE
        assert torch.equal(above_row[active], new_row[active]), "a partial sum met an input of another row"
        psum = from_above + new_a * weights
        a, row = new_a, new_row
        leaving = row[-1] != IDLE  # finished sums leave the bottom row
        product[row[-1][leaving], leaving.nonzero().flatten()] = psum[-1][leaving]
        busy.append(int(active.sum()))
        grids.append(row.clone())
    _trim_idle_tail(busy, grids)
    return Pass(product, busy, grids)


def output_stationary_pass(inputs: torch.Tensor, weights: torch.Tensor) -> Pass:
    """An M x N array in which PE (m, n) accumulates C[m, n]: row m of ``inputs`` flows right, column n of ``weights`` down.

    Both streams are skewed so that A[m, k] and W[k, n] meet in PE (m, n) at cycle m + n + k.
    """
    (m_rows, k_dim), n_dim = inputs.shape, weights.shape[1]
    a = torch.zeros(m_rows, n_dim, dtype=inputs.dtype)
    w = torch.zeros_like(a)
    step = torch.full((m_rows, n_dim), IDLE)  # the reduction index k each PE works on
    acc = torch.zeros_like(a)
    ms, ns = torch.arange(m_rows), torch.arange(n_dim)
    busy, grids = [], []
    for cycle in range(m_rows + k_dim + n_dim - 2 + 1):
        k_left, k_top = cycle - ms, cycle - ns  # the k entering row m from the left and column n from the top
        left_ok, top_ok = (k_left >= 0) & (k_left < k_dim), (k_top >= 0) & (k_top < k_dim)
        a = torch.cat([torch.where(left_ok, inputs[ms, k_left.clamp(0, k_dim - 1)], 0).unsqueeze(1), a[:, :-1]], 1)
        w = torch.cat([torch.where(top_ok, weights[k_top.clamp(0, k_dim - 1), ns], 0).unsqueeze(0), w[:-1]], 0)
        step = torch.cat([torch.where(left_ok, k_left, IDLE).unsqueeze(1), step[:, :-1]], 1)
        acc += a * w
        busy.append(int((step != IDLE).sum()))
        grids.append(step.clone())
    _trim_idle_tail(busy, grids)
    return Pass(acc, busy, grids)


def _trim_idle_tail(busy: list[int], grids: list[torch.Tensor]) -> None:
    """Drop the cycles after the last busy one (the spare cycle that proves the array drained)."""
    while busy and busy[-1] == 0:
        busy.pop()
        grids.pop()


def pass_cycles(stream: int, rows: int, cols: int) -> int:
    """Cycles for one pass: the first operand row needs rows + cols - 1 cycles to cross the skewed array, and
    each of the other ``stream - 1`` rows finishes one cycle later."""
    return stream + rows + cols - 2


# ---------------------------------------------------------------- tiling and the report


def _tiles(size: int, tile: int) -> list[slice]:
    return [slice(start, min(start + tile, size)) for start in range(0, size, tile)]


class SystolicRun(Report):
    """One matmul on a simulated systolic array: its cycles and utilisation, simulated and by formula."""

    def __init__(self, *, dataflow: str, shape: tuple[int, int, int], array: tuple[int, int], result: torch.Tensor, expected: torch.Tensor, passes: list[Pass], formula_cycles: int):
        m, k, n = shape
        self.dataflow, self.shape, self.array = dataflow, shape, array
        self.result = result
        self.max_abs_error = float((result - expected).abs().max())
        self.matches = bool(torch.allclose(result, expected, rtol=1e-9, atol=1e-9))
        self.busy_per_cycle = [b for p in passes for b in p.busy]
        self.grids = [g for p in passes for g in p.grids]
        self.passes = len(passes)
        self.pes = array[0] * array[1]
        self.macs = m * k * n
        self.cycles = len(self.busy_per_cycle)
        self.formula_cycles = formula_cycles
        self.utilisation = sum(self.busy_per_cycle) / (self.pes * self.cycles)
        self.formula_utilisation = self.macs / (self.pes * formula_cycles)
        self.per_cycle_utilisation = [b / self.pes for b in self.busy_per_cycle]
        self.title = f"{dataflow}-stationary systolic array, {array[0]} x {array[1]} PEs: ({m} x {k}) @ ({k} x {n})"
        rows = [
            Fact("stationary in the PEs", STATIONARY[dataflow]),
            Fact("passes through the array (tiles)", f"{self.passes}"),
            Fact("multiply-accumulates", f"{self.macs:,} (busy PE-cycles: {sum(self.busy_per_cycle):,})"),
            Fact("cycles, simulated", f"{self.cycles:,}"),
            Fact("cycles, formula", f"{formula_cycles:,}"),
            Fact("utilisation, simulated", f"{100 * self.utilisation:.1f}%"),
            Fact("utilisation, formula", f"{100 * self.formula_utilisation:.1f}%"),
            Fact("max |error| vs torch.matmul", f"{self.max_abs_error:.2e}"),
        ]
        notes = [
            "Formula per pass: cycles = S + R + C - 2 for S operand rows streamed through an R x C array (the skew fills and "
            "drains it); utilisation = MACs / (PEs x cycles). Loading the stationary operand (R cycles a pass) and reading out "
            "results are not counted: TPUs double-buffer them behind the previous pass."
        ]
        super().__init__(rows, notes)

    def busiest_cycle(self) -> int:
        return max(range(self.cycles), key=lambda c: self.busy_per_cycle[c])

    def plot(self, ax=None, cycle: int | None = None):
        """Two panels: utilisation per cycle, and which piece of work each PE holds at ``cycle`` (default: the busiest)."""
        if ax is None:
            import matplotlib.pyplot as plt

            _, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
        else:
            left, right = ax
        cycle = self.busiest_cycle() if cycle is None else cycle
        steps = list(range(1, self.cycles + 1))
        plots.line_chart({"busy PEs": (steps, [100 * u for u in self.per_cycle_utilisation])}, left, title="PE utilisation per cycle", xlabel="cycle", ylabel="% of PEs busy")
        left.lines[0].set_marker("")
        left.xaxis.set_major_locator(MaxNLocator(integer=True))
        plots.horizontal_line(left, 100 * self.utilisation, f"mean {100 * self.utilisation:.0f}%")
        left.axvline(cycle + 1, color="grey", linewidth=0.8, linestyle=":")
        left.set_ylim(0, 105)
        label = "output row m" if self.dataflow != "output" else "reduction step k"
        plots.grid_heatmap(self.grids[cycle], right, title=f"cycle {cycle + 1}: {label} in each PE", idle=IDLE, xlabel="array column", ylabel="array row")
        return left, right


def systolic_matmul(inputs: torch.Tensor, weights: torch.Tensor, dataflow: str = "weight", array: tuple[int, int] | None = None) -> SystolicRun:
    """Multiply ``inputs`` (M x K) by ``weights`` (K x N) on a simulated systolic array, cycle by cycle.

    ``dataflow`` picks what stays in the PEs: "weight" (TPU-style, a K x N array),
    "input" (A stays, W streams: the weight-stationary array run on the transposed
    problem, C^T = W^T A^T) or "output" (each PE accumulates one C[m, n]).
    ``array`` = (rows, cols) caps the array size; larger problems are tiled into
    passes, one after the other. Arithmetic is float64, so it agrees with torch.matmul to rounding.
    """
    if dataflow not in DATAFLOWS:
        raise ValueError(f"dataflow={dataflow!r}: choose one of {DATAFLOWS}.")
    if inputs.dim() != 2 or weights.dim() != 2 or inputs.shape[1] != weights.shape[0]:
        raise ValueError(f"need inputs M x K and weights K x N with matching K; got {tuple(inputs.shape)} and {tuple(weights.shape)}.")
    if array is not None and min(array) < 1:
        raise ValueError(f"array={array}: an array needs at least one row and one column of PEs.")
    a, w = inputs.detach().double().cpu(), weights.detach().double().cpu()
    if dataflow == "input":
        result, passes, formula, used = _tiled("weight", w.T, a.T, array)
        result, passes = result.T, [Pass(p.product.T, p.busy, p.grids) for p in passes]
    else:
        result, passes, formula, used = _tiled(dataflow, a, w, array)
    return SystolicRun(dataflow=dataflow, shape=(a.shape[0], a.shape[1], w.shape[1]), array=used, result=result, expected=a @ w, passes=passes, formula_cycles=formula)


def _tiled(dataflow: str, a: torch.Tensor, w: torch.Tensor, array: tuple[int, int] | None):
    """Run a @ w in passes of at most ``array`` PEs; returns the product, the passes, the formula's cycles, the array used."""
    (m, k), n = a.shape, w.shape[1]
    stationary = (k, n) if dataflow == "weight" else (m, n)
    rows, cols = (min(array[0], stationary[0]), min(array[1], stationary[1])) if array else stationary
    result = torch.zeros(m, n, dtype=torch.float64)
    passes, formula = [], 0
    for first in _tiles(stationary[0], rows):
        for ns in _tiles(n, cols):
            if dataflow == "weight":
                p = weight_stationary_pass(a[:, first], w[first, ns])
                result[:, ns] += p.product  # partial sums over K tiles add up in the output accumulators
                formula += pass_cycles(m, first.stop - first.start, ns.stop - ns.start)
            else:
                p = output_stationary_pass(a[first], w[:, ns])
                result[first, ns] = p.product
                formula += pass_cycles(k, first.stop - first.start, ns.stop - ns.start)
            passes.append(p)
    return result, passes, formula, (rows, cols)


# ---------------------------------------------------------------- the three dataflows side by side


@dataclass
class DataflowRow:
    dataflow: str = column("dataflow")
    stationary: str = column("stays in the PEs")
    array: str = column("array")
    passes: int = column("passes")
    cycles: int = column("cycles", ",")
    formula_cycles: int = column("formula", ",")
    utilisation: float = column("utilisation", lambda u: f"{100 * u:.1f}%")
    correct: bool = column("matches torch.matmul")


class DataflowComparison(Report):
    """The same matmul on weight-, input- and output-stationary arrays of the same size."""

    def __init__(self, runs: dict[str, SystolicRun]):
        self.runs = runs
        m, k, n = next(iter(runs.values())).shape
        self.title = f"Systolic dataflows for ({m} x {k}) @ ({k} x {n})"
        rows = [DataflowRow(name, STATIONARY[name], f"{r.array[0]} x {r.array[1]}", r.passes, r.cycles, r.formula_cycles, r.utilisation, r.matches) for name, r in runs.items()]
        super().__init__(rows)

    def plot(self, ax=None):
        ax = plots.grouped_bars(
            [r.dataflow + "-stationary" for r in self.rows],
            {"cycles": [r.cycles for r in self.rows], "ideal (MACs / PEs)": [math.ceil(self.runs[r.dataflow].macs / self.runs[r.dataflow].pes) for r in self.rows]},
            ax,
            title=self.title,
            ylabel="cycles",
        )
        ax.set_ylim(top=1.25 * max(r.cycles for r in self.rows))  # room for the legend
        return ax


def compare_dataflows(m: int = 8, k: int = 6, n: int = 4, array: tuple[int, int] | None = None, seed: int = 0) -> DataflowComparison:
    """Run one random (m x k) @ (k x n) matmul through all three dataflows (on ``array``-sized arrays when given)."""
    generator = torch.Generator().manual_seed(seed)
    inputs, weights = torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)
    return DataflowComparison({flow: systolic_matmul(inputs, weights, flow, array) for flow in DATAFLOWS})
