"""The caching allocator: memory_allocated against memory_reserved, read while a notebook's code allocates and frees (Lecture 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import psutil
import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_bytes


@dataclass
class MemoryReading:
    stage: str = column("stage")
    allocated_bytes: int | None = column("allocated (tensors)", format_bytes)
    reserved_bytes: int | None = column("reserved (held by the process)", format_bytes)


class AllocatorDemo(Report):
    """What the allocator reports after allocating, freeing, and emptying its cache."""

    title = "memory_allocated vs memory_reserved"

    def plot(self, ax=None):
        return plots.grouped_bars(
            [r.stage for r in self.rows],
            {"allocated": [(r.allocated_bytes or 0) / 2**20 for r in self.rows], "reserved": [(r.reserved_bytes or 0) / 2**20 for r in self.rows]},
            ax,
            title=self.title,
            ylabel="MiB",
        )


def caching_allocator_demo(experiment: Callable[[Callable[[str], None]], object], device: str | torch.device | None = None) -> AllocatorDemo:
    """Run ``experiment(read)``, which allocates and frees tensors and calls ``read(stage)`` after each step.

    On a GPU each reading is the caching allocator's ``memory_allocated`` (bytes in live
    tensors) and ``memory_reserved`` (bytes it holds from the driver, what nvidia-smi
    shows). On a CPU there is no such cache; the CPU side reads the process's resident
    memory (RSS), which large frees give back to the OS at once.
    """
    if not callable(experiment):
        raise TypeError(f"caching_allocator_demo: experiment must be a function taking read(stage), got {type(experiment).__name__}")
    device = pick_device(device)
    notice = gpu_notice("the CUDA caching allocator", device)
    readings: list[MemoryReading] = []
    process = psutil.Process()

    def read(stage: str) -> None:
        if is_gpu(device):
            readings.append(MemoryReading(str(stage), torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)))
        else:
            readings.append(MemoryReading(str(stage), None, process.memory_info().rss))

    experiment(read)
    if not readings:
        raise ValueError("caching_allocator_demo: the experiment never called read(stage), so there is nothing to show")
    return AllocatorDemo(readings, notice=notice)
