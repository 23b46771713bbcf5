"""Launch overhead, measured: a chain of tiny ops run eagerly (one dispatch and one kernel launch per op), replayed
as one CUDA graph, and compiled with torch.compile (its default mode fuses the chain; mode="reduce-overhead" also
replays it as a CUDA graph). CUDA graphs need a GPU: on a CPU those rows read "n/a" with the reason.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from helpers.core import plots
from helpers.core.cuda_graphs import capture_cuda_graph
from helpers.core.device import cpu_threads, gpu_notice, is_gpu, pick_device, synchronize
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import timeit

EAGER = "eager (one launch per op)"
ARITHMETIC = "arithmetic alone (estimate)"
GRAPH = "CUDA graph replay"
COMPILED = "torch.compile (default mode)"
REDUCE_OVERHEAD = "torch.compile (reduce-overhead)"
GRAPH_NEEDS_GPU = "needs a GPU: CUDA graphs record and replay GPU kernels"


@dataclass
class LaunchVariant:
    variant: str = column("variant")
    call_seconds: float | None = column("per call", format_seconds)
    op_seconds: float | None = column("per op", format_seconds)
    speedup: float | None = column("speed-up vs eager", lambda x: f"{x:.2f}x")
    setup_seconds: float | None = column("compile / capture", format_seconds)
    max_difference: float | None = column("max |diff| vs eager", ".2g")
    note: str = column("what it is, or why n/a")


class LaunchOverhead(Report):
    """One chain of tiny ops, run eagerly, as a CUDA graph and compiled: time per call and per op, set-up cost apart."""

    title = "Launch overhead: a chain of tiny ops"

    def __init__(self, rows, length: int, elements: int, device: torch.device, notes):
        super().__init__(rows, notes)
        self.length, self.elements, self.device = length, elements, device

    def plot(self, ax=None):
        shown = [r for r in self.rows if r.op_seconds is not None]
        return plots.horizontal_bars([r.variant for r in shown], [r.op_seconds * 1e6 for r in shown], ax,
                                     title=f"{self.length} ops on {self.elements:,} elements: time per op",
                                     xlabel="microseconds per op")

    def conclusions(self) -> list[str]:
        """Sentences drawn from the measured rows (none of them fixed in advance)."""
        eager, arithmetic = self.find(variant=EAGER), self.find(variant=ARITHMETIC)
        overhead = 1 - arithmetic.op_seconds / eager.op_seconds
        lines = [f"Eager: {format_seconds(eager.op_seconds)} per op, of which the arithmetic is about "
                 f"{format_seconds(arithmetic.op_seconds)}: "
                 + (f"{overhead:.0%} of each op is dispatch and launch overhead, so this step is launch bound."
                    if overhead > 0.5 else f"only {overhead:.0%} is overhead: at this size the step is not launch bound.")]
        for name in (GRAPH, COMPILED, REDUCE_OVERHEAD):
            row = self.find(variant=name)
            if row.call_seconds is None:
                lines.append(f"{name}: n/a here ({row.note}).")
                continue
            faster = (f"{row.speedup:.1f}x as fast as eager" if row.speedup >= 1.1
                      else "no faster than eager" if row.speedup > 0.9 else f"{1 / row.speedup:.1f}x slower than eager")
            saving = eager.call_seconds - row.call_seconds
            payback = (f"; its {format_seconds(row.setup_seconds)} of set-up pays off after {row.setup_seconds / saving:,.0f} calls"
                       if saving > 0 else f"; its {format_seconds(row.setup_seconds)} of set-up never pays off here")
            same = "the same output as eager" if row.max_difference == 0 else f"output within {row.max_difference:.2g} of eager's"
            lines.append(f"{name}: {faster}{payback}; {same}.")
        return lines


def _max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def _not_available(name: str, reason: str) -> LaunchVariant:
    return LaunchVariant(name, None, None, None, None, None, reason)


def _measured(name: str, fn: Callable, x: torch.Tensor, reference: torch.Tensor, eager_seconds: float, length: int,
              setup: float, note: str, device: torch.device, min_run_time: float, output: torch.Tensor) -> LaunchVariant:
    seconds = timeit(fn, x, device=device, min_run_time=min_run_time).median
    return LaunchVariant(name, seconds, seconds / length, eager_seconds / seconds, setup,
                         _max_difference(reference, output), note)


def _compile(chain: nn.Module, x: torch.Tensor, mode: str | None, device: torch.device, calls: int):
    """torch.compile(chain, mode) and the seconds of its first ``calls`` calls (compilation, and for
    reduce-overhead the warm-up and graph recording that follow it); the output of a further call, cloned."""
    torch.compiler.reset()  # a fresh start, so the first call pays for the whole compilation
    compiled = torch.compile(chain, mode=mode)
    start = time.perf_counter()
    for _ in range(calls):
        compiled(x)
    synchronize(device)
    setup = time.perf_counter() - start
    if is_gpu(device):
        torch.compiler.cudagraph_mark_step_begin()  # the previous outputs may be overwritten from here on
    return compiled, setup, compiled(x).clone()


def measure_launch_overhead(
    chain: Callable[[torch.Tensor], torch.Tensor],
    length: int,
    elements: int = 256,
    device: str | torch.device | None = None,
    min_run_time: float = 0.2,
    compile: bool = True,
    compile_budget_s: float = 120.0,
    large_elements: int | None = None,
    capture: Callable = capture_cuda_graph,
) -> LaunchOverhead:
    """Time ``chain``, ``length`` tiny ops on ``elements`` values: eagerly, as a CUDA graph and compiled, under no_grad.

    ``capture(chain, example)`` returns a function that replays a CUDA graph of the chain
    (copying its argument into the graph's static input); it is timed as the set-up.

    The arithmetic row times the same chain on ``large_elements`` values (None:
    2**20 on a CPU, 2**26 on a GPU, whose ops on a few MiB would still be as
    short as a launch), where the overhead is negligible against the work, and
    scales it down: what the tiny ops would cost with no dispatch at all.
    On a CPU everything runs on one
    thread (PyTorch would not split such small tensors anyway). Compilation is
    timed apart from the steady state; once ``compile_budget_s`` seconds of
    compiling are spent, further compiled variants are skipped (n/a, with why).
    """
    device = pick_device(device)
    large_elements = large_elements or (2**26 if is_gpu(device) else 2**20)
    if not isinstance(elements, int) or elements < 1 or not isinstance(large_elements, int) or large_elements < elements:
        raise ValueError(f"measure_launch_overhead: elements={elements!r}, large_elements={large_elements!r}; give positive ints "
                         f"with large_elements >= elements (the large run estimates the arithmetic).")
    if not callable(chain) or not isinstance(length, int) or length < 1:
        raise ValueError(f"measure_launch_overhead: give the chain (a function of one tensor) and its number of ops "
                         f"as a positive int (got {type(chain).__name__}, length={length!r}).")
    x = torch.randn(elements, device=device)
    notice = gpu_notice("CUDA graph capture and mode='reduce-overhead'", device, echo=False)
    notes = [f"{length} element-wise ops per call on {elements:,} float32 values, on {device}"
             + ("" if is_gpu(device) else ", one CPU thread")]
    rows = []
    with torch.no_grad(), cpu_threads(None if is_gpu(device) else 1):
        reference = chain(x).clone()
        eager = timeit(chain, x, device=device, min_run_time=min_run_time).median
        rows.append(LaunchVariant(EAGER, eager, eager / length, 1.0, None, 0.0, f"{length} dispatches, {length} kernels"))
        large = torch.randn(large_elements, device=device)
        per_element = timeit(chain, large, device=device, min_run_time=min_run_time).median / large_elements
        arithmetic = per_element * elements
        rows.append(LaunchVariant(ARITHMETIC, arithmetic, arithmetic / length, eager / arithmetic, None, None,
                                  f"the chain on {large_elements:,} values, scaled down to {elements:,}"))
        if is_gpu(device):
            synchronize(device)
            start = time.perf_counter()
            graph = capture(chain, x)
            synchronize(device)
            rows.append(_measured(GRAPH, graph, x, reference, eager, length, time.perf_counter() - start,
                                  f"one graph launch for {length} kernels, input copied into its static buffer",
                                  device, min_run_time, graph(x).clone()))
        else:
            rows.append(_not_available(GRAPH, GRAPH_NEEDS_GPU))
        spent = 0.0
        for name, mode in ((COMPILED, None), (REDUCE_OVERHEAD, "reduce-overhead")):
            if mode == "reduce-overhead" and not is_gpu(device):
                rows.append(_not_available(name, f"{GRAPH_NEEDS_GPU}; on a CPU this mode compiles as the default does"))
            elif not compile:
                rows.append(_not_available(name, "not measured (compile=False)"))
            elif spent >= compile_budget_s:
                rows.append(_not_available(name, f"skipped: the compile budget of {compile_budget_s:.0f} s is spent"))
            else:
                try:
                    compiled, setup, output = _compile(chain, x, mode, device, calls=3 if mode else 1)
                except Exception as err:  # noqa: BLE001 - a compiler failure becomes an n/a row that says why
                    rows.append(_not_available(name, f"torch.compile failed: {type(err).__name__}: {str(err).strip()[:200]}"))
                    continue
                spent += setup
                how = "the chain fused into one kernel" if mode is None else "fused, then replayed as a CUDA graph"
                rows.append(_measured(name, compiled, x, reference, eager, length, setup, how, device, min_run_time, output))
        torch.compiler.reset()
    if spent:
        notes.append("compile times include what torch.compile's caches saved: the same chain compiled before "
                     "(on disk, or by an earlier cell) compiles faster")
    if notice:
        notes.append(notice)
    return LaunchOverhead(rows, length, elements, device, notes)
