"""Pick the device, synchronise it, and describe the hardware (with peak figures for "% of peak").

The device is CUDA when present, else CPU. ``EDL_DEVICE`` overrides the choice
(``cpu``, ``cuda``, ``cuda:1``, ``mps``), so one notebook runs unchanged on a
laptop and on a GPU box.
"""
from __future__ import annotations

import contextlib
import os
import platform
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

import psutil
import torch

from helpers.core.hardware_specs import GPUSpec, lookup_gpu
from helpers.core.report import Report, column, format_bytes

ENV_VAR = "EDL_DEVICE"
# The kit's one table of number-format names: short name -> torch dtype (tf32 is fp32 storage, run on tensor cores).
DTYPES = {"fp64": torch.float64, "fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items() if name != "tf32"}  # the way back: torch.float16 -> "fp16"


def dtype_name(dtype: torch.dtype) -> str:
    """The kit's short name of a torch dtype ("fp16" for torch.float16); torch's own name for one not in ``DTYPES``."""
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def gpu_available() -> bool:
    """True when a CUDA device is visible to torch."""
    return torch.cuda.is_available()


DEVICE_NAME = re.compile(r"^(cpu|cuda(:\d+)?|mps)$")


def normalise_device_name(value: str, source: str) -> str:
    """'CPU ' -> 'cpu'; anything but cpu, cuda, cuda:N or mps is an error that names the knob to fix (``source``)."""
    name = str(value).strip().lower()
    if not DEVICE_NAME.match(name):
        raise ValueError(f"{source}: {value!r} is not a device. Use cpu, cuda, cuda:N (N = 0, 1, ...) or mps.")
    return name


def pick_device(device: str | torch.device | None = None) -> torch.device:
    """The device to run on: the argument, else $EDL_DEVICE, else CUDA when present, else CPU.

    A well-formed request for an accelerator that is not here falls back to the
    CPU with a one-line notice, so a notebook never fails for lack of a GPU. This is
    the kit's one device normaliser: every helper taking ``device`` passes it here, so
    ``device=None`` means this pick everywhere.
    """
    source = "argument"
    if device is None:
        device, source = os.environ.get(ENV_VAR) or None, ENV_VAR
    if device is None:
        return torch.device("cuda" if gpu_available() else "cpu")
    if not isinstance(device, torch.device):
        device = normalise_device_name(device, "the device argument" if source == "argument" else f"${ENV_VAR}")
    chosen = torch.device(device)
    if chosen.type == "cuda" and not gpu_available():
        print(f"No CUDA device here ({source} asked for {device!r}): running on the CPU instead.")
        return torch.device("cpu")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise ValueError(f"{source} asks for {device!r} but only {torch.cuda.device_count()} CUDA device(s) exist; use cuda:0..cuda:{torch.cuda.device_count() - 1}.")
    if chosen.type == "mps" and not torch.backends.mps.is_available():
        print(f"No MPS device here ({source} asked for {device!r}): running on the CPU instead.")
        return torch.device("cpu")
    if chosen.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{source} asks for device type {chosen.type!r}; the kit supports cpu, cuda and mps.")
    return chosen


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait until every queued kernel on ``device`` has finished (a no-op on the CPU)."""
    device = torch.device(device) if device is not None else None
    if device is None:
        if torch.accelerator.is_available():
            torch.accelerator.synchronize()
    elif device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def cpu_threads(threads: int | None) -> Iterator[None]:
    """Within the block, torch uses ``threads`` CPU threads (None: leave the setting alone)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def is_gpu(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def gpu_notice(feature: str, device: str | torch.device, echo: bool = True) -> str | None:
    """A one-line explanation when ``feature`` needs a GPU and ``device`` is not one (printed unless ``echo`` is False:
    a report that shows it in its notes passes False, so the cell shows it once)."""
    if is_gpu(device):
        return None
    message = f"No GPU here (device={torch.device(device)}), so this shows the CPU side instead (GPU-only: {feature})."
    if echo:
        print(message)
    return message


# ---------------------------------------------------------------- CPU facts


@lru_cache(maxsize=1)
def _cpuinfo() -> dict[str, str]:
    """The first processor block of /proc/cpuinfo (empty off Linux)."""
    try:
        text = open("/proc/cpuinfo").read().split("\n\n")[0]
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    return set(_cpuinfo().get("flags", "").split())


def cpu_clock_ghz() -> float | None:
    """Nominal clock: psutil's maximum when it knows one, else the current reading."""
    freq = psutil.cpu_freq()
    if freq is None:
        return None
    mhz = freq.max or freq.current
    return mhz / 1000 if mhz else None


def cpu_fp32_flops_per_cycle(flags: set[str]) -> int | None:
    """Peak fp32 FLOP per cycle per core from the SIMD width: 2 FMA units x lanes x 2 FLOP."""
    if "avx512f" in flags:
        return 64
    if "avx2" in flags and "fma" in flags:
        return 32
    if "avx" in flags:
        return 16
    if "sse2" in flags:
        return 8
    return None


def cpu_peak_flops(dtype: str = "fp32") -> float | None:
    """An upper bound on the CPU's FLOP/s for ``dtype``: cores x clock x FLOP/cycle from the ISA flags.

    It is a bound, not a promise: some chips issue wide FMAs at half rate (AMD Zen 4
    runs AVX-512 on 256-bit units) and turbo clocks exceed the nominal one. None
    when the instruction set has no native support (the dtype is emulated).
    """
    flags, clock, cores = cpu_flags(), cpu_clock_ghz(), psutil.cpu_count(logical=False)
    per_cycle = cpu_fp32_flops_per_cycle(flags)
    if not (flags and clock and cores and per_cycle):
        return None
    fp32 = cores * clock * 1e9 * per_cycle
    if dtype == "fp32":
        return fp32
    if dtype == "fp64":
        return fp32 / 2
    if dtype == "bf16" and "avx512_bf16" in flags and "amx_bf16" not in flags:
        return 2 * fp32  # VDPBF16PS: two bf16 products per fp32 lane
    if dtype == "fp16" and "avx512_fp16" in flags and "amx_fp16" not in flags:
        return 2 * fp32
    return None


def cpu_native_dtypes() -> list[str]:
    """Matmul dtypes with native instructions on this CPU; others run, but emulated and slow."""
    flags = cpu_flags()
    native = ["fp32"]
    if flags & {"avx512_bf16", "amx_bf16"}:
        native.append("bf16")
    if flags & {"avx512_fp16", "amx_fp16"}:
        native.append("fp16")
    return native


# ---------------------------------------------------------------- GPU facts


def gpu_spec(device: str | torch.device | None = None) -> GPUSpec | None:
    """The datasheet of the GPU behind ``device`` (default: ``pick_device()``), or None without a GPU or for an unknown one."""
    device = pick_device(device)
    return lookup_gpu(torch.cuda.get_device_name(device)) if is_gpu(device) else None


def gpu_dtypes(device: str | torch.device | None = None) -> list[str]:
    """Matmul dtypes this GPU supports natively (TF32 and BF16 need compute capability 8.0+)."""
    device = pick_device(device)
    if not is_gpu(device):
        raise ValueError(f"gpu_dtypes needs a CUDA device, got {device}; use fast_dtypes(device), which answers for CPUs too")
    major, _ = torch.cuda.get_device_capability(device)
    return ["fp32", "tf32", "fp16", "bf16"] if major >= 8 else ["fp32", "fp16"]


def fast_dtypes(device: str | torch.device) -> list[str]:
    """The dtypes worth sweeping on ``device``: those with native hardware support."""
    return gpu_dtypes(device) if is_gpu(device) else cpu_native_dtypes()


def peak_flops(device: str | torch.device, dtype: str = "fp32") -> float | None:
    """Peak FLOP/s of ``device`` for ``dtype`` (datasheet for GPUs, an ISA estimate for CPUs), or None."""
    if is_gpu(device):
        spec = gpu_spec(device)
        tflops = spec.tflops.get(dtype) if spec else None
        return tflops * 1e12 if tflops else None
    return cpu_peak_flops(dtype)


def peak_bandwidth(device: str | torch.device) -> float | None:
    """Peak memory bandwidth in bytes/s (datasheet; unknown for CPUs)."""
    spec = gpu_spec(device) if is_gpu(device) else None
    return spec.bandwidth_gbs * 1e9 if spec else None


# ---------------------------------------------------------------- the report


@dataclass
class Fact:
    item: str = column("item")
    value: str = column("value")


class Hardware(Report):
    """What this machine is: CPU, RAM, GPU, and the peaks that "% of peak" figures divide by."""

    title = "Hardware"

    def __init__(self, device: torch.device):
        self.device = device
        self.cpu_model = cpu_model()
        self.physical_cores = psutil.cpu_count(logical=False)
        self.logical_cores = psutil.cpu_count(logical=True)
        self.torch_threads = torch.get_num_threads()
        self.ram_bytes = psutil.virtual_memory().total
        self.cpu_peak_flops = {d: cpu_peak_flops(d) for d in ("fp32", "bf16")}
        self.gpu_name = torch.cuda.get_device_name(device) if is_gpu(device) else None
        props = torch.cuda.get_device_properties(device) if is_gpu(device) else None
        self.gpu_memory_bytes = props.total_memory if props else None
        self.compute_capability = f"{props.major}.{props.minor}" if props else None
        self.gpu_peak_flops = {d: peak_flops(device, d) for d in gpu_dtypes(device)} if props else {}
        self.gpu_bandwidth = peak_bandwidth(device) if props else None
        rows = [
            Fact("device in use", str(device)),
            Fact("CPU", self.cpu_model),
            Fact("CPU cores (physical / logical)", f"{self.physical_cores} / {self.logical_cores}"),
            Fact("torch CPU threads", str(self.torch_threads)),
            Fact("RAM", format_bytes(self.ram_bytes)),
            Fact("CPU fp32 peak (ISA estimate at the reported clock)", _tflops(self.cpu_peak_flops["fp32"])),
            Fact("CPU bf16 peak (ISA estimate at the reported clock)", _tflops(self.cpu_peak_flops["bf16"])),
            Fact("GPU", self.gpu_name or "none"),
        ]
        if props:
            rows += [
                Fact("GPU memory", format_bytes(self.gpu_memory_bytes)),
                Fact("compute capability", self.compute_capability),
                *(Fact(f"GPU {d} peak (datasheet, dense)", _tflops(f)) for d, f in self.gpu_peak_flops.items()),
                Fact("GPU memory bandwidth (datasheet)", f"{self.gpu_bandwidth / 1e9:,.0f} GB/s" if self.gpu_bandwidth else "unknown"),
            ]
        rows.append(Fact("torch", f"{torch.__version__} (CUDA {torch.version.cuda or 'none'})"))
        super().__init__(rows)


def _tflops(flops: float | None) -> str:
    return "unknown" if flops is None else f"{flops / 1e12:.3g} TFLOP/s"


def describe(device: str | torch.device | None = None) -> Hardware:
    """Describe the hardware behind ``device`` (default: the picked device)."""
    return Hardware(pick_device(device))
