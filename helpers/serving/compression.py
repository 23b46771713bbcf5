"""Lecture 8's table of cheaper models: each variant's file size, latency and accuracy, side by side.

The variants (int8 files, distilled students, pruned copies) are made in the lecture's cells; this module
exports each torch model with the lecture's own export function, times every file in the lecture's
ONNX Runtime session on the same held-out digits, and tabulates and plots them.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import timeit


@dataclass
class Variant:
    variant: str = column("model")
    parameters: int = column("parameters", ",")
    nonzero: float = column("nonzero weights", ".0%")
    file_size: int = column("ONNX file", format_bytes)
    latency: float = column("latency (batch 64)", format_seconds)
    spread: tuple[float, float] = column("latency, rounds' range", lambda r: f"{format_seconds(r[0])}-{format_seconds(r[1])}")
    accuracy: float = column("held-out accuracy", ".1%")

    @property
    def quickest(self) -> float:
        return self.spread[0]

    @property
    def slowest(self) -> float:
        return self.spread[1]


def latency_against(base: Variant, other: Variant) -> str:
    """``other``'s latency against ``base``'s, judged by their rounds: 'faster, 2.10x' only when every round of ``other``
    beat every round of ``base``, 'slower, 1.30x the time' in the opposite case, else a tie (the ranges overlap)."""
    if other.slowest < base.quickest:
        return f"faster, {base.latency / other.latency:.2f}x"
    if other.quickest > base.slowest:
        return f"slower, {other.latency / base.latency:.2f}x the time"
    return f"a tie (ratio {base.latency / other.latency:.2f}, inside the rounds' ranges)"


class CompressionTable(Report):
    """Size, latency and accuracy of each cheaper variant of the served model, side by side."""

    title = "Cheaper models: size, latency, accuracy"

    def plot(self, ax=None):
        from helpers.core.plots import labelled_scatter

        points = {r.variant: (r.latency * 1e6, r.accuracy * 100) for r in self.rows}
        notes = {r.variant: format_bytes(r.file_size) for r in self.rows}
        return labelled_scatter(points, ax, notes, title=self.title, xlabel="latency per batch of 64 (us, ONNX Runtime, 1 thread)",
                                ylabel="held-out accuracy (%)")


def compression_table(variants: dict[str, nn.Module | Path], pixels: torch.Tensor, labels: torch.Tensor, folder: Path, *,
                      export: Callable[[nn.Module, Path], Path], session: Callable[[Path], object],
                      min_run_time: float = 0.1, rounds: int = 5) -> CompressionTable:
    """Export each torch model in ``variants`` with ``export(model, path)`` (or take each ONNX file as it is); time and
    score every file in ``session(path)`` (an ONNX Runtime session, input ``pixels``) on the same digits.

    Latency is timed in ``rounds`` rounds in which the variants take turns (each round starts one variant later, and
    each timing takes ``min_run_time`` / ``rounds`` seconds), so that other work on the machine hits every variant
    alike: a row holds the median round's latency and the range of its rounds (see ``latency_against``).
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    found = []
    batch = pixels[:64].numpy()
    for name, variant in variants.items():
        if isinstance(variant, nn.Module):
            weights = [m.weight for m in variant.modules() if isinstance(m, nn.Linear)]
            parameters = sum(p.numel() for p in variant.parameters())
            nonzero = sum(int((w != 0).sum()) for w in weights) / sum(w.numel() for w in weights)
            path = Path(export(variant, folder / f"{name.replace(' ', '_').replace(',', '')}.onnx"))
        else:
            path, parameters, nonzero = Path(variant), found[0][2] if found else 0, 1.0
        found.append((name, path, parameters, nonzero, session(path)))
    times: list[list[float]] = [[] for _ in found]
    for round_ in range(rounds):
        shift = round_ % len(found)
        for i in [*range(shift, len(found)), *range(shift)]:
            runner = found[i][4]
            times[i].append(timeit(lambda: runner.run(None, {"pixels": batch}), min_run_time=min_run_time / rounds,
                                   num_threads=1).median)
    rows = []
    for (name, path, parameters, nonzero, runner), rounds_ in zip(found, times):
        predicted = runner.run(None, {"pixels": pixels.numpy()})[0].argmax(1)
        rows.append(Variant(name, parameters, nonzero, path.stat().st_size, float(np.median(rounds_)),
                            (min(rounds_), max(rounds_)), float(np.mean(predicted == labels.numpy()))))
    return CompressionTable(rows, [f"Each variant exported to ONNX and run in ONNX Runtime on one thread; latency: the median of "
                                   f"{rounds} rounds in which the variants take turns, and the rounds' range; accuracy on the same "
                                   "held-out digits."])
