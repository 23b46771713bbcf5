"""Benchmarking mistakes side by side: a notebook's wrong and right measurements of the same work, tabulated (Lecture 1)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core import plots
from helpers.core.device import gpu_notice, pick_device
from helpers.core.report import Report, column, format_seconds

Measure = Callable[[], float]  # one measurement: seconds


@dataclass
class Mistake:
    mistake: str = column("mistake")
    wrong_seconds: float = column("measured wrongly", format_seconds)
    right_seconds: float = column("measured rightly", format_seconds)
    ratio: float = column("wrong / right", ".2f", init=False)

    def __post_init__(self):
        self.ratio = self.wrong_seconds / self.right_seconds if self.right_seconds else float("nan")


class Mistakes(Report):
    """Each benchmarking mistake measured the wrong way and the right way, side by side."""

    title = "Benchmarking mistakes: wrong vs right"

    def plot(self, ax=None):
        return plots.grouped_bars(
            [r.mistake for r in self.rows],
            {"wrong": [r.wrong_seconds * 1e3 for r in self.rows], "right": [r.right_seconds * 1e3 for r in self.rows]},
            ax,
            title=self.title,
            ylabel="milliseconds",
        )

    def sentences(self) -> str:
        """One sentence per mistake, read from the measured times (CLOSE: within this share counts as agreeing)."""
        out = []
        for r in self.rows:
            if abs(r.ratio - 1) <= CLOSE:
                out.append(f"{r.mistake}: both ways read {format_seconds(r.right_seconds)}, within {CLOSE:.0%}: here this mistake cost nothing.")
            else:
                way = "overstated" if r.ratio > 1 else "understated"
                out.append(f"{r.mistake}: the wrong way read {format_seconds(r.wrong_seconds)}, the right way {format_seconds(r.right_seconds)}: "
                           f"{way} {max(r.ratio, 1 / r.ratio):.1f}x.")
        return "\n".join(out)


CLOSE = 0.15  # readings this close are one figure on a busy machine


def benchmark_mistakes(cases: dict[str, tuple[Measure, Measure]], repeats: int = 5,
                       device: str | torch.device | None = None) -> Mistakes:
    """Tabulate ``cases``: mistake -> (wrong, right), two functions that each measure the same work and return seconds.

    Each function is called ``repeats`` times, taking turns, and the median reading is
    kept; the report says how far the wrong way was from the right one. ``device``
    names the GPU-only part (asynchronous launches) when there is no GPU.
    """
    if not cases:
        raise ValueError("benchmark_mistakes: give at least one mistake -> (wrong, right) pair of measuring functions")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"benchmark_mistakes: repeats must be a positive integer, got {repeats!r}")
    device = pick_device(device)
    notice = gpu_notice("asynchronous kernel launches", device)
    rows = []
    for mistake, pair in cases.items():
        if not (isinstance(pair, tuple) and len(pair) == 2 and all(callable(f) for f in pair)):
            raise TypeError(f"benchmark_mistakes: {mistake!r} must map to (wrong, right), two functions returning seconds")
        readings = {"wrong": [], "right": []}
        for _ in range(repeats):  # turns, so a burst of other work cannot fall on one side only
            for side, measure in zip(readings, pair):
                seconds = measure()
                if not isinstance(seconds, (int, float)) or seconds < 0:
                    raise TypeError(f"benchmark_mistakes: the {side} measurement of {mistake!r} returned {seconds!r}, not seconds")
                readings[side].append(float(seconds))
        rows.append(Mistake(mistake, statistics.median(readings["wrong"]), statistics.median(readings["right"])))
    return Mistakes(rows, notice=notice)
