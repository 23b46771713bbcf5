"""Adapter for the CPU allocator's events in torch.profiler (``kineto_results``, ``torch._C._autograd.DeviceType``),
written for torch 2.14.

Relies on: ``torch.profiler.profile(profile_memory=True)`` keeping, after it exits, the raw
results at ``prof.profiler.kineto_results``, whose ``events()`` include one "[memory]" event
per allocation (positive ``nbytes()``) and free (negative), with ``start_ns()`` and
``device_type()`` compared against ``torch._C._autograd.DeviceType.CPU``. torch's public
``prof.events()`` folds these into the operators' totals, which loses the order of
allocations and frees, and with it the peak.
"""
from __future__ import annotations

import torch

from helpers.core.torch_adapters.changes import moved, require

DeviceType = require("profiler_memory", "torch._C._autograd", "DeviceType")


def cpu_allocations(prof: torch.profiler.profile) -> list[tuple[int, int]]:
    """(start in ns, bytes: + allocated, - freed) for every CPU allocator event of a finished profile, in time order."""
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError as err:
        raise moved("profiler_memory", "torch.profiler.profile().profiler.kineto_results", str(err)) from err
    memory = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    return sorted(memory, key=lambda event: event[0])  # stable: events at the same instant keep torch's order


def range_starts(prof: torch.profiler.profile, prefix: str) -> dict[str, int]:
    """Start in ns (the memory events' clock) of each ``record_function`` range whose name begins with ``prefix``, by
    the rest of its name."""
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError as err:
        raise moved("profiler_memory", "torch.profiler.profile().profiler.kineto_results", str(err)) from err
    return {e.name().removeprefix(prefix): e.start_ns() for e in events if e.name().startswith(prefix)}


def peak_of(allocations: list[tuple[int, int]]) -> int:
    """The most bytes live at once, counting from zero at the first event."""
    live = highest = 0
    for _, nbytes in allocations:
        live += nbytes
        highest = max(highest, live)
    return highest


def check() -> None:
    """A 4 MiB tensor allocated and freed inside a profile shows as +4 MiB then -4 MiB."""
    size = 4 * 2**20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        t = torch.empty(size, dtype=torch.uint8)
        del t
    allocations = cpu_allocations(prof)
    if (size not in [n for _, n in allocations]) or (-size not in [n for _, n in allocations]) or peak_of(allocations) < size:
        raise moved("profiler_memory", "torch.profiler kineto_results '[memory]' events",
                    f"allocating and freeing {size} bytes gave {allocations[:6]}")
