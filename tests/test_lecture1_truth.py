"""Lecture 1's figures say what was measured: ties within the spread, one reading of a quantity re-used, sentences computed.

Covers the helpers the two lecture-1 notebooks (01 and 03 under lectures/01-gpu-architecture) call for the claims
they print: the mistakes table, the matmul sweep and the format comparison that reads it, the memory-space probes.
"""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
import torch

from helpers.core import load
from helpers.core.timing import Turns
from helpers.hardware import benchmark_mistakes, dtype_speed, matmul_sweep, matmuls, native_dtypes
from helpers.hardware.hierarchy import cpu_read_rates, probe_bytes
from helpers.hardware.matmuls import MatmulSweep, matmul_point
from helpers.hardware.native_dtypes import DtypeTiming, speed_sentence

LECTURES = Path(__file__).resolve().parents[1] / "lectures" / "01-gpu-architecture"
L1 = LECTURES / "01-gpu-architecture-and-benchmarking.ipynb"
L1B = LECTURES / "03-gpu-programming-model.ipynb"


def cells(path: Path, kind: str) -> list[str]:
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == kind]


# ---------------------------------------------------------------- the mistakes table


def test_a_gap_whose_readings_overlap_is_a_tie(capsys):
    wrong, right = iter([1.0, 9.0, 2.0]), iter([1.5, 1.6, 1.4])  # medians 2.0 and 1.5: 1.33x, but 1.0 lies among the right ones
    row = benchmark_mistakes({"no synchronisation": (lambda: next(wrong), lambda: next(right))}, repeats=3, device="cpu").rows[0]
    assert row.ratio == pytest.approx(2.0 / 1.5) and not row.apart and not row.costs
    assert row.wrong_readings == [1.0, 9.0, 2.0] and row.right_readings == [1.5, 1.6, 1.4]


def test_a_gap_clear_of_the_readings_is_a_cost_and_a_small_one_is_not(capsys):
    report = benchmark_mistakes({"no warm-up": (iter([3.0, 4.0, 5.0]).__next__, iter([1.0, 1.1, 1.2]).__next__),
                                 "close": (iter([1.10, 1.11, 1.12]).__next__, iter([1.0, 1.01, 1.02]).__next__)},
                                repeats=3, device="cpu")
    cost, close = report.find(mistake="no warm-up"), report.find(mistake="close")
    assert cost.costs and "every wrong reading above every right one: overstated 3.6x" in report.sentences()
    assert close.apart and not close.costs  # readings apart, but within CLOSE of each other: one figure on a busy machine
    assert report.sentences().count("a tie") == 1


def test_mistakes_are_measured_on_the_threads_other_programs_leave_free(monkeypatch, capsys):
    monkeypatch.setattr(load, "free_threads", lambda wanted: 1)
    seen = []

    def measure():
        seen.append(torch.get_num_threads())
        return 1.0
    before = torch.get_num_threads()
    benchmark_mistakes({"x": (measure, measure)}, repeats=2, device="cpu")
    assert seen == [1, 1, 1, 1] and torch.get_num_threads() == before


# ---------------------------------------------------------------- one reading of a product, re-used


def test_a_point_is_derived_from_seconds_given_and_found_by_device_format_and_size():
    point = matmul_point(128, "cpu", "fp32", 1e-3, fastest=0.9e-3)
    assert point.gflops == pytest.approx(2 * 128**3 / 1e-3 / 1e9) and point.fastest == 0.9e-3
    sweep = MatmulSweep([point])
    assert sweep.point("cpu", "fp32", 128) is point and sweep.point("cpu", "bf16", 128) is None


def test_the_sweep_times_formats_in_turns_and_keeps_fastest_and_median(monkeypatch):
    order = []

    def turns(calls, device, rounds, min_run_time):
        order.append(list(calls))
        return {name: Turns(1e-4, 2e-4) for name in calls}
    monkeypatch.setattr(matmuls, "time_interleaved", turns)
    sweep = matmul_sweep(sizes=(16, 32), devices=["cpu"], dtypes=["fp32", "bf16"], min_run_time=0.01)
    assert order == [["fp32", "bf16"], ["fp32", "bf16"]]  # one round of turns per size, every format in it
    assert [(p.dtype, p.n) for p in sweep.rows] == [("fp32", 16), ("fp32", 32), ("bf16", 16), ("bf16", 32)]
    assert all(p.seconds == 2e-4 and p.fastest == 1e-4 for p in sweep.rows)


