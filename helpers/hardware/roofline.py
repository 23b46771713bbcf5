"""The roofline of this device, and where real operators land under it.

A processor has two ceilings: how fast it computes (peak FLOP/s) and how fast memory feeds it (bytes/s).
An operator that does F FLOPs while moving B bytes has an arithmetic intensity of I = F / B FLOP/byte and
can run no faster than ``min(peak, I x bandwidth)``: its *roof*. Below the ridge point, peak / bandwidth,
the bandwidth term is the lower one and the operator is memory-bound; at or above it, compute-bound.

Conventions (the same for every operator here):

* bytes are *minimal* bytes: every input read once and every output written once, at the tensors' dtype.
  A real kernel may move more (an unfused attention writes and rereads its L x L scores) or fetch less
  from memory when its data stays in cache; both show up as distance from the roof, or a point above it.
* a multiply-add is 2 FLOPs (as ``torch.utils.flop_counter`` counts); an element-wise add or ReLU is 1 FLOP
  per output element; attention counts its two matrix products (4 B H L^2 d), not the softmax.

``operator_roofline()`` measures a default set (matmuls of several sizes, add, ReLU, a 3x3 convolution,
``scaled_dot_product_attention``); ``measure_roofline()`` takes any list of ``Workload``s.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import psutil
import torch
import torch.nn.functional as F
from matplotlib.ticker import FuncFormatter

from helpers.core import plots
from helpers.core.device import DTYPES, cpu_model, gpu_spec, is_gpu, peak_bandwidth, peak_flops, pick_device
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import Turns, time_interleaved

STORAGE_DTYPES = ("fp64", "fp32", "bf16", "fp16")  # tf32 is a matmul mode of fp32 tensors, not a storage format


# ---------------------------------------------------------------- the model


def ridge_point(peak: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the two roofs meet: below it bandwidth limits, above it arithmetic does."""
    _check_positive(peak=peak, bandwidth=bandwidth)
    return peak / bandwidth


def roof(intensity: float, peak: float, bandwidth: float) -> float:
    """The fastest an operator of this arithmetic intensity can run here: min(peak, intensity x bandwidth), FLOP/s."""
    _check_positive(intensity=intensity, peak=peak, bandwidth=bandwidth)
    return min(peak, intensity * bandwidth)


def bound_by(intensity: float, ridge: float) -> str:
    """'memory' below the ridge point, 'compute' at or above it."""
    _check_positive(intensity=intensity, ridge=ridge)
    return "memory" if intensity < ridge else "compute"


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"{name} must be a positive finite number, got {value!r}")


# ---------------------------------------------------------------- operators: FLOPs, bytes, and the call to time


@dataclass(frozen=True)
class Workload:
    """One operator at one size: FLOPs and minimal bytes by the conventions above, and how to run it.

    ``prepare()`` allocates the tensors on the device and returns the call to time, so a workload holds
    no memory until it is measured.
    """

    name: str
    kind: str  # family on the chart: matmul, element-wise, convolution, attention
    shape: str
    dtype: str
    flops: int
    bytes: int
    prepare: Callable[[], Callable[[], object]]

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def _element_size(dtype: str) -> int:
    if dtype not in STORAGE_DTYPES:
        hint = " (TF32 is a matmul mode of fp32 tensors: use fp32)" if dtype == "tf32" else ""
        raise ValueError(f"dtype {dtype!r} is not one the roofline measures{hint}; use one of {', '.join(STORAGE_DTYPES)}")
    return DTYPES[dtype].itemsize


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive whole number, got {value!r}")


def _random(shape: tuple[int, ...], device: torch.device, dtype: str) -> torch.Tensor:
    return torch.randn(shape, device=device).to(DTYPES[dtype])


def matmul_workload(n: int, device: str | torch.device = "cpu", dtype: str = "fp32") -> Workload:
    """``a @ b`` for n x n matrices: 2 n^3 FLOPs; reads a and b, writes the product: 3 n^2 elements."""
    _check_sizes(n=n)
    size, device = _element_size(dtype), torch.device(device)

    def prepare():
        a, b, out = _random((n, n), device, dtype), _random((n, n), device, dtype), _random((n, n), device, dtype)
        return lambda: torch.matmul(a, b, out=out)

    return Workload(f"matmul n={n}", "matmul", f"{n}x{n} @ {n}x{n}", dtype, 2 * n**3, 3 * n * n * size, prepare)


