"""Correct timing, and the benchmarks of Lecture 1: matmul across sizes/dtypes, host-device copies, cuDNN autotuning.

``timeit`` is the one timing primitive: torch.utils.benchmark with the device
synchronised around each timed block, a warm-up call first, and all CPU threads
(torch.utils.benchmark silently defaults to one). Every sweep returns a report
(see ``helpers.core.report``) that prints a table, plots itself, and keeps its numbers.
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import psutil
import torch

from helpers.core import plots
from helpers.core.device import DTYPES, fast_dtypes, gpu_available, gpu_notice, is_gpu, peak_flops, pick_device, synchronize
from helpers.core.report import Column, Report, format_bytes, format_seconds
from helpers.core.timing import time_once, timeit


@contextlib.contextmanager
def matmul_precision(dtype: str) -> Iterator[None]:
    """Within the block, fp32 CUDA matmuls use TF32 tensor cores iff ``dtype == 'tf32'``."""
    with _temporarily(torch.backends.cuda.matmul, "fp32_precision", "tf32" if dtype == "tf32" else "ieee"):
        yield


# ---------------------------------------------------------------- matmul


def matmul_gflops(n: int, seconds: float) -> float:
    """Achieved GFLOP/s of an n x n by n x n matmul: 2 n^3 floating-point operations."""
    return 2 * n**3 / seconds / 1e9


@dataclass
class MatmulPoint:
    device: str
    dtype: str
    n: int
    seconds: float
    gflops: float
    peak_gflops: float | None
    pct_of_peak: float | None


def time_matmul(n: int, device: str | torch.device = "cpu", dtype: str = "fp32", min_run_time: float = 0.1) -> MatmulPoint:
    """Time ``a @ b`` for n x n matrices of ``dtype`` on ``device`` and derive GFLOP/s and % of peak."""
    device = torch.device(device)
    a = torch.randn(n, n, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, device=device).to(DTYPES[dtype])
    with matmul_precision(dtype):
        seconds = timeit(torch.matmul, a, b, device=device, min_run_time=min_run_time).median
    achieved = matmul_gflops(n, seconds)
    peak = peak_flops(device, dtype)
    peak_g = peak / 1e9 if peak else None
    return MatmulPoint(device.type, dtype, n, seconds, achieved, peak_g, 100 * achieved / peak_g if peak_g else None)


DEFAULT_SIZES = {"cpu": (64, 128, 256, 512, 1024, 2048), "cuda": (256, 512, 1024, 2048, 4096, 8192)}
LINE_STYLES = {"fp32": "-", "tf32": "-.", "bf16": "--", "fp16": ":"}


class MatmulSweep(Report):
    """Achieved matmul throughput by device, dtype and size."""

    title = "Matrix multiplication: achieved throughput"
    columns = (
        Column("device", "device"),
        Column("dtype", "dtype"),
        Column("n", "n"),
        Column("seconds", "time", format_seconds),
        Column("gflops", "GFLOP/s", ",.1f"),
        Column("peak_gflops", "peak GFLOP/s", ",.0f"),
        Column("pct_of_peak", "% of peak", ".1f"),
    )

    def curves(self) -> dict[str, list[MatmulPoint]]:
        """Points grouped into one curve per 'device dtype'."""
        out: dict[str, list[MatmulPoint]] = {}
        for p in self.rows:
            out.setdefault(f"{p.device} {p.dtype}", []).append(p)
        return out

    def best(self, device: str, dtype: str) -> MatmulPoint:
        """The fastest point (highest GFLOP/s) of one curve."""
        return max(self.curves()[f"{device} {dtype}"], key=lambda p: p.gflops)

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
) -> MatmulSweep:
    """Time n x n matmuls for every size x device x dtype.

    Defaults: the CPU, plus the GPU when there is one; each device's natively
    supported dtypes (fp32, tf32, fp16, bf16 on a recent GPU; fp32 and bf16 on a
    CPU with bf16 instructions); sizes suited to each device.
    """
    devices = list(devices) if devices else ["cpu"] + (["cuda"] if gpu_available() else [])
    rows = []
    for device in devices:
        device = str(pick_device(device))
        for dtype in dtypes or fast_dtypes(device):
            for n in sizes or DEFAULT_SIZES[torch.device(device).type]:
                rows.append(time_matmul(n, device, dtype, min_run_time))
    return MatmulSweep(rows)


class ShapeEffect(MatmulSweep):
    """The same matmul at an aligned size and at one less: tensor cores want multiples of 8/16/64."""

    title = "Matmul at an aligned vs an unaligned size"

    def __init__(self, rows, notice: str | None = None):
        super().__init__(rows)
        self.notice = notice
        self.slowdown = rows[1].seconds / rows[0].seconds

    def table(self) -> str:
        return super().table() + f"\n(n={self.rows[1].n} takes {self.slowdown:.2f}x the time of n={self.rows[0].n})"

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


# ---------------------------------------------------------------- the classic mistakes


@dataclass
class Mistake:
    mistake: str
    wrong_seconds: float
    right_seconds: float
    lesson: str


class Mistakes(Report):
    """Each benchmarking mistake measured the wrong way and the right way, side by side."""

    title = "Benchmarking mistakes: wrong vs right"
    columns = (
        Column("mistake", "mistake"),
        Column("wrong_seconds", "measured wrongly", format_seconds),
        Column("right_seconds", "measured rightly", format_seconds),
        Column("lesson", "lesson"),
    )

    def __init__(self, rows, device: torch.device, notice: str | None):
        super().__init__(rows)
        self.device = device
        self.notice = notice

    def plot(self, ax=None):
        return plots.grouped_bars(
            [r.mistake for r in self.rows],
            {"wrong": [r.wrong_seconds * 1e3 for r in self.rows], "right": [r.right_seconds * 1e3 for r in self.rows]},
            ax,
            title=self.title,
            ylabel="milliseconds",
        )


def _median_of(fn: Callable[[], float], repeats: int) -> float:
    values = sorted(fn() for _ in range(repeats))
    return values[len(values) // 2]


def benchmark_mistakes(device: str | torch.device | None = None, n: int | None = None, steps: int = 50) -> Mistakes:
    """Measure three classic mistakes wrong and right on ``device``.

    1. timing an asynchronous GPU call without synchronising (on a CPU, ops are
       synchronous, so both columns agree: that is the CPU side);
    2. timing only the first training step, which allocates gradients and optimizer
       state (and, on a GPU, selects kernels);
    3. calling ``.item()`` every step, which forces a device-to-host sync each time.
    """
    device = pick_device(device)
    notice = gpu_notice("asynchronous kernel launches", device)
    n = n or (4096 if is_gpu(device) else 512)
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    torch.matmul(a, b)
    synchronize(device)
    no_sync = Mistake(
        "no synchronisation",
        _median_of(lambda: time_once(lambda: torch.matmul(a, b)), 7),
        _median_of(lambda: time_once(lambda: torch.matmul(a, b), sync=device), 7),
        "GPU calls return before the work is done: synchronise before reading the clock",
    )

    # A freshly built model's first training step pays one-off costs: allocating gradients and Adam's
    # state (fresh pages, on a CPU), and on a GPU library handles and kernel selection. One first step
    # is one noisy reading, so the mistake is the median first step of several fresh models.
    hidden = 4096 if is_gpu(device) else 1024

    def fresh_training_step() -> Callable[[], None]:
        net = torch.nn.Sequential(torch.nn.Linear(1024, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1024)).to(device)
        optimizer = torch.optim.Adam(net.parameters())
        inputs = torch.randn(64, 1024, device=device)

        def train_step():
            optimizer.zero_grad()
            net(inputs).square().mean().backward()
            optimizer.step()
        return train_step

    first = statistics.median(time_once(fresh_training_step(), sync=device) for _ in range(5))
    no_warmup = Mistake("no warm-up", first, timeit(fresh_training_step(), device=device, min_run_time=0.2).median,
                        "the first call pays one-off costs: warm up, then time many calls")

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)).to(device)
    batch = torch.randn(64, 256, device=device)

    @torch.no_grad()
    def item_every_step() -> float:
        return sum(model(batch).sum().item() for _ in range(steps))

    @torch.no_grad()
    def item_once() -> float:
        total = torch.zeros((), device=device)
        for _ in range(steps):
            total += model(batch).sum()
        return total.item()

    item = Mistake(
        f".item() in a {steps}-step loop",
        timeit(item_every_step, device=device, min_run_time=0.2).median,
        timeit(item_once, device=device, min_run_time=0.2).median,
        "each .item() waits for the device: accumulate on the device, read once",
    )
    return Mistakes([no_sync, no_warmup, item], device, notice)


# ---------------------------------------------------------------- the caching allocator


@dataclass
class MemoryReading:
    stage: str
    allocated_bytes: int | None
    reserved_bytes: int | None


class AllocatorDemo(Report):
    """What the allocator reports after allocating, freeing, and emptying its cache."""

    title = "memory_allocated vs memory_reserved"
    columns = (
        Column("stage", "stage"),
        Column("allocated_bytes", "allocated (tensors)", format_bytes),
        Column("reserved_bytes", "reserved (held by the process)", format_bytes),
    )

    def __init__(self, rows, notice: str | None):
        super().__init__(rows)
        self.notice = notice

    def plot(self, ax=None):
        return plots.grouped_bars(
            [r.stage for r in self.rows],
            {"allocated": [(r.allocated_bytes or 0) / 2**20 for r in self.rows], "reserved": [(r.reserved_bytes or 0) / 2**20 for r in self.rows]},
            ax,
            title=self.title,
            ylabel="MiB",
        )


def caching_allocator_demo(device: str | torch.device | None = None, mib: int = 256) -> AllocatorDemo:
    """Allocate ``mib`` MiB, free it, then empty the cache, reading the allocator at each stage.

    On a GPU, ``del`` returns the block to PyTorch's caching allocator, not to the
    driver: memory_allocated drops, memory_reserved does not until empty_cache().
    On a CPU there is no such cache; the CPU side shows the process's resident
    memory (RSS), which large frees give back to the OS at once.
    """
    device = pick_device(device)
    notice = gpu_notice("the CUDA caching allocator", device)
    numel = mib * 2**20 // 4
    if is_gpu(device):
        def read(stage: str) -> MemoryReading:
            return MemoryReading(stage, torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device))
        torch.cuda.empty_cache()
        readings = [read("before")]
        x = torch.ones(numel, device=device)
        readings.append(read(f"after allocating {mib} MiB"))
        del x
        readings.append(read("after del"))
        torch.cuda.empty_cache()
        readings.append(read("after empty_cache()"))
    else:
        process = psutil.Process()

        def read(stage: str) -> MemoryReading:
            return MemoryReading(stage, None, process.memory_info().rss)
        readings = [read("before")]
        x = torch.ones(numel)
        readings.append(read(f"after allocating {mib} MiB"))
        del x
        readings.append(read("after del"))
    return AllocatorDemo(readings, notice)


# ---------------------------------------------------------------- host-device transfers


@dataclass
class TransferPoint:
    size_bytes: int
    pageable_gbs: float | None
    pinned_gbs: float | None
    host_copy_gbs: float


class TransferSweep(Report):
    """Copy bandwidth by size: host-to-device from pageable and from pinned memory, and host-to-host."""

    title = "Copy bandwidth"
    columns = (
        Column("size_bytes", "size", format_bytes),
        Column("pageable_gbs", "H2D pageable GB/s", ".2f"),
        Column("pinned_gbs", "H2D pinned GB/s", ".2f"),
        Column("host_copy_gbs", "host->host GB/s", ".2f"),
    )

    def __init__(self, rows, notice: str | None):
        super().__init__(rows)
        self.notice = notice

    def plot(self, ax=None):
        sizes = [r.size_bytes / 2**20 for r in self.rows]
        series = {"host copy": (sizes, [r.host_copy_gbs for r in self.rows])}
        if self.rows and self.rows[0].pinned_gbs is not None:
            series = {"pageable": (sizes, [r.pageable_gbs for r in self.rows]), "pinned": (sizes, [r.pinned_gbs for r in self.rows]), **series}
        ax = plots.line_chart(series, ax, title=self.title, xlabel="size, MiB (log scale)", ylabel="GB/s", logx=True)
        return ax


def _bandwidth(copy: Callable[[], object], nbytes: int, device: torch.device | None, min_run_time: float) -> float:
    return nbytes / timeit(copy, device=device, min_run_time=min_run_time).median / 1e9


def transfer_sweep(sizes_mib: Sequence[float] | None = None, device: str | torch.device | None = None, min_run_time: float = 0.1) -> TransferSweep:
    """Measure host-to-device copy bandwidth, pageable vs pinned, across sizes.

    Pinned (page-locked) memory lets the GPU's DMA engine read host memory
    directly; pageable memory is first staged through a pinned buffer by the
    driver. Host-to-host copy bandwidth is measured too, as a reference and as the
    CPU side when there is no GPU.
    """
    device = pick_device(device)
    notice = gpu_notice("host-to-device copying", device)
    sizes_mib = sizes_mib or ((1, 4, 16, 64, 256) if is_gpu(device) else (1, 4, 16, 64))
    rows = []
    for mib in sizes_mib:
        nbytes = int(mib * 2**20)
        src = torch.ones(nbytes, dtype=torch.uint8)
        host_dst = torch.empty_like(src)
        host = _bandwidth(lambda: host_dst.copy_(src), nbytes, None, min_run_time)
        pageable = pinned = None
        if is_gpu(device):
            dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
            pinned_src = src.pin_memory()
            pageable = _bandwidth(lambda: dst.copy_(src), nbytes, device, min_run_time)
            pinned = _bandwidth(lambda: dst.copy_(pinned_src, non_blocking=True), nbytes, device, min_run_time)
        rows.append(TransferPoint(nbytes, pageable, pinned, host))
    return TransferSweep(rows, notice)


@dataclass
class OverlapRow:
    strategy: str
    seconds: float


class Overlap(Report):
    """Copying batches to the device while computing on the previous ones."""

    title = "Overlapping host-to-device copies with compute"
    columns = (Column("strategy", "strategy"), Column("seconds", "time", format_seconds))

    def __init__(self, rows, notice: str | None):
        super().__init__(rows)
        self.notice = notice

    def seconds(self, strategy_prefix: str) -> float:
        return next(r.seconds for r in self.rows if r.strategy.startswith(strategy_prefix))

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, xlabel="milliseconds")
        ax.barh([r.strategy for r in self.rows][::-1], [r.seconds * 1e3 for r in self.rows][::-1], color=plots.CYCLE[: len(self.rows)])
        return ax


def copy_compute_overlap(device: str | torch.device | None = None, batches: int = 8, batch_mib: int = 64, compute_n: int | None = None) -> Overlap:
    """Time ``batches`` copy+compute steps: one after the other, and with copies overlapped.

    Overlap needs pinned memory, ``non_blocking=True`` and a second CUDA stream;
    non_blocking from pageable memory silently degrades to a synchronous copy.
    Without a GPU there is no DMA engine to overlap with: the CPU side reports
    copy-only and compute-only times, whose sum is what sequential execution costs.
    """
    device = pick_device(device)
    notice = gpu_notice("copy/compute overlap", device)
    numel = batch_mib * 2**20 // 4
    compute_n = compute_n or (4096 if is_gpu(device) else 512)
    weight = torch.randn(compute_n, compute_n, device=device)

    def compute():
        return weight @ weight

    host = [torch.randn(numel) for _ in range(batches)]
    if not is_gpu(device):
        targets = [torch.empty(numel) for _ in range(batches)]
        copy_s = timeit(lambda: [t.copy_(h) for t, h in zip(targets, host)], min_run_time=0.2).median
        compute_s = timeit(lambda: [compute() for _ in range(batches)], min_run_time=0.2).median
        rows = [OverlapRow("copies only (host->host)", copy_s), OverlapRow("compute only", compute_s), OverlapRow("copy then compute (sum)", copy_s + compute_s)]
        return Overlap(rows, notice)

    pinned = [h.pin_memory() for h in host]
    targets = [torch.empty(numel, device=device) for _ in range(batches)]
    copy_stream = torch.cuda.Stream(device)

    def copies_only():
        for t, h in zip(targets, pinned):
            t.copy_(h, non_blocking=True)

    def sequential_pageable():
        for t, h in zip(targets, host):
            t.copy_(h)
            compute()

    def non_blocking_pageable():
        for t, h in zip(targets, host):
            t.copy_(h, non_blocking=True)
            compute()

    def overlapped_pinned():
        # copy batch i+1 on a side stream while the default stream computes on batch i
        for t, h in zip(targets, pinned):
            with torch.cuda.stream(copy_stream):
                t.copy_(h, non_blocking=True)
            compute()
        torch.cuda.current_stream(device).wait_stream(copy_stream)

    measure = lambda fn: timeit(fn, device=device, min_run_time=0.3).median  # noqa: E731
    copy_s, compute_s = measure(copies_only), measure(lambda: [compute() for _ in range(batches)])
    rows = [
        OverlapRow("copies only (pinned)", copy_s),
        OverlapRow("compute only", compute_s),
        OverlapRow("copy then compute (pageable)", measure(sequential_pageable)),
        OverlapRow("non_blocking from pageable memory", measure(non_blocking_pageable)),
        OverlapRow("non_blocking from pinned memory, side stream", measure(overlapped_pinned)),
        OverlapRow("ideal: max(copies, compute)", max(copy_s, compute_s)),
    ]
    return Overlap(rows, notice)


# ---------------------------------------------------------------- cudnn.benchmark


@dataclass
class ConvTiming:
    setting: str
    forward_seconds: float
    forward_backward_seconds: float


class ConvAutotune(Report):
    """A convolution's forward and forward+backward time with algorithm autotuning off and on."""

    title = "Convolution: autotuning off vs on"
    columns = (
        Column("setting", "setting"),
        Column("forward_seconds", "forward", format_seconds),
        Column("forward_backward_seconds", "forward + backward", format_seconds),
    )

    def __init__(self, rows, notice: str | None):
        super().__init__(rows)
        self.notice = notice
        self.forward_speedup = rows[0].forward_seconds / rows[1].forward_seconds
        self.forward_backward_speedup = rows[0].forward_backward_seconds / rows[1].forward_backward_seconds

    def table(self) -> str:
        return super().table() + f"\nspeed-up: forward {self.forward_speedup:.2f}x, forward + backward {self.forward_backward_speedup:.2f}x"

    def plot(self, ax=None):
        return plots.grouped_bars(
            ["forward", "forward + backward"],
            {r.setting: [r.forward_seconds * 1e3, r.forward_backward_seconds * 1e3] for r in self.rows},
            ax,
            title=self.title,
            ylabel="milliseconds",
        )


