"""Host-to-device copy bandwidth (pageable vs pinned); Lecture 1 writes and times its own copy/compute overlap."""
from __future__ import annotations

from helpers.core.device import gpu_available
from helpers.hardware import transfer_sweep

from . import BenchResult, Target


def run(quick: bool) -> BenchResult:
    sweep = transfer_sweep(sizes_mib=(1, 8) if quick else None, min_run_time=0.05 if quick else 0.2)
    if gpu_available():
        largest = sweep.rows[-1]
        ratio = largest.pinned_gbs / largest.pageable_gbs
        targets = [Target.at_least("pinned / pageable H2D bandwidth at the largest size", ratio, 1.0, "x")]
    else:
        targets = [Target.not_here("pinned / pageable H2D bandwidth", "> 1x", "no GPU here")]
    return BenchResult("transfer", [sweep], targets)
