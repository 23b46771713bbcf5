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

NOTICEABLE = 1.15  # a ratio closer to 1 than this is a tie on a busy machine (as helpers.hardware.kernels)
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
        """A sentence when the rounds of one batch size were far apart (spread measured in this run), else None."""
        too_noisy = too_noisy or NOISY
        worst = max(self.rows, key=lambda r: r.spread, default=None)
        if worst is None or worst.spread <= too_noisy:
            return None
        return (f"Other work shared the machine: at batch {worst.batch:,} the median round took {worst.spread:.1f}x the fastest "
                f"(over {too_noisy}x). Each step below is judged against the "
                "spread of its own rounds.")

    def steps(self, noticeable: float = NOTICEABLE) -> list[tuple[BatchPoint, BatchPoint, float, str]]:
        """(smaller batch, next batch, gain in samples/s, verdict) for each step of batch sizes.

        A step "rose" when the larger batch's median round beat the smaller batch's fastest one (the gain exceeds the
        larger batch's spread) and the gain clears ``noticeable``; it "fell" the other way round; else it is a "tie".
        """
        found = []
        for before, after in zip(self.rows, self.rows[1:]):
            gain = after.samples_per_second / before.samples_per_second
            if gain > max(after.spread, noticeable):
                verdict = "rose"
            elif 1 / gain > max(before.spread, noticeable):
                verdict = "fell"
            else:
                verdict = "tie"
            found.append((before, after, gain, verdict))
        return found

    def reading(self, noticeable: float = NOTICEABLE) -> str:
        """A verdict for every step of batch sizes (rose, fell, or a tie within the rounds' spread), and where samples/s stopped rising."""
        if len(self.rows) < 2:
            return "One batch size only: time more to see the curve."
        lines = [f"Each step of batch sizes against its noise bound (the median / fastest round of the batch that would have "
                 f"to be faster, at least {noticeable:.2f}x):"]
        for before, after, gain, verdict in self.steps(noticeable):
            spread = max(after.spread if gain >= 1 else before.spread, noticeable)  # the bound the verdict was judged by
            said = {"rose": f"rose {gain:.2f}x, beyond its noise bound ({spread:.2f}x)",
                    "fell": f"fell to {gain:.2f}x, beyond its noise bound ({spread:.2f}x)",
                    "tie": f"{gain:.2f}x, within its noise bound ({spread:.2f}x): a tie"}[verdict]
            lines.append(f"  batch {before.batch:>6,} -> {after.batch:>6,}: samples/s {said}")
        verdicts = [verdict for *_, verdict in self.steps(noticeable)]
        rows = self.rows
        if all(v == "rose" for v in verdicts):
            end = (f"Samples/s rose clearly at every step, from {rows[0].samples_per_second:,.0f} to {rows[-1].samples_per_second:,.0f}: "
                   f"{self.device} had idle lanes left at every size timed; larger batches (batch_sizes in the parameters cell) would "
                   "find where it fills.")
        elif verdicts[-1] == "rose":
            end = (f"Samples/s still rose clearly over the last step: {self.device} was not full at batch {rows[-1].batch:,}; "
                   "larger batches would find where it fills.")
        else:
            last_rise = max((i for i, v in enumerate(verdicts) if v == "rose"), default=None)
            full_at = rows[last_rise + 1] if last_rise is not None else rows[0]
            after_full = set(verdicts[(last_rise + 1) if last_rise is not None else 0:])
            how = "did not rise beyond the noise" if after_full == {"tie"} else "did not rise, and fell at some step"
            end = (f"Samples/s rose clearly up to batch {full_at.batch:,} ({full_at.samples_per_second:,.0f}/s, "
                   f"{full_at.samples_per_second / rows[0].samples_per_second:.1f}x batch {rows[0].batch:,}) and {how} after it: "
                   f"{self.device} was full from there, and a bigger batch only made each step longer.")
        noise = self.noise()
        return "\n".join(([noise] if noise else []) + [*lines, end])

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
