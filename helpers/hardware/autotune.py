"""cuDNN autotuning: a convolution timed with torch.backends.cudnn.benchmark off and on (Lecture 1)."""
from __future__ import annotations

from dataclasses import dataclass

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


class ConvAutotune(Report):
    """A convolution's forward and forward+backward time with algorithm autotuning off and on."""

    title = "Convolution: autotuning off vs on"

    def __init__(self, rows, notice: str | None):
        super().__init__(rows, notice=notice)
        self.forward_speedup = rows[0].forward_seconds / rows[1].forward_seconds
        self.forward_backward_speedup = rows[0].forward_backward_seconds / rows[1].forward_backward_seconds

    def table(self) -> str:
        return super().table() + f"\nspeed-up: forward {self.forward_speedup:.2f}x, forward + backward {self.forward_backward_speedup:.2f}x"

    def plot(self, ax=None):
        return plots.grouped_bars(
            ["forward", "forward + backward"],
            {r.setting: [r.forward_seconds * 1e3, r.forward_backward_seconds * 1e3] for r in self.rows},
            ax,
            title=self.title,
            ylabel="milliseconds",
        )


def _time_conv(conv: torch.nn.Module, x: torch.Tensor, device: torch.device, setting: str) -> ConvTiming:
    def forward_backward():
        conv(x).sum().backward()

    with torch.no_grad():
        forward = timeit(conv, x, device=device, min_run_time=0.2).median
    return ConvTiming(setting, forward, timeit(forward_backward, device=device, min_run_time=0.2).median)


def cudnn_benchmark_demo(device: str | torch.device | None = None, batch: int = 32, channels: int = 64, size: int = 64, filters: int = 64) -> ConvAutotune:
    """Time a 3x3 convolution (``filters`` filters on a batch x channels x size x size input).

    On a GPU: ``torch.backends.cudnn.benchmark`` off (cuDNN's heuristic picks an
    algorithm) vs on (the first call tries them all and caches the fastest for this
    shape). On a CPU: the analogous library switch, oneDNN on vs off.
    """
    device = pick_device(device)
    notice = gpu_notice("cudnn.benchmark", device)
    conv = torch.nn.Conv2d(channels, filters, 3, padding=1).to(device)
    x = torch.randn(batch, channels, size, size, device=device, requires_grad=True)
    if is_gpu(device):
        switch = (torch.backends.cudnn, "benchmark", ("cudnn.benchmark = False", "cudnn.benchmark = True"))
    else:
        switch = (torch.backends.mkldnn, "enabled", ("oneDNN (mkldnn) off", "oneDNN (mkldnn) on"))
    module, attribute, settings = switch
    rows = []
    for setting, value in zip(settings, (False, True)):
        with temporarily(module, attribute, value):
            rows.append(_time_conv(conv, x, device, setting))
    return ConvAutotune(rows, notice)
