"""Throughput against batch size: the parallelism a batch gives the device (Lecture 1)."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from helpers.core import plots
from helpers.core.device import pick_device
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import time_interleaved

NOISY = 1.5  # a median round this many times the fastest: the machine was shared, the curve is not the device's


@dataclass
class BatchPoint:
    batch: int = column("batch")
    step_seconds: float = column("time per step", format_seconds)
    samples_per_second: float = column("samples/s", ",.0f")
    speedup_per_sample: float = column("per-sample speed-up vs batch 1", ".1f")
    spread: float = column("median / fastest round", ".2f")


class BatchThroughput(Report):
    """Training-step time and throughput against batch size: how much parallelism a batch exposes."""

    title = "Training throughput against batch size"

    def __init__(self, rows, device: torch.device, model_name: str):
        super().__init__(rows, [f"{model_name} on {device}: forward, backward and an SGD step per timed call, the fastest of "
                                "rounds in which the batch sizes take turns (helpers.core.timing.time_interleaved)."])
        self.device = device

    def noise(self, too_noisy: float | None = None) -> str | None:
        """A sentence when the rounds of one batch size were too far apart to read a trend from (spread measured in this run)."""
        too_noisy = too_noisy or NOISY
        worst = max(self.rows, key=lambda r: r.spread, default=None)
        if worst is None or worst.spread <= too_noisy:
            return None
        return (f"These timings are too noisy to read a trend from: at batch {worst.batch:,} the median round took {worst.spread:.1f}x "
                f"the fastest (over {too_noisy}x means other work shared the machine). Run the cell again on a quiet machine.")

    def reading(self, full_gain: float = 1.2) -> str:
        """Whether samples/s still rose over the last step of batch sizes (more than ``full_gain`` times), read from the rows."""
        if len(self.rows) < 2:
            return "One batch size only: time more to see the curve."
        if self.noise():
            return self.noise()
        first, before, last = self.rows[0], self.rows[-2], self.rows[-1]
        rise = f"Samples/s went from {first.samples_per_second:,.0f} at batch {first.batch:,} to {last.samples_per_second:,.0f} at {last.batch:,}"
        gain = last.samples_per_second / before.samples_per_second
        if gain > full_gain:
            return (f"{rise}, and still rose {gain:.1f}x over the last step (batch {before.batch:,} to {last.batch:,}): {self.device} "
                    "had idle lanes left at every size timed; larger batches (batch_sizes in the parameters cell) would find where it fills.")
        if gain >= 1 / full_gain:
            return (f"{rise}; over the last step (batch {before.batch:,} to {last.batch:,}) only {gain:.2f}x: {self.device} was full, "
                    "and a bigger batch only makes each step longer.")
        return (f"{rise}, but fell over the last step (batch {before.batch:,} to {last.batch:,}: {gain:.2f}x): past full, the larger "
                "batch's activations outgrow a cache, or other programs disturbed the timing; run it again to tell which.")

    def plot(self, ax=None):
        series = {str(self.device): ([r.batch for r in self.rows], [r.samples_per_second for r in self.rows])}
        return plots.line_chart(series, ax, title=self.title, xlabel="batch size (log scale)", ylabel="samples/s (log scale)", logx=True, logy=True)


def batch_throughput(
    model: torch.nn.Module,
    input_shape: Sequence[int],
    batch_sizes: Sequence[int] = (1, 4, 16, 64, 256),
    device: str | torch.device | None = None,
    min_run_time: float = 0.1,
    num_threads: int | None = None,
    rounds: int = 3,
) -> BatchThroughput:
    """Time one SGD training step of ``model`` at each batch size (inputs of ``input_shape`` per sample).

    A batch's samples are independent until their gradients are summed, so a larger
    batch hands the hardware more parallel work per step: samples/s rises until the
    device is full, then flattens. ``num_threads``: CPU threads (default: all torch has). The batch sizes take turns over
    ``rounds`` rounds; each row keeps its fastest round and how far the median round was from it.
    """
    device = pick_device(device)
    model = copy.deepcopy(model).to(device)  # a copy: the caller's model keeps its device and its weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step_for(batch: int):
        x = torch.randn(batch, *input_shape, device=device)

        def step():
            optimizer.zero_grad()
            model(x).float().sum().backward()
            optimizer.step()
        return step

    turns = time_interleaved({b: step_for(b) for b in batch_sizes}, device, rounds, min_run_time=min_run_time / rounds, cpu_threads=num_threads)
    rows = []
    for batch in batch_sizes:
        seconds = turns[batch].fastest
        per_sample = seconds / batch
        rows.append(BatchPoint(batch, seconds, batch / seconds, (rows[0].step_seconds / rows[0].batch) / per_sample if rows else 1.0,
                               turns[batch].spread))
    return BatchThroughput(rows, device, type(model).__name__)
