"""cuDNN autotuning: a notebook's convolution timed with its switch (torch.backends.cudnn.benchmark) off and on (Lecture 1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import timeit
from helpers.hardware.matmuls import temporarily


@dataclass
class ConvTiming:
    setting: str = column("setting")
    forward_seconds: float = column("forward", format_seconds)
    forward_backward_seconds: float = column("forward + backward", format_seconds)


SAME_SPEED = 0.05  # two timings within 5% of each other are read as the same speed: run-to-run noise is of that order


class ConvAutotune(Report):
    """A convolution's forward and forward+backward time with algorithm autotuning off and on."""

    title = "Convolution: autotuning off vs on"

    def __init__(self, rows, notice: str | None, title: str | None = None):
        super().__init__(rows, notice=notice)
        if title:
            self.title = f"{self.title}: {title}"
        self.forward_speedup = rows[0].forward_seconds / rows[1].forward_seconds
        self.forward_backward_speedup = rows[0].forward_backward_seconds / rows[1].forward_backward_seconds

    def table(self) -> str:
        return super().table() + f"\nspeed-up: forward {self.forward_speedup:.2f}x, forward + backward {self.forward_backward_speedup:.2f}x"

    def verdict(self) -> str:
        """What switching autotuning on did here, read from the two measured speed-ups."""
        off, on = self.rows
        speedups = (self.forward_speedup, self.forward_backward_speedup)
        figures = f"forward {speedups[0]:.2f}x, forward + backward {speedups[1]:.2f}x"
        if max(speedups) >= 1 + SAME_SPEED and min(speedups) <= 1 - SAME_SPEED:
            faster, slower = ("forward + backward", "forward") if speedups[1] > speedups[0] else ("forward", "forward + backward")
            return f"{on.setting} ran {faster} faster than {off.setting} and {slower} slower: {figures}."
        if max(speedups) >= 1 + SAME_SPEED:
            return f"{on.setting} ran faster than {off.setting}: {figures}."
        if min(speedups) > 1 - SAME_SPEED:
            return (f"{on.setting} ran as fast as {off.setting}, within {SAME_SPEED:.0%}: {figures}; the default already chose "
                    "(nearly) the fastest kernels for this shape.")
        return (f"{on.setting} ran slower than {off.setting}: {figures}; the choice that won its trial call lost in the "
                "steady loop, or other work disturbed the timing (rerun the cell).")

    def plot(self, ax=None):
        return plots.grouped_bars(
            ["forward", "forward + backward"],
            {r.setting: [r.forward_seconds * 1e3, r.forward_backward_seconds * 1e3] for r in self.rows},
            ax,
            title=self.title,
            ylabel="milliseconds",
        )


def cudnn_benchmark_demo(forward: Callable[[], object], forward_backward: Callable[[], object], autotuning: Callable[[bool], None],
                         device: str | torch.device | None = None, labels: tuple[str, str] | None = None,
                         title: str | None = None) -> ConvAutotune:
    """Time a notebook's convolution steps with its ``autotuning(on)`` switch off, then on.

    ``autotuning(True)`` is meant to set ``torch.backends.cudnn.benchmark`` on a GPU (the
    first call with a new shape tries cuDNN's algorithms and keeps the fastest) and the
    analogous library switch on a CPU (oneDNN). Both global switches are put back as
    they were afterwards. ``labels``: the two rows' names; ``title``: what was convolved, added to the table's title.
    """
    device = pick_device(device)
    notice = gpu_notice("cudnn.benchmark", device)
    labels = labels or (("cudnn.benchmark = False", "cudnn.benchmark = True") if is_gpu(device) else ("oneDNN (mkldnn) off", "oneDNN (mkldnn) on"))
    rows = []
    with temporarily(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark), \
            temporarily(torch.backends.mkldnn, "enabled", torch.backends.mkldnn.enabled):
        for label, on in zip(labels, (False, True)):
            autotuning(on)
            rows.append(ConvTiming(label, timeit(forward, device=device, min_run_time=0.2).median,
                                   timeit(forward_backward, device=device, min_run_time=0.2).median))
    return ConvAutotune(rows, notice, title)