ELEMENTWISE_OPS = {"add": "c = a + b (reads 2, writes 1 per element)", "relu": "y = max(x, 0) (reads 1, writes 1)"}


def elementwise_workload(op: str, numel: int, device: str | torch.device = "cpu", dtype: str = "fp32") -> Workload:
    """An element-wise op over ``numel`` elements: 1 FLOP per element; add moves 3 elements each, ReLU 2.

    Outputs go to a tensor allocated once (``out=``), so the time is the operator's, not the allocator's. The inputs
    hold one value (the time of an add or a ReLU does not depend on it): filling GiB-sized tensors with random
    numbers took longer than timing them.
    """
    if op not in ELEMENTWISE_OPS:
        raise ValueError(f"element-wise op {op!r} is not known; use one of {', '.join(ELEMENTWISE_OPS)}")
    _check_sizes(numel=numel)
    size, device = _element_size(dtype), torch.device(device)

    def prepare():
        a, out = torch.full((numel,), 0.5, device=device, dtype=DTYPES[dtype]), torch.empty(numel, device=device, dtype=DTYPES[dtype])
        if op == "relu":  # relu written as clamp_min, which can write into a tensor allocated once
            return lambda: torch.clamp_min(a, 0, out=out)
        b = torch.full((numel,), -0.25, device=device, dtype=DTYPES[dtype])
        return lambda: torch.add(a, b, out=out)

    touched = 3 if op == "add" else 2
    return Workload(op, "element-wise", f"{numel:,} elements", dtype, numel, touched * numel * size, prepare)


