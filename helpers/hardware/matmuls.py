"""Matmul throughput across sizes and dtypes, against the device's peak, and the tensor-core shape rule (Lecture 1)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from helpers.core import plots
from helpers.core.device import DTYPES, fast_dtypes, gpu_available, gpu_notice, is_gpu, peak_flops, pick_device
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import time_interleaved, timeit


@contextlib.contextmanager
def temporarily(obj: object, attribute: str, value: object) -> Iterator[None]:
    """Set ``obj.attribute = value`` for the duration of the block."""
    previous = getattr(obj, attribute)
    setattr(obj, attribute, value)
    try:
        yield
    finally:
        setattr(obj, attribute, previous)


@contextlib.contextmanager
def matmul_precision(dtype: str) -> Iterator[None]:
    """Within the block, fp32 CUDA matmuls use TF32 tensor cores iff ``dtype == 'tf32'``."""
    with temporarily(torch.backends.cuda.matmul, "fp32_precision", "tf32" if dtype == "tf32" else "ieee"):
        yield


def matmul_gflops(n: int, seconds: float) -> float:
    """Achieved GFLOP/s of an n x n by n x n matmul: 2 n^3 floating-point operations."""
    return 2 * n**3 / seconds / 1e9


@dataclass
class MatmulPoint:
    device: str = column("device")
    dtype: str = column("dtype")
    n: int = column("n")
    seconds: float = column("time", format_seconds)
    gflops: float = column("GFLOP/s", ",.1f")
    peak_gflops: float | None = column("peak GFLOP/s", ",.0f")
    pct_of_peak: float | None = column("% of peak", ".1f")
    fastest: float | None = None  # seconds of the fastest block, where the point was timed in blocks (``seconds`` is their median)


def matmul_point(n: int, device: str | torch.device, dtype: str, seconds: float, fastest: float | None = None) -> MatmulPoint:
    """The row of an n x n matmul in ``dtype`` on ``device`` that took ``seconds``: GFLOP/s and % of the peak derived from it."""
    device = torch.device(device)
    achieved = matmul_gflops(n, seconds)
    peak = peak_flops(device, dtype)
    peak_g = peak / 1e9 if peak else None
    return MatmulPoint(device.type, dtype, n, seconds, achieved, peak_g, 100 * achieved / peak_g if peak_g else None, fastest)


def time_matmul(n: int, device: str | torch.device | None = None, dtype: str = "fp32", min_run_time: float = 0.1) -> MatmulPoint:
    """Time ``a @ b`` for n x n matrices of ``dtype`` on ``device`` (default: ``pick_device()``) and derive GFLOP/s and % of peak."""
    device = pick_device(device)
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    with matmul_precision(dtype):
        measured = timeit(torch.matmul, a, b, device=device, min_run_time=min_run_time)
    return matmul_point(n, device, dtype, measured.median, min(measured.times))


def _square_product(n: int, device: torch.device, dtype: str):
    """A call that multiplies two n x n matrices of ``dtype``, made once on ``device``; on a GPU, fp32 and TF32 set their own mode."""
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    if not (is_gpu(device) and dtype in ("fp32", "tf32")):
        return lambda: torch.matmul(a, b)
    mode = "tf32" if dtype == "tf32" else "ieee"

    def product():
        torch.backends.cuda.matmul.fp32_precision = mode  # the formats take turns: each call sets its own
        return torch.matmul(a, b)
    return product


DEFAULT_SIZES = {"cpu": (64, 128, 256, 512, 1024, 2048), "cuda": (256, 512, 1024, 2048, 4096, 8192)}
LINE_STYLES = {"fp32": "-", "tf32": "-.", "bf16": "--", "fp16": ":"}


class MatmulSweep(Report):
    """Achieved matmul throughput by device, dtype and size."""

    title = "Matrix multiplication: achieved throughput"

    def point(self, device: str, dtype: str, n: int) -> MatmulPoint | None:
        """The row of ``dtype`` at size n on ``device`` ('cpu', 'cuda'), or None where the sweep did not time it."""
        return next((p for p in self.rows if (p.device, p.dtype, p.n) == (device, dtype, n)), None)

    def curves(self) -> dict[str, list[MatmulPoint]]:
        """Points grouped into one curve per 'device dtype'."""
        out: dict[str, list[MatmulPoint]] = {}
        for p in self.rows:
            out.setdefault(f"{p.device} {p.dtype}", []).append(p)
        return out

    def plot(self, ax=None):
        curves = self.curves()
        series = {name: ([p.n for p in pts], [p.gflops for p in pts]) for name, pts in curves.items()}
        styles = {name: LINE_STYLES.get(name.split()[1], "-") for name in curves}
        ax = plots.line_chart(series, ax, styles=styles, title=self.title, xlabel="matrix size n (log scale)", ylabel="GFLOP/s (log scale)", logx=True, logy=True)
        for name, points in curves.items():
            if points[0].peak_gflops:
                ax.axhline(points[0].peak_gflops, color=plots.color_for(name), linestyle=styles[name], linewidth=0.8, alpha=0.6)
        ax.text(0.01, 0.01, "thin lines: each curve's peak", transform=ax.transAxes, fontsize=8, alpha=0.7)
        return ax


def matmul_sweep(
    sizes: Sequence[int] | None = None,
    devices: Sequence[str] | None = None,
    dtypes: Sequence[str] | None = None,
    min_run_time: float = 0.1,
    rounds: int = 3,
) -> MatmulSweep:
    """Time n x n matmuls for every size x device x dtype.

    Defaults: the CPU, plus the GPU when there is one; each device's natively
    supported dtypes (fp32, tf32, fp16, bf16 on a recent GPU; fp32 and bf16 on a
    CPU with bf16 instructions); sizes suited to each device. At each size the
    dtypes take turns over ``rounds`` rounds of ``helpers.timeit`` runs, so a burst of
    other work on the machine falls on all of them alike; a point's time is the
    median block, and its ``fastest`` the fastest. Rows come dtype by dtype.
    """
    devices = list(devices) if devices else ["cpu"] + (["cuda"] if gpu_available() else [])
    rows = []
    with temporarily(torch.backends.cuda.matmul, "fp32_precision", torch.backends.cuda.matmul.fp32_precision):
        for device in devices:
            device = pick_device(device)
            formats = list(dtypes or fast_dtypes(device))
            by_format: dict[str, list[MatmulPoint]] = {dtype: [] for dtype in formats}
            for n in sizes or DEFAULT_SIZES[device.type]:
                turns = time_interleaved({dtype: _square_product(n, device, dtype) for dtype in formats}, device, rounds,
                                         min_run_time=min_run_time)
                for dtype in formats:
                    by_format[dtype].append(matmul_point(n, device, dtype, turns[dtype].median, turns[dtype].fastest))
            rows += [p for dtype in formats for p in by_format[dtype]]
    return MatmulSweep(rows)


class ShapeEffect(MatmulSweep):
    """The same matmul at an aligned size and at one less: tensor cores want multiples of 8/16/64."""

    title = "Matmul at an aligned vs an unaligned size"

    def __init__(self, rows, notice: str | None = None):
        super().__init__(rows, notice=notice)
        self.slowdown = rows[1].seconds / rows[0].seconds

    def table(self) -> str:
        return super().table() + (f"\n(one reading each, not a verdict: n={self.rows[1].n} took {self.slowdown:.2f}x the time of "
                                  f"n={self.rows[0].n})")

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, ylabel="GFLOP/s")
        ax.bar([f"n={p.n}" for p in self.rows], [p.gflops for p in self.rows], color=[plots.color_for(p.device) for p in self.rows])
        return ax


def tensor_core_shapes(n: int | None = None, device: str | torch.device | None = None, dtype: str | None = None, min_run_time: float = 0.2) -> ShapeEffect:
    """Compare an n x n matmul with an (n-1) x (n-1) one.

    On a GPU (default n=8192, bf16), the odd size misses the tensor cores' tile
    shapes and loses throughput. Without a GPU it explains that and shows the CPU
    side (default n=1024, fp32), where the effect is small.
    """
    device = pick_device(device)
    notice = gpu_notice("the tensor-core shape rule", device)
    n = n or (8192 if is_gpu(device) else 1024)
    dtype = dtype or ("bf16" if is_gpu(device) else "fp32")
    return ShapeEffect([time_matmul(size, device, dtype, min_run_time) for size in (n, n - 1)], notice)
