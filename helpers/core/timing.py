"""The one timing primitive of the kit: torch.utils.benchmark with the device synchronised around each timed block.

``timeit`` runs a warm-up call first and uses all CPU threads (torch.utils.benchmark
silently defaults to one); ``time_once`` is a single wall-clock reading for demos.
"""
from __future__ import annotations

import time
from typing import Callable

import torch
from torch.utils import benchmark as torch_benchmark

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
    CPU thread count (all cores), not to torch.utils.benchmark's default of 1.
    """
    device = torch.device(device) if device is not None else None
    fn(*args, **kwargs)  # warm-up: allocation, kernel selection, lazy initialisation
    synchronize(device)
    timer = torch_benchmark.Timer(
        stmt="fn(*args, **kwargs)",
        globals={"fn": fn, "args": args, "kwargs": kwargs},
        num_threads=num_threads or torch.get_num_threads(),
        timer=_synchronized_clock(device),
        label=label,
    )
    return timer.blocked_autorange(min_run_time=min_run_time)


def time_once(fn: Callable, *, sync: torch.device | None = None) -> float:
    """Wall-clock seconds of one call, synchronising ``sync`` at the end when given (for demos)."""
    start = time.perf_counter()
    fn()
    if sync is not None:
        synchronize(sync)
    return time.perf_counter() - start
