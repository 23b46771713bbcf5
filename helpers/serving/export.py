"""Model formats: torch.export's graph, one ONNX file with a dynamic batch axis, int8 ONNX, and TorchScript (legacy).

ONNX is what most runtimes read (ONNX Runtime here; TensorRT and Triton elsewhere). torch.export is the
2.x way to capture a whole program as a graph, and the ONNX exporter builds on it. TorchScript
(torch.jit) still runs, but PyTorch has stopped developing it: it is shown only to recognise it.
"""
from __future__ import annotations

import contextlib
import io
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import nn

from helpers.core.report import Report, column, format_bytes
from helpers.serving.model import INPUTS


def example_pixels(batch: int = 2, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, INPUTS, generator=torch.Generator().manual_seed(seed))


def export_program(model: nn.Module, max_batch: int = 4096) -> torch.export.ExportedProgram:
    """The model as torch.export's graph, its batch dimension left symbolic."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return torch.export.export(model.eval(), (example_pixels(),), dynamic_shapes=({0: batch},))


def export_onnx(model: nn.Module, path: str | Path, max_batch: int = 4096) -> Path:
    """One self-contained ONNX file (weights inside) with input ``pixels`` (batch, 784) and output ``logits``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (example_pixels(),), str(path), dynamo=True, external_data=False, verbose=False,
                          input_names=["pixels"], output_names=["logits"], dynamic_shapes=({0: batch},))
    return path


def quantize_onnx(path: str | Path, out: str | Path) -> Path:
    """Dynamic int8 quantisation of an ONNX file's weights (ONNX Runtime's quantiser): activations stay float."""
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)  # the quantiser logs a pre-processing hint at WARNING
    quantize_dynamic(str(path), str(out), weight_type=QuantType.QInt8)
    return Path(out)


def torchscript(model: nn.Module) -> torch.jit.ScriptModule:
    """The legacy format: a traced TorchScript module (torch.jit is in maintenance; prefer torch.export)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(model.eval(), example_pixels())


def onnx_session(path: str | Path, threads: int = 1):
    """An ONNX Runtime CPU session on ``threads`` intra-op threads."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


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
                                f"<= {int8_tolerance:g} for int8 weights (held-out digits as inputs)"])

    @property
    def ok(self) -> bool:
        return all(r.within_tolerance for r in self.rows)


def parity(model: nn.Module, formats: dict[str, object], pixels: torch.Tensor, batch_sizes: Sequence[int] = (1, 7, 64),
           tolerance: float = 1e-4, int8_tolerance: float = 0.1) -> Parity:
    """Compare ``formats`` ({name: ONNX session or torch module}) with eager ``model`` on the first images of ``pixels``.

    Float32 formats must agree to ``tolerance``; a format named with "int8" rounds its weights, so its
    logits may move up to ``int8_tolerance``.
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
                                  difference <= (int8_tolerance if "int8" in name else tolerance)))
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
