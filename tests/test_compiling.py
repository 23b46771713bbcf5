"""helpers.training.compiling: eager vs torch.compile, compile time apart from speed-up, and the TorchScript fallback."""
from __future__ import annotations

import pytest
import torch

from helpers.training.compiling import eager_vs_compiled
from helpers.training.workloads import tiny_mlp


def graphs_compiled() -> int:
    """How many graphs torch.compile (dynamo) has compiled in this process, by its own count."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def pointwise_chain(x: torch.Tensor) -> torch.Tensor:
    for _ in range(4):
        x = torch.nn.functional.gelu(x) * 0.5 + x.sin()
    return x


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
def test_torch_compile_gives_the_eager_result_and_reports_compile_time_separately():
    graphs_before = graphs_compiled()
    report = eager_vs_compiled(pointwise_chain, torch.randn(16, 64), min_run_time=0.02)
    eager, compiled = report.rows
    assert eager.mode == "eager" and eager.speedup == 1.0 and eager.compile_seconds == 0
    if report.fallback_reason is None:
        assert compiled.mode == "torch.compile (inductor)"
    else:  # no usable C++ compiler on this machine: TorchScript, and the reason says why
        assert compiled.mode.startswith("TorchScript")
    assert compiled.max_difference < 1e-4
    # from outside the report: torch's own compile counter saw the compilation the report timed
    if report.fallback_reason is None:
        assert graphs_compiled() > graphs_before and compiled.compile_seconds > 0
    assert compiled.speedup == pytest.approx(eager.steady_seconds / compiled.steady_seconds)
    if compiled.break_even_calls is not None:  # "pays off after n calls": the compile time over the saving per call
        assert compiled.break_even_calls == pytest.approx(compiled.compile_seconds / (eager.steady_seconds - compiled.steady_seconds))
    # a break-even only for a gap outside the rounds' spread: every compiled round faster than every eager one
    apart = compiled.steady_range[1] < eager.steady_range[0]
    assert (compiled.outcome == "faster") == apart and (compiled.break_even_calls is not None) == apart, (compiled, eager)
    assert eager.steady_range[0] <= eager.steady_seconds <= eager.steady_range[1]


def test_a_failing_compiler_falls_back_to_torchscript_and_says_why():
    model, x = tiny_mlp(16, 2), torch.randn(4, 16)
    report = eager_vs_compiled(model, x, backend="no_such_backend", min_run_time=0.02)
    assert report.compiled.mode == "TorchScript (torch.jit.trace)"
    assert "no_such_backend" in report.fallback_reason and "TorchScript was used instead" in report.table()
    assert report.compiled.max_difference < 1e-5
    assert len(report.plot().patches) == 2


def test_threads_apply_during_the_measurement_only():
    before = torch.get_num_threads()
    report = eager_vs_compiled(tiny_mlp(16, 2), torch.randn(4, 16), device="cpu", backend="no_such_backend", threads=1, min_run_time=0.02)
    assert torch.get_num_threads() == before
    assert report.program.endswith("on 1 CPU thread")


def test_a_function_compiled_by_the_caller_is_measured_not_compiled_again():
    model = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    traced = torch.jit.trace(model, x)  # any callable the caller prepared; its first call's time is the caller's figure
    report = eager_vs_compiled(model, x, device="cpu", min_run_time=0.01, compiled=traced, first_call_seconds=2.0)
    fast = report.compiled
    assert fast.first_call_seconds == 2.0 and fast.compile_seconds == pytest.approx(2.0 - fast.steady_seconds)
    assert fast.max_difference < 1e-5 and report.fallback_reason is None
    with pytest.raises(ValueError, match="first_call_seconds"):
        eager_vs_compiled(model, x, device="cpu", compiled=traced)
