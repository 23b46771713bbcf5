"""Benchmarking mistakes side by side: a notebook's wrong and right measurements of the same work, tabulated (Lecture 1)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core import load, plots
from helpers.core.device import cpu_threads, gpu_notice, pick_device
from helpers.core.report import Report, column, format_seconds

Measure = Callable[[], float]  # one measurement: seconds


def _span(readings: list[float]) -> str:
    """The fastest and the slowest of some readings, as text."""
    return f"{format_seconds(min(readings))} to {format_seconds(max(readings))}" if readings else "n/a"


@dataclass
class Mistake:
    mistake: str = column("mistake")
    wrong_seconds: float = column("measured wrongly (median)", format_seconds)
    right_seconds: float = column("measured rightly (median)", format_seconds)
    wrong_readings: list[float] = column("wrong: all readings", _span, default_factory=list)
    right_readings: list[float] = column("right: all readings", _span, default_factory=list)
    ratio: float = column("wrong / right", ".2f", init=False)

    def __post_init__(self):
        self.ratio = self.wrong_seconds / self.right_seconds if self.right_seconds else float("nan")

    @property
    def apart(self) -> bool:
        """Every reading of one side lies beyond every reading of the other (True when there are no readings to compare)."""
        if not (self.wrong_readings and self.right_readings):
            return True
        return min(self.wrong_readings) > max(self.right_readings) or max(self.wrong_readings) < min(self.right_readings)

    @property
    def costs(self) -> bool:
        """The mistake changed the figure beyond the noise: the medians differ by more than CLOSE and the readings do not overlap."""
        return abs(self.ratio - 1) > CLOSE and self.apart


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
        """One sentence per mistake, read from the measured times: a cost only where it clears the noise (``Mistake.costs``)."""
        out = []
        for r in self.rows:
            read = f"{r.mistake}: the wrong way read {format_seconds(r.wrong_seconds)}, the right way {format_seconds(r.right_seconds)}"
            if r.costs:
                way = "overstated" if r.ratio > 1 else "understated"
                every = f", every wrong reading {'above' if r.ratio > 1 else 'below'} every right one" if r.wrong_readings else ""
                out.append(f"{read}{every}: {way} {max(r.ratio, 1 / r.ratio):.1f}x.")
            elif not r.apart:
                out.append(f"{read}, and their readings overlap ({_span(r.wrong_readings)} against {_span(r.right_readings)}): "
                           "a tie, so here this mistake cost nothing measurable.")
            else:
                out.append(f"{read}, within {CLOSE:.0%} of each other: a tie, so here this mistake cost nothing measurable.")
        return "\n".join(out)


CLOSE = 0.15  # medians this close are one figure on a busy machine, even when their readings do not overlap


def benchmark_mistakes(cases: dict[str, tuple[Measure, Measure]], repeats: int = 5,
                       device: str | torch.device | None = None) -> Mistakes:
    """Tabulate ``cases``: mistake -> (wrong, right), two functions that each measure the same work and return seconds.

    Each function is called ``repeats`` times, taking turns, and every reading is kept beside
    the median; the report says how far the wrong way was from the right one, and calls it
    a tie where the readings overlap. CPU work runs on the cores other programs leave free,
    as in ``helpers.timeit``. ``device`` names the GPU-only part (asynchronous launches) when
    there is no GPU.
    """
    if not cases:
        raise ValueError("benchmark_mistakes: give at least one mistake -> (wrong, right) pair of measuring functions")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"benchmark_mistakes: repeats must be a positive integer, got {repeats!r}")
    device = pick_device(device)
    notice = gpu_notice("asynchronous kernel launches", device)
    rows = []
    with cpu_threads(load.free_threads(torch.get_num_threads())), load.OtherLoad() as other:
        for mistake, pair in cases.items():
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(callable(f) for f in pair)):
                raise TypeError(f"benchmark_mistakes: {mistake!r} must map to (wrong, right), two functions returning seconds")
            readings: dict[str, list[float]] = {"wrong": [], "right": []}
            for _ in range(repeats):  # turns, so a burst of other work cannot fall on one side only
                for side, measure in zip(readings, pair):
                    seconds = measure()
                    if not isinstance(seconds, (int, float)) or seconds < 0:
                        raise TypeError(f"benchmark_mistakes: the {side} measurement of {mistake!r} returned {seconds!r}, not seconds")
                    readings[side].append(float(seconds))
            rows.append(Mistake(mistake, statistics.median(readings["wrong"]), statistics.median(readings["right"]),
                                readings["wrong"], readings["right"]))
    load.record(other.cores)
    return Mistakes(rows, notice=notice)
