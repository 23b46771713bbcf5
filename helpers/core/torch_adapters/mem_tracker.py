"""Adapter for torch's MemTracker (``torch.distributed._tools.mem_tracker``), written for torch 2.14.

Relies on: ``MemTracker`` being a TorchDispatchMode (its ``__torch_dispatch__`` can be
extended to take a snapshot after every operator) with ``track_external(*modules, optimizers,
tensors)``; ``get_tracker_snapshot()`` / ``get_tracker_snapshot("peak")`` returning
{device: {kind: bytes, "Total": bytes}} with kinds from the enum ``_MemRefType`` (values
"Parameter", "Buffer", "Gradient", "Optstate", "Activation", "Temp", "Other");
``memory_tracking``: per module a stats object with ``mod_fqn``, ``parameter_mem``,
``output_mem`` and ``snapshots`` keyed by ``_ModState`` (values "Peak-Forward",
"Peak-Backward"). torch offers no public tracker of memory by kind. Importing it loads
torch.distributed (about a second), so the import waits for first use.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

from helpers.core.torch_adapters.changes import moved, require

_MODULE = "torch.distributed._tools.mem_tracker"
# torch's kinds of memory (the values of _MemRefType) -> the kit's names for them
KINDS = {"Parameter": "parameters", "Buffer": "buffers", "Gradient": "gradients", "Optstate": "optimizer state",
         "Activation": "activations", "Temp": "temporaries", "Other": "other"}
MODULE_PEAKS = {"Peak-Forward": "forward", "Peak-Backward": "backward"}  # _ModState values -> phase
TOTAL = "Total"


@lru_cache(maxsize=1)
def step_tracker_class() -> type:
    """MemTracker plus the step's timeline: after every operator, (the current ``phase``, memory per device and kind).

    ``phase`` is whatever the caller last set (the kit's training_step reports its phases).
    """
    MemTracker = require("mem_tracker", _MODULE, "MemTracker")

    class StepTracker(MemTracker):
        def __init__(self):
            super().__init__()
            self.phase = "forward"
            self.timeline: list[tuple[str, dict]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            self.timeline.append((self.phase, by_kind_per_device(self.get_tracker_snapshot())))
            return out

    return StepTracker


def new_step_tracker():
    return step_tracker_class()()


def _kind(key: Any) -> str:
    return getattr(key, "value", key)  # MemTracker keys its kinds and module states by enums whose values are these names


def by_kind(snapshot: Mapping) -> dict[str, int]:
    """One device's snapshot as {the kit's kind name: bytes}, with "total"; kinds torch did not report are 0."""
    named = {_kind(k): v for k, v in snapshot.items()}
    unknown = set(named) - set(KINDS) - {TOTAL}
    if unknown:
        raise moved("mem_tracker", f"{_MODULE}._MemRefType", f"unknown kinds of memory {sorted(unknown)}")
    return {**{name: named.get(kind, 0) for kind, name in KINDS.items()}, "total": named.get(TOTAL, 0)}


def by_kind_per_device(snapshot: Mapping) -> dict[str, dict[str, int]]:
    """A whole snapshot as {device name: {kind: bytes}}."""
    return {str(device): by_kind(per_device) for device, per_device in snapshot.items()}


def peak_by_kind(tracker) -> dict[str, dict[str, int]]:
    """Per device, memory by kind at its peak."""
    return by_kind_per_device(tracker.get_tracker_snapshot("peak"))


@dataclass
class ModulePeaks:
    fqn: str
    parameter_bytes: int
    output_bytes: int
    forward_peak: int
    backward_peak: int


def module_peaks(tracker) -> list[ModulePeaks]:
    """Per module the tracker followed: its parameters, its output, and memory in use at its forward and backward peaks."""
    rows = []
    for stats in tracker.memory_tracking.values():
        peaks = dict.fromkeys(MODULE_PEAKS.values(), 0)
        for key, snaps in stats.snapshots.items():
            phase = MODULE_PEAKS.get(_kind(key))
            if phase:
                peaks[phase] = max([peaks[phase], *(dev[TOTAL] for snap in snaps for dev in snap.values())])
        rows.append(ModulePeaks(stats.mod_fqn, stats.parameter_mem, getattr(stats, "output_mem", 0), peaks["forward"], peaks["backward"]))
    return rows


def check() -> None:
    """The kinds and module states are the ones this adapter names, and a tracked step fills snapshot and module stats."""
    import torch
    from torch import nn

    module = require("mem_tracker", _MODULE)
    for enum, expected in (("_MemRefType", set(KINDS)), ("_ModState", set(MODULE_PEAKS))):
        values = {_kind(v) for v in require("mem_tracker", _MODULE, enum)}
        if not expected <= values:
            raise moved("mem_tracker", f"{_MODULE}.{enum}", f"missing {sorted(expected - values)}; it now has {sorted(values)}")
    for name in ("track_external", "get_tracker_snapshot"):
        if not hasattr(module.MemTracker, name):
            raise moved("mem_tracker", f"{_MODULE}.MemTracker.{name}", "no such method")
    model = nn.Linear(8, 8)
    tracker = new_step_tracker()
    tracker.track_external(model)
    with tracker:
        model(torch.ones(2, 8)).sum().backward()
    peak = peak_by_kind(tracker)["cpu"]
    if peak["parameters"] != (8 * 8 + 8) * 4 or not tracker.timeline:
        raise moved("mem_tracker", f"{_MODULE}.MemTracker.get_tracker_snapshot",
                    f"a Linear(8, 8) reported {peak['parameters']} parameter bytes (expected 288), timeline of {len(tracker.timeline)}")
    if not any(row.fqn == "Linear" and row.parameter_bytes == 288 for row in module_peaks(tracker)):
        raise moved("mem_tracker", f"{_MODULE}.MemTracker.memory_tracking", "no module stats for the tracked Linear")