def _time_conv(conv: torch.nn.Module, x: torch.Tensor, device: torch.device, setting: str) -> ConvTiming:
    def forward_backward():
        conv(x).sum().backward()

    with torch.no_grad():
        forward = timeit(conv, x, device=device, min_run_time=0.2).median
    return ConvTiming(setting, forward, timeit(forward_backward, device=device, min_run_time=0.2).median)


def cudnn_benchmark_demo(device: str | torch.device | None = None, batch: int = 32, channels: int = 64, size: int = 64, filters: int = 64) -> ConvAutotune:
    """Time a 3x3 convolution (``filters`` filters on a batch x channels x size x size input).

    On a GPU: ``torch.backends.cudnn.benchmark`` off (cuDNN's heuristic picks an
    algorithm) vs on (the first call tries them all and caches the fastest for this
    shape). On a CPU: the analogous library switch, oneDNN on vs off.
    """
    device = pick_device(device)
    notice = gpu_notice("cudnn.benchmark", device)
    conv = torch.nn.Conv2d(channels, filters, 3, padding=1).to(device)
    x = torch.randn(batch, channels, size, size, device=device, requires_grad=True)
    if is_gpu(device):
        switch = (torch.backends.cudnn, "benchmark", ("cudnn.benchmark = False", "cudnn.benchmark = True"))
    else:
        switch = (torch.backends.mkldnn, "enabled", ("oneDNN (mkldnn) off", "oneDNN (mkldnn) on"))
    module, attribute, settings = switch
    rows = []
    for setting, value in zip(settings, (False, True)):
        with _temporarily(module, attribute, value):
            rows.append(_time_conv(conv, x, device, setting))
    return ConvAutotune(rows, notice)


