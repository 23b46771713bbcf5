"""Convolution kernel choice: a notebook's convolution timed with a library switch off and on (Lecture 1).

On a GPU the switch is cuDNN autotuning (``torch.backends.cudnn.benchmark``); a CPU has no autotuning switch, so
there the nearest one is flipped instead: whether PyTorch runs oneDNN's kernels or its own.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import range_verdict, timeit
from helpers.hardware.matmuls import temporarily


def _span(readings: list[float] | None) -> str:
    return f"{format_seconds(min(readings))} to {format_seconds(max(readings))}" if readings else "n/a"


@dataclass
class ConvTiming:
    setting: str = column("setting")
    forward_seconds: float = column("forward (median)", format_seconds)
    forward_backward_seconds: float = column("forward + backward (median)", format_seconds)
    forward_readings: list[float] | None = column("forward: all readings", _span, optional=True, default=None)
    forward_backward_readings: list[float] | None = column("forward + backward: all readings", _span, optional=True, default=None)


SAME_SPEED = 0.05  # without readings to compare, two timings within 5% of each other are read as the same speed


def step_outcome(off: float, on: float, off_readings: list[float] | None = None, on_readings: list[float] | None = None) -> str:
    """'faster', 'slower' or 'tie' for the switch turned on. With readings: faster only when every reading with it on
    lies below every reading with it off (slower: the reverse); readings that overlap are a tie. Without: medians
    within SAME_SPEED are a tie."""
    if off_readings and on_readings:
        outcome = range_verdict(on_readings, off_readings)
        return "tie" if outcome == "a tie" else outcome
    speedup = off / on
    return "faster" if speedup >= 1 + SAME_SPEED else "slower" if speedup <= 1 - SAME_SPEED else "tie"


class ConvAutotune(Report):
    """A convolution's forward and forward+backward time with a kernel-choice switch off and on, in rounds."""

    title = "Convolution: autotuning off vs on"

    def __init__(self, rows, notice: str | None, title: str | None = None, switch: str | None = None):
        super().__init__(rows, notice=notice)
        if switch:
            self.title = f"Convolution: {switch} off vs on"
        if title:
            self.title = f"{self.title}: {title}"
        self.forward_speedup = rows[0].forward_seconds / rows[1].forward_seconds
        self.forward_backward_speedup = rows[0].forward_backward_seconds / rows[1].forward_backward_seconds

    def table(self) -> str:
        return super().table() + (f"\nspeed-up with it on (medians, off / on): forward {self.forward_speedup:.2f}x, "
                                  f"forward + backward {self.forward_backward_speedup:.2f}x")

    def outcomes(self) -> dict[str, str]:
        """Step -> 'faster', 'slower' or 'tie' (``step_outcome``) for the second row's setting against the first's."""
        off, on = self.rows
        return {"forward": step_outcome(off.forward_seconds, on.forward_seconds, off.forward_readings, on.forward_readings),
                "forward + backward": step_outcome(off.forward_backward_seconds, on.forward_backward_seconds,
                                                   off.forward_backward_readings, on.forward_backward_readings)}

    def verdict(self) -> str:
        """What switching on did here, read from the readings (or, without them, the medians)."""
        off, on = self.rows
        outcomes = self.outcomes()
        figures = f"forward {self.forward_speedup:.2f}x, forward + backward {self.forward_backward_speedup:.2f}x at the medians"
        rule = ("faster or slower only where every reading of one setting lies beyond every reading of the other, "
                "else a tie" if off.forward_readings else f"medians within {SAME_SPEED:.0%} are a tie")
        if len(set(outcomes.values())) == 1:
            outcome = next(iter(outcomes.values()))
            word = {"faster": "ran faster than", "slower": "ran slower than", "tie": "ran as fast as"}[outcome]
            return f"{on.setting} {word} {off.setting}: {figures} ({rule})."
        order = ("faster", "tie", "slower")
        steps = sorted(outcomes, key=lambda step: order.index(outcomes[step]))
        first = {"faster": f"faster than {off.setting}", "tie": f"as fast as {off.setting}", "slower": f"slower than {off.setting}"}
        rest = {"faster": "faster", "tie": "as fast", "slower": "slower"}
        said = [f"{steps[0]} {first[outcomes[steps[0]]]}", *(f"{step} {rest[outcomes[step]]}" for step in steps[1:])]
        return f"{on.setting} ran {' and '.join(said)}: {figures} ({rule})."

    def plot(self, ax=None):
        return plots.grouped_bars(
            ["forward", "forward + backward"],
            {r.setting: [r.forward_seconds * 1e3, r.forward_backward_seconds * 1e3] for r in self.rows},
            ax,
            title=self.title,
            ylabel="milliseconds (median)",
        )


def cudnn_benchmark_demo(forward: Callable[[], object], forward_backward: Callable[[], object], switch: Callable[[bool], None],
                         device: str | torch.device | None = None, labels: tuple[str, str] | None = None,
                         title: str | None = None, rounds: int = 3, min_run_time: float = 0.1) -> ConvAutotune:
    """Time a notebook's convolution steps with its ``switch(on)`` off and on, in ``rounds`` rounds.

    ``switch(True)`` is meant to set ``torch.backends.cudnn.benchmark`` on a GPU (the first call with a new
    shape tries cuDNN's algorithms and keeps the fastest) and, on a CPU, which has no autotuning, the nearest
    library switch (oneDNN's kernels or PyTorch's own). In every round each setting is timed once per step with
    ``helpers.timeit`` (its median block; the order of the settings alternates between rounds), so a burst of other
    work falls on both; the table keeps every reading, and ``verdict()`` calls a gap a tie where they overlap.
    Both global switches are put back as they were afterwards. ``labels``: the two rows' names; ``title``: what
    was convolved, added to the table's title.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    device = pick_device(device)
    notice = gpu_notice("cudnn.benchmark", device)
    name = "cudnn.benchmark" if is_gpu(device) else "oneDNN (mkldnn)"
    labels = labels or (("cudnn.benchmark = False", "cudnn.benchmark = True") if is_gpu(device) else ("oneDNN (mkldnn) off", "oneDNN (mkldnn) on"))
    readings = {on: ([], []) for on in (False, True)}
    with temporarily(torch.backends.cudnn, "benchmark", torch.backends.cudnn.benchmark), \
            temporarily(torch.backends.mkldnn, "enabled", torch.backends.mkldnn.enabled):
        for round_ in range(rounds):
            for on in ((False, True) if round_ % 2 == 0 else (True, False)):
                switch(on)
                readings[on][0].append(timeit(forward, device=device, min_run_time=min_run_time).median)
                readings[on][1].append(timeit(forward_backward, device=device, min_run_time=min_run_time).median)
    rows = [ConvTiming(label, statistics.median(readings[on][0]), statistics.median(readings[on][1]), readings[on][0], readings[on][1])
            for label, on in zip(labels, (False, True))]
    return ConvAutotune(rows, notice, title, switch=name)
