"""Adapter for the CUDA allocator's history and its renderer (``torch.cuda.memory._record_memory_history``,
``torch.cuda.memory._snapshot``, ``torch.cuda._memory_viz.trace_plot``), written for torch 2.14.

Relies on: ``_record_memory_history(max_entries=n)`` starting the record and ``enabled=None`` stopping it;
``_snapshot()`` returning a dict whose ``device_traces[device index]`` lists entries with ``action`` ("alloc",
"free_requested", "free_completed", ...) and ``size`` in bytes; ``trace_plot(snapshot)`` returning PyTorch's
memory-viz page as HTML for such a dict. torch documents the snapshot (Understanding CUDA Memory Usage) but keeps
these functions private.
"""
from __future__ import annotations

from helpers.core.torch_adapters.changes import moved, require

record_memory_history = require("memory_history", "torch.cuda.memory", "_record_memory_history")
snapshot = require("memory_history", "torch.cuda.memory", "_snapshot")
trace_plot = require("memory_history", "torch.cuda._memory_viz", "trace_plot")


def stop_recording() -> None:
    record_memory_history(enabled=None)


def live_bytes(trace: list[dict]) -> list[int]:
    """Bytes live after each entry of one device's trace, from zero at the first (frees of older blocks shift it up)."""
    live, values = 0, []
    for entry in trace:
        live += {"alloc": entry["size"], "free_completed": -entry["size"]}.get(entry["action"], 0)
        values.append(live)
    lowest = min([0, *values])
    return [v - lowest for v in values]


def check() -> None:
    """A hand-made snapshot of one 512-byte block allocated then freed renders as a page, and reads 512 then 0."""
    trace = [{"action": "alloc", "addr": 1, "size": 512, "stream": 0, "frames": [], "time_us": 1},
             {"action": "free_completed", "addr": 1, "size": 512, "stream": 0, "frames": [], "time_us": 2}]
    page = trace_plot({"segments": [], "device_traces": [trace]})
    if "<html" not in page.lower():
        raise moved("memory_history", "torch.cuda._memory_viz.trace_plot", "it no longer returns an HTML page for a snapshot dict")
    if live_bytes(trace) != [512, 0]:
        raise moved("memory_history", "torch.cuda.memory._snapshot", "the trace entries' action/size fields changed")
