"""Does this device compute in fp16 and bf16 natively, and what does the answer cost? Read from the machine, then timed.

The kit knows which formats a device has arithmetic for (``helpers.core.device``: instruction-set flags on a
CPU, compute capability on a GPU). ``dtype_speed`` times one n x n matmul in fp32 and in each other format;
``DtypeSpeed.sentences()`` words each outcome from those two facts, so what it says holds on a CPU with
AVX512-FP16 or AMX, on one without, and on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from helpers.core.device import cpu_flags, cpu_native_dtypes, gpu_dtypes, is_gpu, peak_flops, pick_device
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import Turns
from helpers.hardware.matmuls import MatmulSweep
from helpers.hardware.roofline import disturbance_note, format_rate, matmul_workload, time_in_turns

# The CPU flags that give a format its own arithmetic; F16C only converts fp16 to and from fp32.
ARITHMETIC_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}
SAME_SPEED = 1.15  # time ratios within this factor of 1 count as fp32's speed
EMULATED = 3.0  # an unsupported format this many times slower than fp32 is on a generic fallback kernel


def support_evidence(device: str | torch.device, dtype: str) -> tuple[bool, str]:
    """Whether the kit counts ``dtype`` as native on ``device``, and what it reads that from."""
    device = torch.device(device)
    if is_gpu(device):
        major, minor = torch.cuda.get_device_capability(device)
        return dtype in gpu_dtypes(device), f"compute capability {major}.{minor}"
    if dtype not in ARITHMETIC_FLAGS:
        raise ValueError(f"dtype {dtype!r}: the kit reads CPU support for {', '.join(ARITHMETIC_FLAGS)} only")
    flags = cpu_flags()
    present = [f for f in ARITHMETIC_FLAGS[dtype] if f in flags]
    evidence = f"CPU flag {', '.join(present)}" if present else f"no {' or '.join(ARITHMETIC_FLAGS[dtype])} CPU flag"
    if dtype == "fp16" and "f16c" in flags:
        evidence += "; F16C converts only"
    return dtype in cpu_native_dtypes(), evidence


def speed_sentence(device: str, dtype: str, native: bool, evidence: str, ratio: float, n: int, overlap: bool = False) -> str:
    """One sentence on ``dtype`` against fp32 from the kit's support verdict and the measured time ratio (dtype / fp32).

    ``overlap``: the two formats' timings overlap (each one's fastest to median block), so a gap is called a tie.
    """
    if not ratio > 0:
        raise ValueError(f"ratio is {dtype}'s time over fp32's and must be positive, got {ratio!r}")
    if ratio < 1 / SAME_SPEED:
        speed = f"ran {1 / ratio:.1f}x faster than fp32"
    elif ratio <= SAME_SPEED:
        speed = f"ran at fp32's speed ({ratio:.2f}x its time)"
    else:
        speed = f"took {ratio:.1f}x fp32's time"
    if overlap and not 1 / SAME_SPEED <= ratio <= SAME_SPEED:
        support = "reports native arithmetic" if native else "finds no native arithmetic"
        return (f"{dtype} on {device}: the kit {support} ({evidence}), and an n = {n} matmul {speed} by the fastest blocks, but the two "
                "formats' blocks overlap (each one's fastest to median): within this machine's noise, a tie; run again on a quieter machine.")
    if native:
        head = f"{dtype} on {device}: the kit reports native arithmetic ({evidence}), and an n = {n} matmul {speed}"
        if ratio < 1 / SAME_SPEED:
            return f"{head}: native units and half the bytes per number pay off."
        return f"{head}: support alone did not make it faster at this size, or other work disturbed the timing; try a larger n, or run again."
    head = f"{dtype} on {device}: the kit finds no native arithmetic ({evidence}), and an n = {n} matmul {speed}"
    if ratio > EMULATED:
        return f"{head}: torch falls back to a generic kernel that widens values to fp32 as it goes, so the format runs, emulated, far slower."
    if ratio >= 1 / SAME_SPEED:
        return f"{head}: the work is converted to fp32 and done by fp32 units, so the format saves memory here, not time."
    return (f"{head}, faster all the same: this CPU may have support the kit does not know of, or other work disturbed "
            "the fp32 timing; run again before trusting it.")


@dataclass
class DtypeTiming:
    device: str = column("device")
    dtype: str = column("dtype")
    native: bool = column("native (kit)", lambda v: "yes" if v else "no")
    evidence: str = column("read from")
    peak: float | None = column("peak (kit)", format_rate)
    seconds: float = column("time (fastest block)", format_seconds)
    gflops: float = column("GFLOP/s", ",.1f")
    speedup_vs_fp32: float = column("speed-up vs fp32", lambda v: f"{v:.2f}x")  # fp32's time over this one's: above 1 is faster, as "vs eager" elsewhere
    n: int = column("n", ",")
    median_seconds: float | None = column("median block", format_seconds, optional=True, default=None)  # beside the fastest, in "time"

    def overlaps(self, other: "DtypeTiming") -> bool:
        """Whether the two timings' ranges (fastest to median block) overlap; False where either has no median."""
        if self.median_seconds is None or other.median_seconds is None:
            return False
        return self.seconds <= other.median_seconds and other.seconds <= self.median_seconds


