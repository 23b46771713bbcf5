"""Host-to-device copies: bandwidth from pageable and pinned memory, and copies overlapped with compute (Lecture 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import timeit


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
    CPU side when there is no GPU.
    """
    device = pick_device(device)
    notice = gpu_notice("host-to-device copying", device)
    sizes_mib = sizes_mib or ((1, 4, 16, 64, 256) if is_gpu(device) else (1, 4, 16, 64))
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
    seconds: float = column("time", format_seconds)


class Overlap(Report):
    """Copying batches to the device while computing on the previous ones."""

    title = "Overlapping host-to-device copies with compute"

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, xlabel="milliseconds")
        ax.barh([r.strategy for r in self.rows][::-1], [r.seconds * 1e3 for r in self.rows][::-1], color=plots.CYCLE[: len(self.rows)])
        return ax


def copy_compute_overlap(device: str | torch.device | None = None, batches: int = 8, batch_mib: int = 64, compute_n: int | None = None) -> Overlap:
    """Time ``batches`` copy+compute steps: one after the other, and with copies overlapped.

    Overlap needs pinned memory, ``non_blocking=True`` and a second CUDA stream;
    non_blocking from pageable memory silently degrades to a synchronous copy.
    Without a GPU there is no DMA engine to overlap with: the CPU side times the
    copies, the compute and the two one after the other, beside the sum of the parts.
    """
    device = pick_device(device)
    notice = gpu_notice("copy/compute overlap", device)
    numel = batch_mib * 2**20 // 4
    compute_n = compute_n or (4096 if is_gpu(device) else 512)
    weight = torch.randn(compute_n, compute_n, device=device)

    def compute():
        return weight @ weight

    host = [torch.randn(numel) for _ in range(batches)]
    if not is_gpu(device):
        targets = [torch.empty(numel) for _ in range(batches)]
        copy_s = timeit(lambda: [t.copy_(h) for t, h in zip(targets, host)], min_run_time=0.2).median
        compute_s = timeit(lambda: [compute() for _ in range(batches)], min_run_time=0.2).median
        # the sequential loop is timed itself; the sum of the parts beside it is what it should cost
        sequential_s = timeit(lambda: [(t.copy_(h), compute()) for t, h in zip(targets, host)], min_run_time=0.2).median
        rows = [OverlapRow("copies only (host->host)", copy_s), OverlapRow("compute only", compute_s),
                OverlapRow("copy then compute (measured)", sequential_s), OverlapRow("sum of the two (no overlap)", copy_s + compute_s)]
        return Overlap(rows, notice=notice)

    pinned = [h.pin_memory() for h in host]
    targets = [torch.empty(numel, device=device) for _ in range(batches)]
    copy_stream = torch.cuda.Stream(device)

    def copies_only():
        for t, h in zip(targets, pinned):
            t.copy_(h, non_blocking=True)

    def sequential_pageable():
        for t, h in zip(targets, host):
            t.copy_(h)
            compute()

    def non_blocking_pageable():
        for t, h in zip(targets, host):
            t.copy_(h, non_blocking=True)
            compute()

    def overlapped_pinned():
        # copy batch i+1 on a side stream while the default stream computes on batch i
        for t, h in zip(targets, pinned):
            with torch.cuda.stream(copy_stream):
                t.copy_(h, non_blocking=True)
            compute()
        torch.cuda.current_stream(device).wait_stream(copy_stream)

    measure = lambda fn: timeit(fn, device=device, min_run_time=0.3).median  # noqa: E731
    copy_s, compute_s = measure(copies_only), measure(lambda: [compute() for _ in range(batches)])
    rows = [
        OverlapRow("copies only (pinned)", copy_s),
        OverlapRow("compute only", compute_s),
        OverlapRow("copy then compute (pageable)", measure(sequential_pageable)),
        OverlapRow("non_blocking from pageable memory", measure(non_blocking_pageable)),
        OverlapRow("non_blocking from pinned memory, side stream", measure(overlapped_pinned)),
        OverlapRow("ideal: max(copies, compute)", max(copy_s, compute_s)),
    ]
    return Overlap(rows, notice=notice)
