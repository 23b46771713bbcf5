"""The memory spaces a kernel can keep data in, with their sizes and read bandwidths on this machine.

On a GPU: registers and shared memory (per streaming multiprocessor, SM), the L2
cache and HBM (the whole chip), sizes from the driver, bandwidths measured with
copies (and HBM's datasheet figure). On a CPU: vector registers (per core), the
caches and RAM, sizes from the OS (``workingset.memory_levels``), bandwidths measured
by summing a buffer that fits in each level, over and over, in compiled code; the
fastest of three readings is the level's figure, the slowest says how steady it was.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import psutil
import torch

from helpers.core.cuda_graphs import capture_cuda_graph
from helpers.core.device import cpu_flags, gpu_notice, is_gpu, peak_bandwidth, pick_device
from helpers.core.report import Report, column, format_bytes
from helpers.core.timing import timeit
from helpers.hardware.workingset import memory_levels

BYTES_READ_PER_PROBE = 256 * 2**20  # each bandwidth probe reads about this much in total


@dataclass
class MemorySpace:
    level: str = column("memory space")
    scope: str = column("scope")
    size_bytes: int | None = column("size", format_bytes)
    measured_gbs: float | None = column("read GB/s (measured)", ",.0f")
    datasheet_gbs: float | None = column("GB/s (datasheet)", ",.0f")
    how: str = column("how the bandwidth was measured")
    slowest_gbs: float | None = column("slowest reading, GB/s", ",.0f", optional=True, default=None)


class MemorySpaces(Report):
    """The memory spaces of one device, fastest first; notes give the execution model's numbers (cores or SMs)."""

    def __init__(self, rows, device: torch.device, notes):
        self.device = device
        self.title = f"Memory spaces of {torch.cuda.get_device_name(device) if is_gpu(device) else 'this CPU'} (device {device})"
        super().__init__(rows, notes)


def simd_register_file() -> tuple[int, int] | None:
    """(number, bytes each) of one core's SIMD registers, from the ISA flags; None when unknown (not x86)."""
    flags = cpu_flags()
    if "avx512f" in flags:
        return 32, 64
    if "avx" in flags:
        return 16, 32
    if "sse2" in flags:
        return 16, 16
    return None


