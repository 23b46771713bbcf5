"""Host-to-device copies: bandwidth from pageable and pinned memory, and copies overlapped with compute (Lecture 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import time_interleaved, timeit


@dataclass
class TransferPoint:
    size_bytes: int = column("size", format_bytes)
    pageable_gbs: float | None = column("H2D pageable GB/s", ".2f")
    pinned_gbs: float | None = column("H2D pinned GB/s", ".2f")
    host_copy_gbs: float = column("host->host GB/s", ".2f")


class TransferSweep(Report):
    """Copy bandwidth by size: host-to-device from pageable and from pinned memory, and host-to-host."""

    title = "Copy bandwidth"

    def plot(self, ax=None):
        sizes = [r.size_bytes / 2**20 for r in self.rows]
        series = {"host copy": (sizes, [r.host_copy_gbs for r in self.rows])}
        if self.rows and self.rows[0].pinned_gbs is not None:
            series = {"pageable": (sizes, [r.pageable_gbs for r in self.rows]), "pinned": (sizes, [r.pinned_gbs for r in self.rows]), **series}
        ax = plots.line_chart(series, ax, title=self.title, xlabel="size, MiB (log scale)", ylabel="GB/s", logx=True)
        return ax


def _bandwidth(copy: Callable[[], object], nbytes: int, device: torch.device | None, min_run_time: float) -> float:
    return nbytes / timeit(copy, device=device, min_run_time=min_run_time).median / 1e9


def transfer_sweep(sizes_mib: Sequence[float] | None = None, device: str | torch.device | None = None, min_run_time: float = 0.1) -> TransferSweep:
    """Measure host-to-device copy bandwidth, pageable vs pinned, across sizes.

    Pinned (page-locked) memory lets the GPU's DMA engine read host memory
    directly; pageable memory is first staged through a pinned buffer by the
    driver. Host-to-host copy bandwidth is measured too, as a reference and as the
    CPU side when there is no GPU. The default sizes end past the CPU's largest cache
    (``past_cache_mib``), so that the last one measures memory, not a cache.
    """
    from helpers.hardware.roofline import past_cache_mib  # lazy: the roofline module imports more than copies need

    device = pick_device(device)
    notice = gpu_notice("host-to-device copying", device)
    if not sizes_mib:
        past_cache = past_cache_mib("cpu")
        sizes_mib = (1, 4, 16, 64, 256) if is_gpu(device) else (1, 4, 16, 64)
        sizes_mib = sizes_mib if past_cache <= max(sizes_mib) else (*sizes_mib, past_cache)
    rows = []
    for mib in sizes_mib:
        nbytes = int(mib * 2**20)
        src = torch.ones(nbytes, dtype=torch.uint8)
        host_dst = torch.empty_like(src)
        host = _bandwidth(lambda: host_dst.copy_(src), nbytes, None, min_run_time)
        pageable = pinned = None
        if is_gpu(device):
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            pinned_src = src.pin_memory()
            pageable = _bandwidth(lambda: dst.copy_(src), nbytes, device, min_run_time)
            pinned = _bandwidth(lambda: dst.copy_(pinned_src, non_blocking=True), nbytes, device, min_run_time)
        rows.append(TransferPoint(nbytes, pageable, pinned, host))
    return TransferSweep(rows, notice=notice)


@dataclass
class OverlapRow:
    strategy: str = column("strategy")
    seconds: float = column("time (median)", format_seconds)
    fastest: float | None = column("fastest", format_seconds, optional=True, default=None)


PARTS = ("copies only", "compute only")  # the strategies that time one part alone
SAME_TIME = 0.10  # the least gap from the sum of the parts read as a difference, when the timing noise is smaller


class Overlap(Report):
    """Copying batches to the device while computing on the previous ones."""

    title = "Overlapping host-to-device copies with compute"

    def noise(self) -> float:
        """The timing noise: the largest median-over-fastest excess among the strategies (0 without fastest readings)."""
        return max((r.seconds / r.fastest - 1 for r in self.rows if r.fastest), default=0.0)

    def sentences(self) -> str:
        """Each strategy's time; each one that copies and computes, against the two parts timed alone one after the other."""
        lines = [f"{r.strategy}: {format_seconds(r.seconds)}" for r in self.rows]
        if not all(any(r.strategy == part for r in self.rows) for part in PARTS):
            return "\n".join(lines)
        total = sum(self.find(strategy=part).seconds for part in PARTS)
        margin = max(SAME_TIME, self.noise())
        for i, r in enumerate(self.rows):
            if r.strategy in PARTS or r.strategy.startswith("copies only"):
                continue
            ratio = r.seconds / total
            if ratio < 1 - margin:
                how = "less than the parts one after the other: the copies overlapped the compute"
            elif ratio <= 1 + margin:
                how = "about the parts one after the other: the copies and the compute did not overlap"
            else:
                how = "more than the parts one after the other"
            lines[i] += (f", {ratio:.2f}x the sum of copies only and compute only ({format_seconds(total)}): {how} "
                         f"(a gap under {margin:.0%}, the larger of the timing noise and {SAME_TIME:.0%}, counts as none)")
        return "\n".join(lines)

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, xlabel="milliseconds")
        ax.barh([r.strategy for r in self.rows][::-1], [r.seconds * 1e3 for r in self.rows][::-1], color=plots.CYCLE[: len(self.rows)])
        return ax


def copy_compute_overlap(strategies: dict[str, Callable[[], object]], device: str | torch.device | None = None,
                         min_run_time: float = 0.1, rounds: int = 3) -> Overlap:
    """Time each of ``strategies`` (name -> function that copies a set of batches and computes on them) on ``device``.

    The functions are a notebook's: one after the other, ``non_blocking`` from pageable
    memory, pinned memory with a second CUDA stream, and the copies and the compute alone.
    They take turns for ``rounds`` rounds of ``helpers.timeit`` (device synchronised), so a burst of other
    work falls on all of them; a row keeps the median and the fastest block. Without a GPU the
    notice says so; the CPU side is whatever the notebook gives (host-to-host copies).
    """
    if not strategies or not all(callable(fn) for fn in strategies.values()):
        raise TypeError("copy_compute_overlap: give a dict of name -> function to time")
    device = pick_device(device)
    notice = gpu_notice("copy/compute overlap", device)
    turns = time_interleaved(strategies, device, rounds, min_run_time=min_run_time)
    rows = [OverlapRow(name, turns[name].median, turns[name].fastest) for name in strategies]
    return Overlap(rows, notice=notice)