class DtypeSpeed(Report):
    """One n x n matmul per device and format, beside what the kit knows about the format's support."""

    title = "Number formats: native support and speed against fp32"

    def __init__(self, rows, disturbance: str | None = None, notes=()):
        super().__init__(rows, notes)
        self.disturbance = disturbance

    def sentences(self) -> str:
        """One line per device and non-fp32 format, each following from its row; a last one if the timing was disturbed."""
        fp32 = {r.device: r for r in self.rows if r.dtype == "fp32"}
        lines = [speed_sentence(r.device, r.dtype, r.native, r.evidence, 1 / r.speedup_vs_fp32, r.n, r.overlaps(fp32[r.device]))
                 for r in self.rows if r.dtype != "fp32"]
        return "\n".join(lines + ([self.disturbance] if self.disturbance else []))


def _from_sweep(sweep: MatmulSweep | None, place: torch.device, formats: Sequence[str], size: int) -> dict[str, Turns] | None:
    """The sweep's timings of every one of ``formats`` at ``size`` on ``place``, or None unless it timed them all in blocks."""
    points = {d: sweep.point(place.type, d, size) for d in formats} if sweep is not None else {}
    if not points or any(p is None or p.fastest is None for p in points.values()):
        return None
    return {d: Turns(p.fastest, p.seconds) for d, p in points.items()}


def dtype_speed(n: int = 256, device: str | torch.device | None = None, dtypes: Sequence[str] = ("bf16", "fp16"),
                min_run_time: float = 0.05, rounds: int = 5, gpu_n: int = 4096, sweep: MatmulSweep | None = None) -> DtypeSpeed:
    """Time an n x n matmul in fp32 and in each of ``dtypes`` on the CPU, and a ``gpu_n`` one on ``device`` when it is a GPU
    (a GPU needs far larger matrices to show its units' speed; an emulated format on a CPU, far smaller ones).

    The formats are timed in ``rounds`` interleaved rounds, each keeping its fastest block, so a burst of
    other work on the machine does not land on one format only. ``sweep``: a ``matmul_sweep`` that already
    timed all these formats at that size, in turns: its fastest blocks are used, and nothing is timed again.
    """
    unknown = [d for d in dtypes if d not in ARITHMETIC_FLAGS]
    if unknown or not dtypes:
        raise ValueError(f"dtypes {list(dtypes)!r}: compare fp32 against one or more of {', '.join(ARITHMETIC_FLAGS)}")
    device = pick_device(device)
    rows, disturbed, notes = [], {}, []
    for place in [torch.device("cpu")] + ([device] if is_gpu(device) else []):
        size = gpu_n if is_gpu(place) else n
        workloads = {d: matmul_workload(size, place, d) for d in ("fp32", *dtypes)}
        timings = _from_sweep(sweep, place, list(workloads), size)
        if timings is not None:
            notes.append(f"{place.type}, n = {size}: the sweep's timings, read again (the fastest of its blocks, the formats in turns).")
        else:
            timings = dict(zip(workloads, time_in_turns(list(workloads.values()), place, min_run_time, rounds)))
            if sweep is not None:
                notes.append(f"{place.type}, n = {size}: timed here, in turns; the sweep did not time all of {', '.join(workloads)} at this size.")
        disturbed.update({f"{d} on {place.type}": t for d, t in timings.items()})
        seconds = {d: t.fastest for d, t in timings.items()}
        for dtype, workload in workloads.items():
            native, evidence = (True, "every device") if dtype == "fp32" else support_evidence(place, dtype)
            rows.append(DtypeTiming(place.type, dtype, native, evidence, peak_flops(place, dtype), seconds[dtype],
                                    workload.flops / seconds[dtype] / 1e9, seconds["fp32"] / seconds[dtype], size, timings[dtype].median))
    return DtypeSpeed(rows, disturbance=disturbance_note(disturbed, device), notes=notes)