def conv_workload(batch: int, channels: int = 64, size: int = 56, filters: int = 64, kernel: int = 3,
                  device: str | torch.device = "cpu", dtype: str = "fp32") -> Workload:
    """A ``kernel`` x ``kernel`` convolution, stride 1, padded to keep the size, no bias.

    FLOPs: 2 x batch x filters x size^2 (outputs) x channels x kernel^2 (multiply-adds per output).
    Bytes: the input, the weights and the output, once each.
    """
    _check_sizes(batch=batch, channels=channels, size=size, filters=filters, kernel=kernel)
    if kernel % 2 == 0:
        raise ValueError(f"kernel must be odd (padding kernel // 2 then keeps the size), got {kernel}")
    element, device = _element_size(dtype), torch.device(device)
    inputs, weights, outputs = batch * channels * size * size, filters * channels * kernel * kernel, batch * filters * size * size

    def prepare():
        x, w = _random((batch, channels, size, size), device, dtype), _random((filters, channels, kernel, kernel), device, dtype)
        return lambda: F.conv2d(x, w, padding=kernel // 2)

    shape = f"{batch}x{channels}x{size}x{size}, {filters} {kernel}x{kernel} filters"
    flops = 2 * outputs * channels * kernel * kernel
    return Workload(f"conv {kernel}x{kernel}", "convolution", shape, dtype, flops, (inputs + weights + outputs) * element, prepare)


def attention_workload(batch: int, heads: int = 8, seq: int = 512, head_dim: int = 64,
                       device: str | torch.device = "cpu", dtype: str = "fp32") -> Workload:
    """``scaled_dot_product_attention`` on (batch, heads, seq, head_dim) queries, keys and values.

    FLOPs: Q K^T and P V, 2 B H L^2 d each (the softmax is not counted). Bytes: Q, K, V read and the
    output written once (4 B H L d elements), what a fused (flash) kernel moves; an unfused one moves more.
    """
    _check_sizes(batch=batch, heads=heads, seq=seq, head_dim=head_dim)
    element, device = _element_size(dtype), torch.device(device)
    per_tensor = batch * heads * seq * head_dim

    def prepare():
        q, k, v = (_random((batch, heads, seq, head_dim), device, dtype) for _ in range(3))
        return lambda: F.scaled_dot_product_attention(q, k, v)

    flops = 4 * batch * heads * seq * seq * head_dim
    shape = f"B={batch} H={heads} L={seq} d={head_dim}"
    return Workload(f"attention L={seq}", "attention", shape, dtype, flops, 4 * per_tensor * element, prepare)


# Sizes that suit each kind of device: a GPU needs far more work per call than a CPU to show its roofs.
DEFAULT_SIZES = {
    "cpu": {"matmul_sizes": (64, 256, 1024), "conv_batch": 8, "attention_seq": 512},
    "cuda": {"matmul_sizes": (256, 1024, 4096, 8192), "conv_batch": 64, "attention_seq": 2048},
}  # element-wise tensors: as large as the bandwidth arrays (``past_cache_mib``), so that memory, not a cache, serves them


def default_workloads(device: str | torch.device = "cpu", dtype: str = "fp32", matmul_sizes: Sequence[int] | None = None,
                      elementwise_numel: int | None = None, conv_batch: int | None = None, attention_seq: int | None = None,
                      attention_batch: int = 4) -> list[Workload]:
    """Matmuls at ``matmul_sizes``, add and ReLU, one 3x3 convolution (64 -> 64 channels, 56x56) and one attention
    (8 heads of 64); a size left None takes the device's default (``DEFAULT_SIZES``; element-wise tensors of
    ``past_cache_mib`` MiB)."""
    device = torch.device(device)
    defaults = DEFAULT_SIZES["cuda" if is_gpu(device) else "cpu"]
    matmul_sizes = defaults["matmul_sizes"] if matmul_sizes is None else matmul_sizes
    if not matmul_sizes:
        raise ValueError("matmul_sizes is empty: give at least one size, e.g. (64, 256, 1024), or None for the device's")
    numel = past_cache_mib(device) * 2**20 // _element_size(dtype) if elementwise_numel is None else elementwise_numel
    batch = defaults["conv_batch"] if conv_batch is None else conv_batch
    seq = defaults["attention_seq"] if attention_seq is None else attention_seq
    return [
        *(matmul_workload(n, device, dtype) for n in matmul_sizes),
        elementwise_workload("add", numel, device, dtype),
        elementwise_workload("relu", numel, device, dtype),
        conv_workload(batch, device=device, dtype=dtype),
        attention_workload(attention_batch, seq=seq, device=device, dtype=dtype),
    ]


# ---------------------------------------------------------------- the device's two roofs


def copy_workload(mib: int, device: str | torch.device = "cpu") -> Workload:
    """A copy of ``mib`` MiB on ``device``: no FLOPs, ``mib`` MiB read and ``mib`` MiB written. It measures bandwidth."""
    _check_sizes(mib=mib)
    device, numel = torch.device(device), mib * 2**20 // 4

    def prepare():
        src = torch.ones(numel, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    return Workload(f"copy {mib} MiB", "copy", f"{mib} MiB", "fp32", 0, 2 * numel * 4, prepare)


def stream_workloads(mib: int, device: str | torch.device = "cpu") -> list[Workload]:
    """Two streaming kernels over ``mib`` MiB arrays, as STREAM measures bandwidth: a copy and an add (a + b -> c).

    A memory system reaches its attainable bandwidth on some access patterns more than others (a copy may
    take a slower path than an add), so the bandwidth roof is the faster of the two.
    """
    _check_sizes(mib=mib)
    add = elementwise_workload("add", mib * 2**20 // 4, device, "fp32")
    return [copy_workload(mib, device), dataclasses.replace(add, name=f"add {mib} MiB")]


def attainable_bandwidth(streams: Sequence[Workload], timings: Sequence["Timing"]) -> float:
    """Bytes/s: the fastest of the streaming kernels' rates (each the fastest block)."""
    return max(w.bytes / t.fastest for w, t in zip(streams, timings))


def measure_bandwidth(device: str | torch.device | None = None, mib: int | None = None, min_run_time: float = 0.1,
                      rounds: int = 3) -> float:
    """Memory bandwidth in bytes/s: the faster of a copy and an add over ``mib`` MiB arrays on ``device``.

    ``mib`` must lie well past the last-level cache, or the figure is the cache's bandwidth, not memory's; None
    sizes it so (``past_cache_mib``).
    """
    device = pick_device(device)
    streams = stream_workloads(mib or past_cache_mib(device), device)
    return attainable_bandwidth(streams, time_in_turns(streams, device, min_run_time, rounds))


@dataclass(frozen=True)
class Roofs:
    """The two ceilings of a device for one dtype, and where each figure came from."""

    peak: float | None  # FLOP/s; None: the kit knows none (the best measured rate stands in later)
    peak_source: str
    bandwidth: float | None  # bytes/s; None: unknown until measured
    bandwidth_source: str


def device_roofs(device: str | torch.device | None = None, dtype: str = "fp32", peak: float | None = None,
                 bandwidth: float | None = None) -> Roofs:
    """Peak FLOP/s and bandwidth of ``device``: given ones first, else what the kit knows (datasheet, ISA estimate), else None."""
    device = pick_device(device)
    _element_size(dtype)
    where = f"GPU datasheet ({gpu_spec(device).name})" if is_gpu(device) and gpu_spec(device) else "datasheet"
    if peak is not None:
        _check_positive(peak=peak)
        peak_source = "given"
    else:
        peak = peak_flops(device, dtype)
        peak_source = where if is_gpu(device) else f"ISA estimate: cores x reported clock x FLOP/cycle of {cpu_model()}"
        if peak is None:
            peak_source = f"the kit knows no {dtype} peak for this device"
    if bandwidth is not None:
        _check_positive(bandwidth=bandwidth)
        return Roofs(peak, peak_source, bandwidth, "given")
    known = peak_bandwidth(device)
    return Roofs(peak, peak_source, known, where if known else "the kit knows no bandwidth for this device")


# ---------------------------------------------------------------- the report


def format_rate(flops_per_second: float | None) -> str:
    """FLOP/s with an SI prefix: 3.3e11 -> '332 GFLOP/s'."""
    if flops_per_second is None:
        return "n/a"
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1, "")):
        if abs(flops_per_second) >= scale or scale == 1:
            return f"{flops_per_second / scale:.3g} {prefix}FLOP/s"
    raise AssertionError("unreachable")


def intensity_label(value: float) -> str:
    """An intensity tick: 1/8, 1/2, 2, 32 (FLOP/byte); powers of two below one read as fractions."""
    if 0 < value < 1 and abs(1 / value - round(1 / value)) < 1e-9:
        return f"1/{round(1 / value):,}"
    return plots.tick_label(value)


def _percent(value: float) -> str:
    return f"{value:.0f}" if value >= 1 else f"{value:.2g}"


def _count(value: int) -> str:
    return plots.tick_label(value)


@dataclass
class RooflinePoint:
    name: str = column("operator")
    shape: str = column("shape")
    flops: int = column("FLOPs", _count)
    bytes: int = column("bytes (min.)", format_bytes)
    intensity: float = column("FLOP/byte", ".3g")
    seconds: float = column("time", format_seconds)
    achieved: float = column("achieved", format_rate)
    roof: float = column("roof", format_rate)
    pct_of_roof: float = column("% of roof", _percent)
    bound: str = column("bound")
    achieved_bandwidth: float = column("GB/s moved", lambda v: f"{v / 1e9:,.1f}")
    kind: str = ""


def roofline_point(workload: Workload, seconds: float, peak: float, bandwidth: float) -> RooflinePoint:
    """The row of one measured workload: achieved FLOP/s, its roof, the share of the roof reached, the bound."""
    _check_positive(seconds=seconds)
    intensity, ceiling = workload.intensity, roof(workload.intensity, peak, bandwidth)
    achieved = workload.flops / seconds
    return RooflinePoint(workload.name, workload.shape, workload.flops, workload.bytes, intensity, seconds, achieved, ceiling,
                         100 * achieved / ceiling, bound_by(intensity, ridge_point(peak, bandwidth)), workload.bytes / seconds,
                         workload.kind)


AT_ROOF = 0.05  # a point up to 5% above its roof is at it: run-to-run noise in the figures behind the roof is of that order


def largest_cache(device: torch.device) -> int | None:
    """Bytes of the largest cache in front of ``device``'s memory (a GPU's L2, a CPU's last level), or None if unknown."""
    from helpers.hardware.workingset import memory_levels  # lazy: workingset imports more than the roofline needs

    try:
        levels = memory_levels(torch.device(device))[:-1]  # the last level is the memory itself
    except (RuntimeError, OSError, AssertionError):  # AssertionError: a torch built without CUDA asked about a GPU
        return None
    return max((level.bytes for level in levels), default=None) or None


def past_cache_mib(device: str | torch.device, at_least: int = 256, at_most: int = 1024) -> int:
    """MiB per array for measuring memory bandwidth on ``device``: STREAM's rule, each array at least 4x the largest
    cache, as a power of two from ``at_least`` to ``at_most``, and no more than a tenth of the memory free now (a
    roofline holds several such arrays at once). ``at_least`` where the caches are unknown."""
    device = torch.device(device)
    cache, free = largest_cache(device), _free_bytes(device)
    mib = at_least
    while cache and mib * 2**20 < 4 * cache and mib < at_most:
        mib *= 2
    while mib > at_least and 10 * mib * 2**20 > free:
        mib //= 2
    return mib


def _free_bytes(device: torch.device) -> float:
    """Bytes free now on ``device`` (a GPU's memory, else the host's); unlimited for a GPU this machine lacks."""
    if is_gpu(device):
        return torch.cuda.mem_get_info(device)[0] if torch.cuda.is_available() else math.inf
    return psutil.virtual_memory().available


def cache_relation(nbytes: int, device: str | torch.device) -> str:
    """How ``nbytes`` compares with the largest cache in front of ``device``'s memory, in words."""
    cache = largest_cache(torch.device(device))
    if not cache:
        return "the caches' sizes are unknown here"
    return f"{nbytes / cache:.1f}x the largest cache, {format_bytes(cache)}" + (
        "" if nbytes >= 2 * cache else ": not far past it, so a cache may serve part of the traffic")


class Roofline(Report):
    """Measured operators against this device's roofline; ``verdict()`` says which are memory- and which compute-bound."""

    def __init__(self, rows: Sequence[RooflinePoint], device: torch.device, dtype: str, roofs: Roofs, disturbance: str | None = None,
                 noise: float = 0.0):
        if not rows:
            raise ValueError("a roofline needs at least one measured operator")
        if roofs.peak is None or roofs.bandwidth is None:
            raise ValueError("a roofline needs both roofs: measure_roofline() measures a bandwidth the kit does not know "
                             "and stands the best measured rate in for an unknown peak")
        self.device, self.dtype, self.roofs, self.disturbance = torch.device(device), dtype, roofs, disturbance
        self.at_roof = max(AT_ROOF, noise)  # how far above 100% of its roof a point may land and still count as at it
        self.peak, self.bandwidth = roofs.peak, roofs.bandwidth
        self.ridge = ridge_point(self.peak, self.bandwidth)
        self.title = f"Roofline on {self.device} ({dtype})"
        notes = [f"peak {format_rate(self.peak)} ({roofs.peak_source}); bandwidth {self.bandwidth / 1e9:,.1f} GB/s "
                 f"({roofs.bandwidth_source}); ridge point {self.ridge:.3g} FLOP/byte.",
                 "bytes (min.): inputs read once + outputs written once; roof = min(peak, FLOP/byte x bandwidth)."]
        super().__init__(rows, notes)

    def memory_bound(self) -> list[RooflinePoint]:
        return [r for r in self.rows if r.bound == "memory"]

    def compute_bound(self) -> list[RooflinePoint]:
        return [r for r in self.rows if r.bound == "compute"]

    def verdict(self) -> str:
        """What the measurements say, in sentences that hold for whatever machine measured them."""

        def listed(points: list[RooflinePoint]) -> str:
            return ", ".join(f"{p.name} ({p.intensity:.3g})" for p in points) or "none"

        lines = [
            f"Ridge point on {self.device}: {format_rate(self.peak)} / {self.bandwidth / 1e9:,.1f} GB/s = {self.ridge:.3g} FLOP/byte.",
            f"Memory-bound (FLOP/byte below {self.ridge:.3g}): {listed(self.memory_bound())}.",
            f"Compute-bound (FLOP/byte at or above it): {listed(self.compute_bound())}.",
        ]
        memory = self.memory_bound()
        if memory:
            fastest = max(memory, key=lambda r: r.achieved_bandwidth)
            lines.append(f"Among the memory-bound ones, {fastest.name} moved data fastest: {fastest.achieved_bandwidth / 1e9:,.3g} GB/s "
                         f"against the roof's {self.bandwidth / 1e9:,.3g} GB/s. For them more arithmetic per byte would cost "
                         "nothing; fewer bytes (fusion, a smaller dtype) is what helps.")
        below = [r for r in self.rows if r.pct_of_roof <= 100]
        if len(below) > 1:  # points above their roof are read below ("At their roof", "Above their roof")
            best, worst = max(below, key=lambda r: r.pct_of_roof), min(below, key=lambda r: r.pct_of_roof)
            lines.append(f"Of those at or under their roof, closest to it: {best.name} at {_percent(best.pct_of_roof)}%; "
                         f"furthest below it: {worst.name} at {_percent(worst.pct_of_roof)}%.")
        at = [r for r in self.rows if 100 < r.pct_of_roof <= 100 * (1 + self.at_roof)]
        if at:
            lines.append(f"At their roof: {', '.join(f'{r.name} ({_percent(r.pct_of_roof)}%)' for r in at)}: within {self.at_roof:.0%} above "
                         f"it, no more than the timing noise of the roof's own figures ({AT_ROOF:.0%}, or more where the bandwidth "
                         "kernels' blocks spread wider).")
        above = [r for r in self.rows if r.pct_of_roof > 100 * (1 + self.at_roof)]
        if above:
            named = ", ".join(f"{r.name} ({_percent(r.pct_of_roof)}%)" for r in above)
            why = []
            memory = [r for r in above if r.bound == "memory"]
            cache = largest_cache(self.device)
            if any(cache and r.bytes <= cache for r in memory):
                why.append(f"caches serve data faster than the memory bandwidth the roof assumes (the largest cache here holds "
                           f"{format_bytes(cache)})")
            if memory and self.roofs.bandwidth_source.startswith("measured"):
                why.append("streaming kernels timed while other work shared the machine measure too low a bandwidth")
            elif any(not (cache and r.bytes <= cache) for r in memory):
                why.append(f"the bandwidth ({self.roofs.bandwidth_source}) understates what this device did")
            if any(r.bound == "compute" for r in above):
                why.append(f"the peak ({self.roofs.peak_source}) understates what this device did")
            lines.append(f"Above their roof: {named}. A roof is only as good as its figures: {'; '.join(why)}.")
        if self.disturbance:
            lines.append(self.disturbance)
        return "\n".join(lines)

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, xlabel="arithmetic intensity, FLOP/byte (log scale)",
                            ylabel="FLOP/s (log scale)", logx=True, logy=True)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: format_rate(value)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: intensity_label(value)))
        low = min(min(r.intensity for r in self.rows), self.ridge) / 4
        high = max(max(r.intensity for r in self.rows), self.ridge) * 4
        xs = [low, self.ridge, high]
        ax.plot(xs, [roof(x, self.peak, self.bandwidth) for x in xs], color="black", linewidth=2,
                label="roof: min(peak, FLOP/byte x bandwidth)")
        ax.axvline(self.ridge, linestyle="--", color="black", linewidth=1.0, alpha=0.6)
        ridge_label = f"ridge {self.ridge:.3g} FLOP/byte"
        ax.annotate(ridge_label, xy=(self.ridge, 0.02), xycoords=("data", "axes fraction"),
                    xytext=(-3, 0), textcoords="offset points", rotation=90, ha="right", va="bottom", fontsize=8)
        ax.annotate(f"peak {format_rate(self.peak)}", xy=(high, self.peak), textcoords="offset points", xytext=(-4, 4),
                    ha="right", va="bottom", fontsize=9)
        ax.annotate(f"{self.bandwidth / 1e9:,.3g} GB/s", xy=(low, low * self.bandwidth), textcoords="offset points",
                    xytext=(4, 6), ha="left", va="bottom", fontsize=9)
        kinds = list(dict.fromkeys(r.kind for r in self.rows))
        for i, kind in enumerate(kinds):
            points = [r for r in self.rows if r.kind == kind]
            ax.scatter([p.intensity for p in points], [p.achieved for p in points], s=50, zorder=3,
                       color=plots.color_for(kind, i + 1), label=kind)
        _label_points(ax, [(r.intensity, r.achieved, r.name) for r in self.rows], self.ridge, ridge_label)
        ax.legend(loc="upper left")  # far above the sloped roof, where points rarely are
        return ax


