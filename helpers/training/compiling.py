"""Eager vs compiled execution, measured: torch.compile's one-off compile time apart from its steady-state speed-up,
with TorchScript as the fallback where torch.compile cannot run (no C++ compiler, an unsupported platform).
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core import plots
from helpers.core.device import cpu_threads, pick_device, synchronize
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import range_verdict, timeit


@dataclass
class ExecutionMode:
    mode: str = column("mode")
    first_call_seconds: float = column("first call", format_seconds)
    compile_seconds: float = column("compile time", format_seconds)
    steady_seconds: float = column("per call after", format_seconds)
    speedup: float = column("speed-up", ".2f")
    break_even_calls: float | None = column("pays off after", lambda n: f"{n:,.0f} calls")
    max_difference: float = column("max |difference|", ".2g")
    steady_range: tuple[float, float] = (0.0, 0.0)  # fastest and slowest round of the steady-state timing
    outcome: str = "n/a"  # against eager: 'faster' or 'slower' when the rounds' ranges are apart, else 'a tie'


class CompiledComparison(Report):
    """Eager vs compiled: first call (compilation included), steady-state time per call, and when compiling pays off."""

    title = "Eager vs compiled execution"

    def __init__(self, rows, program: str, fallback_reason: str | None, rounds: int = 1):
        notes = [program]
        eager, fast = rows
        if rounds > 1:
            ranges = (f"eager {format_seconds(eager.steady_range[0])} to {format_seconds(eager.steady_range[1])}, {fast.mode} "
                      f"{format_seconds(fast.steady_range[0])} to {format_seconds(fast.steady_range[1])}")
            judged = {"faster": "faster in every round", "slower": "slower in every round",
                      "a tie": "a tie (the ranges overlap): compiling never pays off here"}[fast.outcome]
            notes.append(f"per call after: the median of {rounds} rounds in which eager and compiled took turns ({ranges}); "
                         f"compiled: {judged}")
        if fallback_reason:
            notes.append(f"torch.compile could not run here ({fallback_reason}); TorchScript was used instead")
        super().__init__(rows, notes)
        self.program, self.fallback_reason = program, fallback_reason
        self.eager, self.compiled = rows

    def plot(self, ax=None):
        return plots.horizontal_bars([r.mode for r in self.rows], [r.steady_seconds * 1e3 for r in self.rows], ax,
                                     title=f"{self.program}: time per call", xlabel="milliseconds")


def _first_call(fn: Callable, args, device: torch.device) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn(*args)
    synchronize(device)
    return time.perf_counter() - start, out


def _difference(a, b) -> float:
    a, b = (torch.stack(x) if isinstance(x, (list, tuple)) else x for x in (a, b))
    return (a.float() - b.float()).abs().max().item()


def compile_or_script(fn: Callable, args: tuple, backend: str = "inductor", mode: str | None = None):
    """``torch.compile(fn)`` and its output on ``args``; if compiling fails, ``torch.jit.trace(fn)`` instead.

    Returns (compiled function, output, label, why torch.compile failed or None).
    Compilation happens lazily on the first call, so that call is made here.
    """
    torch.compiler.reset()  # a fresh start, so the first call pays the whole compilation
    try:
        compiled = torch.compile(fn, backend=backend, mode=mode)
        return compiled, compiled(*args), f"torch.compile ({backend})", None
    except Exception as err:  # noqa: BLE001 - any compiler failure means: fall back, and say why
        reason = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
    torch.compiler.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TorchScript is deprecated in favour of torch.compile; we know
        scripted = torch.jit.trace(fn, args)
    return scripted, scripted(*args), "TorchScript (torch.jit.trace)", reason


def eager_vs_compiled(
    fn: Callable,
    *args,
    program: str = "",
    device: str | torch.device | None = None,
    backend: str = "inductor",
    mode: str | None = None,
    min_run_time: float = 0.3,
    threads: int | None = None,
    compiled: Callable | None = None,
    first_call_seconds: float | None = None,
    rounds: int = 3,
) -> CompiledComparison:
    """Time ``fn(*args)`` eagerly and compiled, under torch.no_grad() (inference).

    The compiled first call includes tracing, code generation and (for inductor
    on a CPU) a C++ compiler run; the steady-state time is taken after it with
    helpers.timeit. If torch.compile fails, TorchScript is measured instead and
    the reason is reported. ``threads`` runs everything on that many CPU threads:
    for tiny tensors one is right (eager PyTorch would not split them anyway,
    while compiled loops may, and then wait on a busy core). ``compiled``: a function
    the caller compiled already (``torch.compile(fn)``), whose first call took
    ``first_call_seconds``; it is measured instead of compiling again. The steady states are timed in ``rounds``
    rounds in which eager and compiled take turns (``min_run_time`` split between them); compiling counts as faster
    (and a break-even is computed) only when every compiled round beat every eager one, else it is a tie.
    """
    if compiled is not None and first_call_seconds is None:
        raise ValueError("eager_vs_compiled: with compiled=..., give first_call_seconds (the time of its first, compiling call)")
    device = pick_device(device)
    with torch.no_grad(), cpu_threads(threads if device.type == "cpu" else None):
        eager_first, reference = _first_call(fn, args, device)
        if compiled is None:
            start = time.perf_counter()
            compiled, output, label, reason = compile_or_script(fn, args, backend, mode)
            synchronize(device)
            compiled_first = time.perf_counter() - start
        else:
            output, label, reason, compiled_first = compiled(*args), "torch.compile", None, first_call_seconds
        eager_rounds, compiled_rounds = [], []
        per_round = max(min_run_time / rounds, 0.01)
        for _ in range(rounds):
            eager_rounds.append(timeit(fn, *args, device=device, min_run_time=per_round).median)
            compiled_rounds.append(timeit(compiled, *args, device=device, min_run_time=per_round).median)
    eager_steady, compiled_steady = statistics.median(eager_rounds), statistics.median(compiled_rounds)
    outcome = range_verdict(compiled_rounds, eager_rounds)
    saving = eager_steady - compiled_steady
    compile_seconds = max(compiled_first - compiled_steady, 0.0)
    eager = ExecutionMode("eager", eager_first, compile_seconds=0.0, steady_seconds=eager_steady, speedup=1.0, break_even_calls=None,
                          max_difference=0.0, steady_range=(min(eager_rounds), max(eager_rounds)))
    fast = ExecutionMode(label, compiled_first, compile_seconds=compile_seconds, steady_seconds=compiled_steady,
                         speedup=eager_steady / compiled_steady,
                         break_even_calls=compile_seconds / saving if outcome == "faster" and saving > 0 else None,
                         max_difference=_difference(reference, output), steady_range=(min(compiled_rounds), max(compiled_rounds)),
                         outcome=outcome)
    program = program or getattr(fn, "__name__", type(fn).__name__)
    if threads and device.type == "cpu":
        program += f", on {threads} CPU thread{'s' if threads > 1 else ''}"
    return CompiledComparison([eager, fast], program, reason, rounds)
