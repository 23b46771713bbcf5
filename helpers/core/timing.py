"""The one timing primitive of the kit: torch.utils.benchmark with the device synchronised around each timed block.

``timeit`` runs a warm-up call first and uses all CPU threads that other programs leave free
(torch.utils.benchmark silently defaults to one); ``time_interleaved`` times several functions in rounds in which
they take turns; ``time_once`` is a single wall-clock reading for demos.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch.utils import benchmark as torch_benchmark

from helpers.core import load
from helpers.core.device import cpu_threads as threads_for_cpu
from helpers.core.device import synchronize

Measurement = torch_benchmark.Measurement


def _synchronized_clock(device: torch.device | None) -> Callable[[], float]:
    """A clock that first waits for ``device`` (or every accelerator) to finish its queued work."""

    def clock() -> float:
        synchronize(device)
        return time.perf_counter()

    return clock


def timeit(
    fn: Callable,
    *args,
    device: str | torch.device | None = None,
    min_run_time: float = 0.2,
    num_threads: int | None = None,
    label: str = "",
    **kwargs,
) -> Measurement:
    """Time ``fn(*args, **kwargs)``; the result's ``.median`` is seconds per call.

    One warm-up call, then torch.utils.benchmark's ``blocked_autorange``: calls are
    run in blocks, and ``device`` is synchronised before each clock reading so that
    asynchronous GPU work is counted. ``num_threads`` defaults to torch's current
    CPU thread count (all cores), not to torch.utils.benchmark's default of 1, less the
    cores other programs keep busy (``load.free_threads``); how busy they kept the machine
    is recorded, and the next table built says so (``load.take_load_note``).
    """
    device = torch.device(device) if device is not None else None
    fn(*args, **kwargs)  # warm-up: allocation, kernel selection, lazy initialisation
    synchronize(device)
    timer = torch_benchmark.Timer(
        stmt="fn(*args, **kwargs)",
        globals={"fn": fn, "args": args, "kwargs": kwargs},
        num_threads=num_threads or load.free_threads(torch.get_num_threads()),
        timer=_synchronized_clock(device),
        label=label,
    )
    with load.OtherLoad() as other:
        measured = timer.blocked_autorange(min_run_time=min_run_time)
    load.record(other.cores)
    return measured


def time_once(fn: Callable, *, sync: torch.device | None = None) -> float:
    """Wall-clock seconds of one call, synchronising ``sync`` at the end when given (for demos)."""
    start = time.perf_counter()
    fn()
    if sync is not None:
        synchronize(sync)
    return time.perf_counter() - start


@dataclass(frozen=True)
class Turns:
    """One function's seconds per call from interleaved rounds: the fastest reading, the median one, and every reading."""

    fastest: float
    median: float
    readings: tuple[float, ...] = ()

    @property
    def spread(self) -> float:
        """Median over fastest: 1.0 on a quiet machine; well above it when other work disturbed the timing."""
        return self.median / self.fastest if self.fastest > 0 else float("inf")


def range_verdict(mine: Sequence[float], theirs: Sequence[float]) -> str:
    """'faster' when every reading of ``mine`` lies below every reading of ``theirs`` (times: lower is faster),
    'slower' the other way round, else 'a tie': the ranges overlap, so the gap is inside the run-to-run spread."""
    if max(mine) < min(theirs):
        return "faster"
    if min(mine) > max(theirs):
        return "slower"
    return "a tie"


def time_interleaved(functions: Mapping[str, Callable[[], object]], device: str | torch.device | None = None, rounds: int = 3,
                     min_run_time: float = 0.0, cpu_threads: int | None = None) -> dict[str, Turns]:
    """Time each function in ``rounds`` rounds in which the functions take turns, after a warm-up call each.

    Taking turns makes a passing disturbance of the machine (another process, a frequency change) hit
    every function alike; other work only ever adds time, so ``fastest`` is the closest to a function's
    own cost and ``spread`` says how much the timing was disturbed. With ``min_run_time`` 0 a round is one
    call (``device`` synchronised around it), else a ``timeit`` run whose every block counts. CPU work
    runs on ``cpu_threads`` threads (None: torch's setting, less the cores other programs keep busy).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1 (rounds in which the functions take turns), got {rounds}")
    device = torch.device(device) if device is not None else None
    times: dict[str, list[float]] = {name: [] for name in functions}
    with threads_for_cpu(cpu_threads or load.free_threads(torch.get_num_threads())), load.OtherLoad() as other:
        if not min_run_time:
            for fn in functions.values():
                fn()
        for _ in range(rounds):
            for name, fn in functions.items():
                if min_run_time:
                    times[name] += timeit(fn, device=device, min_run_time=min_run_time).times
                else:
                    synchronize(device)
                    start = time.perf_counter()
                    fn()
                    synchronize(device)
                    times[name].append(time.perf_counter() - start)
    load.record(other.cores)
    return {name: Turns(min(values), statistics.median(values), tuple(values)) for name, values in times.items()}