def _label_points(ax, points: Sequence[tuple[float, float, str]], ridge: float, ridge_label: str, fontsize: int = 8) -> None:
    """Write each name right of its point, shifted down or up (nearest first, with a leader line) until it clears the
    points, the labels already placed and the ridge's label (written upwards from the foot of the ridge line)."""
    ax.autoscale_view()
    pixels_per_point = ax.figure.dpi / 72
    height = fontsize * 1.3 * pixels_per_point
    where = [(*ax.transData.transform((x, y)), name) for x, y, name in points]
    taken = [(px - 5 * pixels_per_point, px + 5 * pixels_per_point, py) for px, py, _ in where]  # the markers themselves
    ridge_x, foot = ax.transData.transform((ridge, 1.0))[0], ax.transAxes.transform((0.0, 0.02))[1]
    ridge_length = 0.55 * fontsize * pixels_per_point * len(ridge_label)
    bottom, top = ax.transAxes.transform((0.0, 0.0))[1], ax.transAxes.transform((0.0, 1.0))[1]
    taken += [(ridge_x - height, ridge_x, foot + k * height / 2) for k in range(int(ridge_length / (height / 2)) + 1)]
    for (x, y, _), (px, py, name) in sorted(zip(points, where), key=lambda pair: (pair[1][0], -pair[1][1])):
        left = px + 6 * pixels_per_point
        right = left + 0.55 * fontsize * pixels_per_point * len(name)
        candidates = [height * ((step + 1) // 2) * (-1 if step % 2 else 1) for step in range(12)]  # 0, down 1, up 1, ...
        inside = [o for o in candidates if bottom + height / 2 < py + o < top - height / 2] or [0.0]
        offset = next((o for o in inside if not any(abs(py + o - other_y) < height and left < other_right and other_left < right
                                                    for other_left, other_right, other_y in taken)), 0.0)
        taken.append((left, right, py + offset))
        leader = {"arrowprops": {"arrowstyle": "-", "color": "grey", "linewidth": 0.6, "shrinkA": 0, "shrinkB": 4}} if offset else {}
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, offset / pixels_per_point - 3), fontsize=fontsize,
                    va="center" if offset else "baseline", **leader)