@contextlib.contextmanager
def _temporarily(obj: object, attribute: str, value: object) -> Iterator[None]:
    """Set ``obj.attribute = value`` for the duration of the block."""
    previous = getattr(obj, attribute)
    setattr(obj, attribute, value)
    try:
        yield
    finally:
        setattr(obj, attribute, previous)


# ---------------------------------------------------------------- parallelism across a batch


@dataclass
class BatchPoint:
    batch: int
    step_seconds: float
    samples_per_second: float
    speedup_per_sample: float


class BatchThroughput(Report):
    """Training-step time and throughput against batch size: how much parallelism a batch exposes."""

    title = "Training throughput against batch size"
    columns = (
        Column("batch", "batch"),
        Column("step_seconds", "time per step", format_seconds),
        Column("samples_per_second", "samples/s", ",.0f"),
        Column("speedup_per_sample", "per-sample speed-up vs batch 1", ".1f"),
    )

    def __init__(self, rows, device: torch.device, model_name: str):
        super().__init__(rows, [f"{model_name} on {device}: forward, backward and an SGD step per timed call (helpers.timeit)."])
        self.device = device

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
) -> BatchThroughput:
    """Time one SGD training step of ``model`` at each batch size (inputs of ``input_shape`` per sample).

    A batch's samples are independent until their gradients are summed, so a larger
    batch hands the hardware more parallel work per step: samples/s rises until the
    device is full, then flattens. ``num_threads``: CPU threads (default: all torch has).
    """
    device = pick_device(device)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    rows = []
    for batch in batch_sizes:
        x = torch.randn(batch, *input_shape, device=device)

        def step():
            optimizer.zero_grad()
            model(x).float().sum().backward()
            optimizer.step()

        seconds = timeit(step, device=device, min_run_time=min_run_time, num_threads=num_threads).median
        per_sample = seconds / batch
        rows.append(BatchPoint(batch, seconds, batch / seconds, (rows[0].step_seconds / rows[0].batch) / per_sample if rows else 1.0))
    return BatchThroughput(rows, device, type(model).__name__)
