"""The caching allocator: memory_allocated against memory_reserved as tensors come and go (Lecture 1)."""
from __future__ import annotations

from dataclasses import dataclass

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


def caching_allocator_demo(device: str | torch.device | None = None, mib: int = 256) -> AllocatorDemo:
    """Allocate ``mib`` MiB, free it, then empty the cache, reading the allocator at each stage.

    On a GPU, ``del`` returns the block to PyTorch's caching allocator, not to the
    driver: memory_allocated drops, memory_reserved does not until empty_cache().
    On a CPU there is no such cache; the CPU side shows the process's resident
    memory (RSS), which large frees give back to the OS at once.
    """
    device = pick_device(device)
    notice = gpu_notice("the CUDA caching allocator", device)
    numel = mib * 2**20 // 4
    if is_gpu(device):
        def read(stage: str) -> MemoryReading:
            return MemoryReading(stage, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))
        torch.cuda.empty_cache()
        readings = [read("before")]
        x = torch.ones(numel, device=device)
        readings.append(read(f"after allocating {mib} MiB"))
        del x
        readings.append(read("after del"))
        torch.cuda.empty_cache()
        readings.append(read("after empty_cache()"))
    else:
        process = psutil.Process()

        def read(stage: str) -> MemoryReading:
            return MemoryReading(stage, None, process.memory_info().rss)
        readings = [read("before")]
        x = torch.ones(numel)
        readings.append(read(f"after allocating {mib} MiB"))
        del x
        readings.append(read("after del"))
    return AllocatorDemo(readings, notice=notice)
