"""Three classic benchmarking mistakes, each measured the wrong way and the right way (Lecture 1)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device, synchronize
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import time_once, timeit


@dataclass
class Mistake:
    mistake: str = column("mistake")
    wrong_seconds: float = column("measured wrongly", format_seconds)
    right_seconds: float = column("measured rightly", format_seconds)
    lesson: str = column("lesson")


class Mistakes(Report):
    """Each benchmarking mistake measured the wrong way and the right way, side by side."""

    title = "Benchmarking mistakes: wrong vs right"

    def __init__(self, rows, device: torch.device, notice: str | None):
        super().__init__(rows, notice=notice)
        self.device = device

    def plot(self, ax=None):
        return plots.grouped_bars(
            [r.mistake for r in self.rows],
            {"wrong": [r.wrong_seconds * 1e3 for r in self.rows], "right": [r.right_seconds * 1e3 for r in self.rows]},
            ax,
            title=self.title,
            ylabel="milliseconds",
        )


def _median_of(fn: Callable[[], float], repeats: int) -> float:
    values = sorted(fn() for _ in range(repeats))
    return values[len(values) // 2]


def benchmark_mistakes(device: str | torch.device | None = None, n: int | None = None, steps: int = 50) -> Mistakes:
    """Measure three classic mistakes wrong and right on ``device``.

    1. timing an asynchronous GPU call without synchronising (on a CPU, ops are
       synchronous, so both columns agree: that is the CPU side);
    2. timing only the first training step, which allocates gradients and optimizer
       state (and, on a GPU, selects kernels);
    3. calling ``.item()`` every step, which forces a device-to-host sync each time.
    """
    device = pick_device(device)
    notice = gpu_notice("asynchronous kernel launches", device)
    n = n or (4096 if is_gpu(device) else 512)
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    torch.matmul(a, b)
    synchronize(device)
    no_sync = Mistake(
        "no synchronisation",
        _median_of(lambda: time_once(lambda: torch.matmul(a, b)), 7),
        _median_of(lambda: time_once(lambda: torch.matmul(a, b), sync=device), 7),
        "GPU calls return before the work is done: synchronise before reading the clock",
    )

    # A freshly built model's first training step pays one-off costs: allocating gradients and Adam's
    # state (fresh pages, on a CPU), and on a GPU library handles and kernel selection. One first step
    # is one noisy reading, so the mistake is the median first step of several fresh models.
    hidden = 4096 if is_gpu(device) else 1024

    def fresh_training_step() -> Callable[[], None]:
        net = torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1024)).to(device)
        optimizer = torch.optim.Adam(net.parameters())
        inputs = torch.randn(64, 1024, device=device)

        def train_step():
            optimizer.zero_grad()
            net(inputs).square().mean().backward()
            optimizer.step()
        return train_step

    first = statistics.median(time_once(fresh_training_step(), sync=device) for _ in range(5))
    no_warmup = Mistake("no warm-up", first, timeit(fresh_training_step(), device=device, min_run_time=0.2).median,
                        "the first call pays one-off costs: warm up, then time many calls")

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    batch = torch.randn(64, 256, device=device)

    @torch.no_grad()
    def item_every_step() -> float:
        return sum(model(batch).sum().item() for _ in range(steps))

    @torch.no_grad()
    def item_once() -> float:
        total = torch.zeros((), device=device)
        for _ in range(steps):
            total += model(batch).sum()
        return total.item()

    item = Mistake(
        f".item() in a {steps}-step loop",
        timeit(item_every_step, device=device, min_run_time=0.2).median,
        timeit(item_once, device=device, min_run_time=0.2).median,
        "each .item() waits for the device: accumulate on the device, read once",
    )
    return Mistakes([no_sync, no_warmup, item], device, notice)
