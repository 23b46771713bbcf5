"""helpers.hardware.systolic: the cycle-by-cycle arrays compute torch.matmul's answer in the cycles the formulas predict."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

from helpers.hardware.systolic import DATAFLOWS, IDLE, compare_dataflows, pass_cycles, systolic_matmul  # noqa: E402

SHAPES = [(1, 1, 1), (5, 3, 4), (2, 7, 3), (9, 2, 6), (4, 4, 4)]


def operands(m: int, k: int, n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


@pytest.mark.parametrize("dataflow", DATAFLOWS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_one_pass_matches_matmul_in_m_plus_k_plus_n_minus_2_cycles(dataflow, shape):
    m, k, n = shape
    a, w = operands(m, k, n)
    run = systolic_matmul(a, w, dataflow)
    assert run.matches and torch.allclose(run.result, (a.double() @ w.double()))
    assert run.passes == 1 and run.cycles == run.formula_cycles == m + k + n - 2
    assert sum(run.busy_per_cycle) == run.macs == m * k * n  # every MAC done exactly once, in some PE, in some cycle
    expected_array = {"weight": (k, n), "input": (k, m), "output": (m, n)}[dataflow]
    assert run.array == expected_array
    assert run.utilisation == pytest.approx(m * k * n / (math.prod(expected_array) * (m + k + n - 2)))


def test_weight_stationary_utilisation_is_m_over_m_plus_k_plus_n_minus_2():
    run = systolic_matmul(*operands(32, 4, 4))
    assert run.utilisation == pytest.approx(32 / (32 + 4 + 4 - 2))
    assert max(run.per_cycle_utilisation) == 1.0  # M >= K + N - 1: for a while every PE is busy


def test_the_array_fills_completely_only_with_enough_input_rows():
    assert max(systolic_matmul(*operands(5, 3, 3)).per_cycle_utilisation) == 1.0  # M = K + N - 1
    assert max(systolic_matmul(*operands(4, 3, 3)).per_cycle_utilisation) < 1.0


def test_inputs_flow_right_and_partial_sums_down_one_pe_per_cycle():
    m, k, n = 6, 3, 4
    run = systolic_matmul(*operands(m, k, n))
    for cycle, grid in enumerate(run.grids):
        for r in range(k):
            for c in range(n):
                row = cycle - r - c  # PE (r, c) works on input row m = cycle - r - c
                assert grid[r, c] == (row if 0 <= row < m else IDLE)


@pytest.mark.parametrize("dataflow", DATAFLOWS)
def test_tiled_problems_sum_the_passes(dataflow):
    m, k, n, array = 10, 7, 9, (4, 3)
    run = systolic_matmul(*operands(m, k, n, seed=1), dataflow, array=array)
    assert run.matches and run.array == array
    tiles = {"weight": (k, n, m), "input": (k, m, n), "output": (m, n, k)}[dataflow]
    rows, cols, stream = tiles
    sizes = [(min(array[0], rows - r), min(array[1], cols - c)) for r in range(0, rows, array[0]) for c in range(0, cols, array[1])]
    assert run.passes == len(sizes) == math.ceil(rows / array[0]) * math.ceil(cols / array[1])
    assert run.cycles == run.formula_cycles == sum(pass_cycles(stream, r, c) for r, c in sizes)
    assert sum(run.busy_per_cycle) == m * k * n


def test_bad_operands_are_explained():
    with pytest.raises(ValueError, match="matching K"):
        systolic_matmul(torch.ones(2, 3), torch.ones(4, 2))
    with pytest.raises(ValueError, match="dataflow"):
        systolic_matmul(torch.ones(2, 3), torch.ones(3, 2), "row")
    with pytest.raises(ValueError, match="at least one row"):
        systolic_matmul(torch.ones(2, 3), torch.ones(3, 2), array=(0, 2))


def test_reports_print_and_plot():
    run = systolic_matmul(*operands(8, 4, 3))
    text = str(run)
    assert "cycles, simulated" in text and "cycles, formula" in text and "S + R + C - 2" in text
    left, right = run.plot()
    assert len(left.lines[0].get_xdata()) == run.cycles and right.images
    comparison = compare_dataflows(8, 6, 4, array=(4, 4))
    assert [r.dataflow for r in comparison.rows] == list(DATAFLOWS) and all(r.correct for r in comparison.rows)
    assert all(r.cycles == r.formula_cycles for r in comparison.rows)
    assert len(comparison.plot().patches) == 6