def measure_roofline(workloads: Sequence[Workload], device: str | torch.device | None = None, *, peak: float | None = None,
                     bandwidth: float | None = None, bandwidth_mib: int | None = None, min_run_time: float = 0.1,
                     rounds: int = 3) -> Roofline:
    """Time each workload on ``device`` (``time_in_turns``: helpers.timeit, in turns) and place it under the roofline.

    ``peak`` (FLOP/s) and ``bandwidth`` (bytes/s) default to what the kit knows of the device; a bandwidth it
    does not know is measured with streaming kernels over ``bandwidth_mib`` MiB (``stream_workloads``; None:
    ``past_cache_mib``), timed in the same rounds as the operators.
    Without a known peak the best measured rate stands in for it, and the notes say so.
    """
    if not workloads:
        raise ValueError("no workloads to measure: pass a list such as default_workloads(device)")
    dtypes = {w.dtype for w in workloads}
    if len(dtypes) > 1:
        raise ValueError(f"the workloads mix dtypes {sorted(dtypes)}; one roofline is for one dtype: measure each apart")
    device, dtype = pick_device(device), dtypes.pop()
    roofs = device_roofs(device, dtype, peak, bandwidth)
    bandwidth_mib = bandwidth_mib or past_cache_mib(device)
    streams = stream_workloads(bandwidth_mib, device) if roofs.bandwidth is None else []
    timings = time_in_turns([*workloads, *streams], device, min_run_time, rounds)
    note = disturbance_note({w.name: t for w, t in zip([*workloads, *streams], timings)}, device)
    if streams:  # timed in the same rounds as the operators, so both saw the machine in the same state
        stream_timings, timings = timings[len(workloads):], timings[:len(workloads)]
        source = (f"measured: the faster of a copy and an add over {bandwidth_mib} MiB arrays on {device} "
                  f"({cache_relation(bandwidth_mib * 2**20, device)}), timed in turns with the operators, every byte read "
                  "or written counted")
        roofs = dataclasses.replace(roofs, bandwidth=attainable_bandwidth(streams, stream_timings), bandwidth_source=source)
        fastest_stream = max(zip(streams, stream_timings), key=lambda pair: pair[0].bytes / pair[1].fastest)[1]
        noise = fastest_stream.spread - 1  # how far the bandwidth kernel's median block sat above its fastest
    else:
        noise = 0.0
    if roofs.peak is None:
        best = max(w.flops / t.fastest for w, t in zip(workloads, timings))
        roofs = dataclasses.replace(roofs, peak=best, peak_source=f"{roofs.peak_source}: the best measured rate stands in")
    rows = [roofline_point(w, t.fastest, roofs.peak, roofs.bandwidth) for w, t in zip(workloads, timings)]
    return Roofline(rows, device, dtype, roofs, disturbance=note, noise=noise)