def test_dtype_speed_reads_a_sweep_that_timed_its_formats_instead_of_timing_again(monkeypatch):
    rows = [matmul_point(64, "cpu", d, s, fastest=s * 0.9) for d, s in (("fp32", 4e-5), ("bf16", 1e-5), ("fp16", 4e-5))]

    def no_timing(*args, **kwargs):
        raise AssertionError("dtype_speed timed again what the sweep had timed")
    monkeypatch.setattr(native_dtypes, "time_in_turns", no_timing)
    report = dtype_speed(n=64, device="cpu", sweep=MatmulSweep(rows))
    assert [r.seconds for r in report.rows] == [pytest.approx(s * 0.9) for s in (4e-5, 1e-5, 4e-5)]
    assert report.find(dtype="bf16").speedup_vs_fp32 == pytest.approx(4.0)
    assert any("the sweep's timings, read again" in note for note in report.notes)


def test_dtype_speed_times_what_the_sweep_left_out_and_says_so():
    sweep = MatmulSweep([matmul_point(64, "cpu", "fp32", 4e-5, fastest=3e-5)])
    report = dtype_speed(n=32, device="cpu", min_run_time=0.01, rounds=1, sweep=sweep)
    assert any("timed here" in note for note in report.notes)
    assert all(r.median_seconds >= r.seconds for r in report.rows)


def test_a_format_gap_inside_the_spread_is_a_tie():
    fp32 = DtypeTiming("cpu", "fp32", True, "every device", None, 1.0, 1.0, 1.0, 64, 2.0)
    bf16 = DtypeTiming("cpu", "bf16", True, "flag", None, 0.5, 2.0, 2.0, 64, 1.5)  # its median reaches fp32's fastest
    assert bf16.overlaps(fp32) and fp32.overlaps(bf16)
    text = speed_sentence("cpu", "bf16", True, "flag", 0.5, 64, overlap=True)
    assert "ran 2.0x faster" in text and "a tie" in text and "pay off" not in text
    assert "at fp32's speed" in speed_sentence("cpu", "fp16", True, "flag", 1.05, 64, overlap=True)  # nothing to call a tie
    clear = DtypeTiming("cpu", "bf16", True, "flag", None, 0.2, 5.0, 5.0, 64, 0.3)
    assert not clear.overlaps(fp32)


# ---------------------------------------------------------------- memory spaces


def test_the_last_shared_cache_is_probed_near_the_core_and_the_others_at_half():
    assert probe_bytes(48 * 2**10) == 24 * 2**10
    assert probe_bytes(480 * 2**20, 2 * 2**20) == 8 * 2**20  # a big shared L3: 4x L2, not 240 MiB
    assert probe_bytes(8 * 2**20, 2 * 2**20) == 4 * 2**20  # a small one: half of it, still past L2


def test_a_level_is_read_three_times():
    rates = cpu_read_rates(64 * 2**10)
    assert len(rates) == 3 and all(r > 0 for r in rates)


# ---------------------------------------------------------------- the lectures' text


def test_lecture_1_prose_states_no_measured_result_its_output_could_contradict():
    prose = "\n".join(cells(L1, "markdown"))
    assert "differs on every device" not in prose  # the warm-up row's verdict is printed from its readings
    assert "upper bound" not in prose  # the CPU's instruction-set estimate was beaten on a turbo clock
    assert "fixed per-call overheads (small matmuls)" not in prose  # the share of a fixed cost is measured and printed
    code = "\n".join(cells(L1, "code"))
    assert "time_matmul(" not in code  # the race tabulates section 2's reading instead of timing the product again
    assert "LazyLinear" in code  # the first call pays a real one-off cost: creating and initialising the weights


def test_lecture_1b_summary_figure_is_computed():
    prose, code = "\n".join(cells(L1B, "markdown")), "\n".join(cells(L1B, "code"))
    assert "order of magnitude" not in prose and "an order of magnitude or more" in code
    assert "every level down is larger, farther away and slower" not in prose
