"""Launch overhead: the eager chain against its arithmetic and its compiled form, measured on this machine; the CUDA-graph
path's argument checks and its n/a rows where there is no GPU (and a real capture where there is one)."""
from __future__ import annotations

import operator

import pytest
import torch

from helpers.core.cuda_graphs import capture_cuda_graph
from helpers.training import measure_launch_overhead
from helpers.training.launch_overhead import ARITHMETIC, COMPILED, EAGER, GRAPH, GRAPH_NEEDS_GPU, REDUCE_OVERHEAD


def chain_of(length):
    """``length`` tiny element-wise ops in a row (Lecture 5b writes its own chain in a cell)."""
    def chain(x):
        for i in range(length):
            x = x * 1.01 if i % 3 == 0 else (x + 0.01 if i % 3 == 1 else torch.tanh(x))
        return x
    return chain


def test_capture_refuses_a_cpu_tensor_and_says_what_to_do():
    with pytest.raises(ValueError, match=r"on cpu.*CUDA graphs record GPU kernels.*\.to\('cuda'\)"):
        capture_cuda_graph(chain_of(4), torch.randn(8))


@pytest.mark.parametrize("fn, example, warmup, error, words", [
    ("not a function", torch.randn(8), 3, TypeError, "fn must be callable"),
    (chain_of(4), [1.0, 2.0], 3, TypeError, "example must be a torch.Tensor"),
    (chain_of(4), torch.randn(8), 0, ValueError, "at least 1 warm-up call"),
])
def test_capture_checks_its_arguments_before_touching_a_gpu(fn, example, warmup, error, words):
    with pytest.raises(error, match=words):
        capture_cuda_graph(fn, example, warmup=warmup)


def test_the_chain_and_its_length_are_checked():
    with pytest.raises(ValueError, match="positive int"):
        measure_launch_overhead(chain_of(3), 0, device="cpu")
    with pytest.raises(ValueError, match="the chain"):
        measure_launch_overhead("not a chain", 3, device="cpu")


@pytest.mark.slow  # the heaviest of the unit tests: left out of make test-fast
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU side: n/a rows where CUDA graphs cannot run")
def test_on_a_cpu_eager_is_overhead_and_compiling_fuses_it():
    report = measure_launch_overhead(chain_of(12), 12, elements=64, min_run_time=0.05, large_elements=2**18)
    eager, arithmetic, compiled = (report.find(variant=v) for v in (EAGER, ARITHMETIC, COMPILED))
    # 64 values per op: the arithmetic is a few dozen nanoseconds, a dispatch microseconds (measured side by side)
    assert eager.op_seconds > 2 * arithmetic.op_seconds
    assert compiled.call_seconds is not None and compiled.setup_seconds > 0
    assert compiled.max_difference < 1e-5
    for name in (GRAPH, REDUCE_OVERHEAD):
        row = report.find(variant=name)
        assert row.call_seconds is None and row.speedup is None and GRAPH_NEEDS_GPU in row.note
    text = report.table()
    assert "n/a" in text and "No GPU here" in text
    lines = report.conclusions()
    assert any(line.startswith(f"{GRAPH}: n/a here") for line in lines)
    assert any(line.startswith(f"{COMPILED}:") and "n/a" not in line for line in lines)


def test_compile_budget_and_switch_give_n_a_rows_that_say_why():
    spent = measure_launch_overhead(chain_of(6), 6, elements=32, device="cpu", min_run_time=0.02, large_elements=2**14, compile_budget_s=0)
    assert "compile budget of 0 s is spent" in spent.find(variant=COMPILED).note
    off = measure_launch_overhead(chain_of(6), 6, elements=32, device="cpu", min_run_time=0.02, large_elements=2**14, compile=False)
    assert off.find(variant=COMPILED).call_seconds is None and "compile=False" in off.find(variant=COMPILED).note
    with pytest.raises(ValueError, match="large_elements >= elements"):
        measure_launch_overhead(chain_of(6), 6, elements=64, large_elements=8, device="cpu")


@pytest.mark.gpu  # a real capture needs a GPU (the CPU side is tested above)
def test_graph_replay_equals_eager_on_a_gpu():
    chain, x = chain_of(10), torch.randn(256, device="cuda")
    with torch.no_grad():
        graph = capture_cuda_graph(chain, x)
        fresh = torch.randn(256, device="cuda")
        assert torch.equal(graph(fresh), chain(fresh))
    report = measure_launch_overhead(chain, 10, elements=256, min_run_time=0.05, compile=False)
    assert report.find(variant=GRAPH).max_difference == 0


def test_the_gpu_path_uses_apis_this_torch_has():
    """The capture and reduce-overhead code cannot run here; what it calls must at least exist, and the mode name be valid."""
    for name in ("cuda.CUDAGraph", "cuda.graph", "cuda.Stream", "cuda.stream", "cuda.current_stream",
                 "compiler.cudagraph_mark_step_begin", "compiler.reset"):
        assert callable(operator.attrgetter(name)(torch)), name
    assert callable(torch.compile(chain_of(2), mode="reduce-overhead"))  # an unknown mode would raise here
    with pytest.raises(RuntimeError):
        torch.compile(chain_of(2), mode="no-such-mode")