@contextlib.contextmanager
def ieee_fp32(device: torch.device) -> Iterator[None]:
    """On a GPU, fp32 matmuls and convolutions run in true fp32 (no TF32) within the block, so the fp32 peak is their roof."""
    targets = [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision")] if is_gpu(device) else []
    saved = [getattr(obj, name) for obj, name in targets]
    for obj, name in targets:
        setattr(obj, name, "ieee")
    try:
        yield
    finally:
        for (obj, name), value in zip(targets, saved):
            setattr(obj, name, value)


Timing = Turns  # seconds per call of one workload: the fastest block ``helpers.timeit`` timed, and the median block

DISTURBED = 1.5  # a median block this many times the fastest means other work shared the machine


def time_in_turns(workloads: Sequence[Workload], device: str | torch.device, min_run_time: float = 0.1,
                  rounds: int = 3) -> list[Timing]:
    """Time each workload on ``device`` with ``helpers.timeit`` over ``rounds`` rounds in which the workloads take turns.

    Taking turns keeps a burst of other work on the machine from falling on one workload only. The
    figure to use is the fastest block: other work only ever adds time, and a roofline asks what an
    operator can do. The median block says how much the timing was disturbed.
    """
    _check_sizes(rounds=rounds)
    device = torch.device(device)
    calls = {i: w.prepare() for i, w in enumerate(workloads)}
    with ieee_fp32(device):
        turns = time_interleaved(calls, device, rounds, min_run_time=min_run_time)
    return [turns[i] for i in calls]


def fastest_seconds(workloads: Sequence[Workload], device: str | torch.device, min_run_time: float = 0.1,
                    rounds: int = 3) -> list[float]:
    """Seconds per call of each workload: the fastest block of ``time_in_turns``."""
    return [t.fastest for t in time_in_turns(workloads, device, min_run_time, rounds)]


def disturbance_note(timings: dict[str, Timing], device: str | torch.device = "cpu") -> str | None:
    """Sentences when other work visibly disturbed ``timings`` (named): blocks far apart, or, for CPU timings, a CPU
    load above its core count; else None."""
    notes = []
    disturbed = {name: t.median / t.fastest for name, t in timings.items() if t.median > DISTURBED * t.fastest}
    if disturbed:
        worst = max(disturbed, key=disturbed.get)
        notes.append(f"For {len(disturbed)} of {len(timings)} timings the median block took over {DISTURBED}x the fastest "
                     f"(up to {disturbed[worst]:.1f}x, {worst}): other work shared the machine.")
    load, cores = _load_average(), psutil.cpu_count(logical=True)
    if not is_gpu(device) and load is not None and cores and load > cores:
        notes.append(f"The CPU was busy: its 1-minute load average was {load:.1f} on {cores} logical cores, so other "
                     "programs competed with these timings.")
    if not notes:
        return None
    return " ".join(notes) + " The fastest blocks are shown; run again on a quiet machine before reading much into them."


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):  # not on this operating system
        return None


def operator_roofline(device: str | torch.device | None = None, dtype: str = "fp32", matmul_sizes: Sequence[int] | None = None,
                      elementwise_numel: int | None = None, conv_batch: int | None = None, attention_seq: int | None = None,
                      attention_batch: int = 4, bandwidth_mib: int | None = None, min_run_time: float = 0.1, rounds: int = 3) -> Roofline:
    """Measure the default operators (``default_workloads``; None: the device's sizes) on ``device`` against its roofline."""
    device = pick_device(device)
    workloads = default_workloads(device, dtype, matmul_sizes, elementwise_numel, conv_batch, attention_seq, attention_batch)
    return measure_roofline(workloads, device, bandwidth_mib=bandwidth_mib, min_run_time=min_run_time, rounds=rounds)
