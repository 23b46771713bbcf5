"""Making the served model cheaper: int8 quantisation (dynamic and static), distillation into a smaller student, pruning.

Every variant is exported to ONNX and timed in ONNX Runtime on the same held-out digits, so that size,
latency and accuracy sit in one table. (torch.ao.quantization is deprecated in favour of torchao; ONNX
Runtime's quantiser is the maintained path for a CPU deployment.)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.nn.utils import prune

from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import timeit
from helpers.serving.export import export_onnx, onnx_session
from helpers.serving.model import train_mnist_model


def pruned(model: nn.Module, amount: float) -> nn.Module:
    """A copy with the smallest ``amount`` of each Linear layer's weights (by magnitude) set to zero, permanently."""
    if not 0 <= amount < 1:
        raise ValueError(f"amount is the share of weights removed: 0 <= amount < 1, got {amount}")
    copied = copy.deepcopy(model)
    for module in copied.modules():
        if isinstance(module, nn.Linear):
            prune.l1_unstructured(module, "weight", amount)
            prune.remove(module, "weight")
    return copied.eval()


def distilled(teacher: nn.Module, hidden: int, epochs: int = 4) -> tuple[nn.Module, nn.Module]:
    """(student trained on the teacher's soft answers, the same student trained on labels alone), for comparison."""
    student, _ = train_mnist_model(epochs=epochs, hidden=hidden, teacher=teacher.eval())
    alone, _ = train_mnist_model(epochs=epochs, hidden=hidden)
    return student, alone


class _Calibration:
    """Feeds ONNX Runtime's static quantiser a few batches of real digits to measure activation ranges."""

    def __init__(self, pixels: torch.Tensor, batch: int = 50):
        self.batches = iter([{"pixels": pixels[i:i + batch].numpy()} for i in range(0, len(pixels), batch)])

    def get_next(self):
        return next(self.batches, None)


def quantize_static_onnx(path: str | Path, out: str | Path, calibration_pixels: torch.Tensor) -> Path:
    """Static int8: weights and activations in 8 bits, activation scales calibrated on real inputs."""
    import logging

    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(path), str(out), _Calibration(calibration_pixels), quant_format=QuantFormat.QDQ,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QInt8)
    return Path(out)


@dataclass
class Variant:
    variant: str = column("model")
    parameters: int = column("parameters", ",")
    nonzero: float = column("nonzero weights", ".0%")
    file_size: int = column("ONNX file", format_bytes)
    latency: float = column("latency (batch 64)", format_seconds)
    accuracy: float = column("held-out accuracy", ".1%")


class CompressionTable(Report):
    """Size, latency and accuracy of each cheaper variant of the served model, side by side."""

    title = "Cheaper models: size, latency, accuracy"

    def plot(self, ax=None):
        from helpers.core.plots import labelled_scatter

        points = {r.variant: (r.latency * 1e6, r.accuracy * 100) for r in self.rows}
        notes = {r.variant: format_bytes(r.file_size) for r in self.rows}
        return labelled_scatter(points, ax, notes, title=self.title, xlabel="latency per batch of 64 (us, ONNX Runtime, 1 thread)",
                                ylabel="held-out accuracy (%)")


def compression_table(variants: dict[str, nn.Module | Path], pixels: torch.Tensor, labels: torch.Tensor, folder: Path,
                      min_run_time: float = 0.1) -> CompressionTable:
    """Export each torch model (or take each ONNX file) in ``variants``; time and score it in ONNX Runtime."""
    rows = []
    batch = pixels[:64].numpy()
    for name, variant in variants.items():
        if isinstance(variant, nn.Module):
            weights = [m.weight for m in variant.modules() if isinstance(m, nn.Linear)]
            parameters = sum(p.numel() for p in variant.parameters())
            nonzero = sum(int((w != 0).sum()) for w in weights) / sum(w.numel() for w in weights)
            path = export_onnx(variant, folder / f"{name.replace(' ', '_').replace(',', '')}.onnx")
        else:
            path, parameters, nonzero = Path(variant), rows[0].parameters if rows else 0, 1.0
        session = onnx_session(path)
        latency = timeit(lambda: session.run(None, {"pixels": batch}), min_run_time=min_run_time, num_threads=1).median
        predicted = session.run(None, {"pixels": pixels.numpy()})[0].argmax(1)
        rows.append(Variant(name, parameters, nonzero, path.stat().st_size, latency, float(np.mean(predicted == labels.numpy()))))
    return CompressionTable(rows, ["Each variant exported to ONNX and run in ONNX Runtime on one thread; "
                                   "accuracy on the same held-out digits."])