def cpu_read_rates(nbytes: int, readings: int = 3) -> list[float]:
    """Read bandwidths in GB/s, one per reading, while summing a float32 buffer of ``nbytes`` over and over."""
    from helpers.hardware.cpu_kernels import read_sum

    buffer = np.ones(max(nbytes // 4, 1024), dtype=np.float32)
    repeats = max(1, BYTES_READ_PER_PROBE // buffer.nbytes)
    read_sum(buffer, 1)  # compile (or load from the cache) and warm the level up
    rates = []
    for _ in range(readings):
        start = time.perf_counter()
        read_sum(buffer, repeats)
        rates.append(buffer.nbytes * repeats / (time.perf_counter() - start) / 1e9)
    return rates


def cpu_read_gbs(nbytes: int) -> float:
    """Read bandwidth in GB/s while summing a float32 buffer of ``nbytes`` over and over (best of 3)."""
    return max(cpu_read_rates(nbytes))


def probe_bytes(level_bytes: int, above_bytes: int | None = None) -> int:
    """The buffer that measures a cache: half of it; for the last, shared cache (``above_bytes``: the size of the level
    above it), at most 4x that level, which is past it all the same.

    The last cache is shared by every core of the chip (on a cloud machine, by other machines' cores too): half of
    a large one is more than one core keeps there, and reading it measures RAM.
    """
    return level_bytes // 2 if above_bytes is None else min(level_bytes // 2, 4 * above_bytes)


COPIES_PER_LAUNCH = 20


def gpu_copy_gbs(nbytes: int, device: torch.device) -> float:
    """Bandwidth in GB/s (bytes read + bytes written) of copying a buffer of ``nbytes`` on the GPU.

    A copy that fits in L2 takes a few microseconds, about as long as the CPU
    needs to launch it, so one launch per copy would time the launches: the
    copies are recorded in a CUDA graph, ``COPIES_PER_LAUNCH`` of them, and
    the graph is replayed.
    """
    source = torch.ones(max(nbytes // 4, 1024), device=device)
    target = torch.empty_like(source)
    graph = capture_cuda_graph(lambda x: [target.copy_(x) for _ in range(COPIES_PER_LAUNCH)], source)
    del source  # the graph copies from its own static input
    seconds = timeit(graph.replay, device=device, min_run_time=0.1).median / COPIES_PER_LAUNCH
    return 2 * target.nbytes / seconds / 1e9


def _cpu_spaces(measure: bool) -> tuple[list[MemorySpace], list[str]]:
    rows = []
    registers = simd_register_file()
    if registers:
        count, width = registers
        rows.append(MemorySpace("SIMD registers", f"per core ({count} x {width * 8}-bit)", count * width, None, None, "not measured: read every cycle"))
    levels = memory_levels(torch.device("cpu"))
    caches, ram = levels[:-1], levels[-1]
    for i, level in enumerate(caches):
        shared_with = caches[i - 1].bytes if i and i == len(caches) - 1 else None  # the last cache, below another one
        nbytes = probe_bytes(level.bytes, shared_with)
        rates = cpu_read_rates(nbytes) if measure else []
        share = "half of it" if nbytes == level.bytes // 2 else f"4x {caches[i - 1].name}: the cache is shared by the chip's cores"
        rows.append(MemorySpace(f"{level.name} cache", "cache of core 0", level.bytes, max(rates, default=None), None,
                                f"sum a {format_bytes(nbytes)} buffer ({share}), one core", min(rates, default=None)))
    far = min(max(4 * (caches[-1].bytes if caches else 0), 64 * 2**20), ram.bytes // 8)
    rates = cpu_read_rates(far) if measure else []
    rows.append(MemorySpace(ram.name, "whole machine", ram.bytes, max(rates, default=None), None, f"sum a {format_bytes(far)} buffer, one core",
                            min(rates, default=None)))
    cores = psutil.cpu_count(logical=False)
    notes = [
        f"This CPU: {cores} physical cores, {psutil.cpu_count(logical=True)} hardware threads; "
        + (f"one instruction works on {registers[1] // 4} float32 values at once (SIMD)." if registers else "SIMD width unknown."),
        "Measured on one core while the machine may be busy with other work: a lower bound on what the level can deliver.",
    ]
    return rows, notes


def _gpu_spaces(device: torch.device, measure: bool) -> tuple[list[MemorySpace], list[str]]:
    props = torch.cuda.get_device_properties(device)
    sms = props.multi_processor_count
    hbm_sheet = peak_bandwidth(device)
    in_l2 = props.L2_cache_size // 4  # source and target both fit in L2
    in_hbm = min(max(8 * props.L2_cache_size, 256 * 2**20), props.total_memory // 8)
    rows = [
        MemorySpace("registers", f"per SM, x{sms} SMs", props.regs_per_multiprocessor * 4, None, None, "not measured: read every cycle"),
        MemorySpace("shared memory / L1", f"per SM, x{sms} SMs", props.shared_memory_per_multiprocessor, None, None, "not measured (an exercise: a Triton kernel that reads one block repeatedly)"),
        MemorySpace("L2 cache", "whole GPU", props.L2_cache_size, gpu_copy_gbs(in_l2, device) if measure else None, None, f"copy a {format_bytes(in_l2)} tensor (read + write), {COPIES_PER_LAUNCH} copies per graph launch"),
        MemorySpace("HBM (GPU memory)", "whole GPU", props.total_memory, gpu_copy_gbs(in_hbm, device) if measure else None, hbm_sheet / 1e9 if hbm_sheet else None, f"copy a {format_bytes(in_hbm)} tensor (read + write), {COPIES_PER_LAUNCH} copies per graph launch"),
    ]
    notes = [
        f"This GPU: {sms} streaming multiprocessors (SMs); threads run in warps of {props.warp_size}; "
        f"an SM holds up to {props.max_threads_per_multi_processor} threads ({props.max_threads_per_multi_processor // props.warp_size} warps) "
        f"and a thread block up to {props.max_threads_per_block} threads and {format_bytes(props.shared_memory_per_block_optin)} of shared memory.",
        "Registers and shared memory are private to an SM (registers to a thread, shared memory to a thread block); L2 and HBM are shared by all SMs.",
    ]
    return rows, notes


def memory_spaces(device: str | torch.device | None = None, measure: bool = True) -> MemorySpaces:
    """The memory spaces of ``device`` (default: the picked device), smallest and fastest first.

    ``measure=False`` skips the bandwidth probes (sizes only).
    """
    device = pick_device(device)
    if device.type == "mps":
        notice = gpu_notice("the memory spaces of a CUDA GPU", device, echo=False)
        rows, notes = _cpu_spaces(measure)
        return MemorySpaces(rows, torch.device("cpu"), [notice, *notes])
    rows, notes = _gpu_spaces(device, measure) if is_gpu(device) else _cpu_spaces(measure)
    return MemorySpaces(rows, device, notes)
