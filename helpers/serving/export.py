"""Lecture 7's reports on model formats: each format's answers against eager PyTorch, and each file's size and accuracy.

The formats themselves (torch.export's graph, the ONNX file, its int8 copy, TorchScript) and the ONNX
Runtime sessions are made in the lecture's cells; these functions take them as arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from helpers.core.report import Report, column, format_bytes


@dataclass
class ParityRow:
    format: str = column("format")
    batch: int = column("batch", ",")
    max_abs_difference: float = column("max |logits - eager|", ".2e")
    same_digits: float = column("same digits", ".1%")
    within_tolerance: bool = column("within tolerance")


class Parity(Report):
    """Each exported format's logits against eager PyTorch's, at several batch sizes."""

    title = "Parity with eager PyTorch"

    def __init__(self, rows, tolerance: float, int8_tolerance: float):
        self.tolerance = tolerance
        super().__init__(rows, [f"tolerance: max |difference| <= {tolerance:g} for float32 formats, "
                                f"<= {int8_tolerance:.0%} of the largest |logit| for int8 weights (held-out digits as inputs)"])

    @property
    def ok(self) -> bool:
        return all(r.within_tolerance for r in self.rows)


def parity(model: nn.Module, formats: dict[str, object], pixels: torch.Tensor, batch_sizes: Sequence[int] = (1, 7, 64),
           tolerance: float = 1e-4, int8_tolerance: float = 0.05) -> Parity:
    """Compare ``formats`` ({name: ONNX session or torch module}) with eager ``model`` on the first images of ``pixels``.

    Float32 formats must agree to ``tolerance``; a format named with "int8" rounds its weights, so its
    logits may move up to ``int8_tolerance`` times the largest |logit| of eager's answers.
    """
    rows = []
    for name, runner in formats.items():
        for batch in batch_sizes:
            images = pixels[:batch]
            with torch.no_grad():
                expected = model(images).numpy()
            if hasattr(runner, "run"):
                got = runner.run(None, {"pixels": images.numpy()})[0]
            else:
                with torch.no_grad():
                    got = runner(images).numpy()
            difference = float(np.abs(got - expected).max())
            same = float((got.argmax(1) == expected.argmax(1)).mean())
            rows.append(ParityRow(name, batch, difference, same,
                                  difference <= (int8_tolerance * float(np.abs(expected).max()) if "int8" in name else tolerance)))
    return Parity(rows, tolerance, int8_tolerance)


@dataclass
class FormatRow:
    format: str = column("format")
    size: int = column("file size", format_bytes)
    accuracy: float = column("held-out accuracy", ".1%")


class Formats(Report):
    title = "Model files"


def file_sizes_and_accuracy(files: dict[str, Path], sessions: dict[str, object], pixels: torch.Tensor,
                            labels: torch.Tensor) -> Formats:
    rows = []
    for name, path in files.items():
        digits = sessions[name].run(None, {"pixels": pixels.numpy()})[0].argmax(1)
        rows.append(FormatRow(name, Path(path).stat().st_size, float((digits == labels.numpy()).mean())))
    return Formats(rows)
