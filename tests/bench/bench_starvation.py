"""Starving the accelerator: the waiting share with no DataLoader workers against the share at the best setting.

Target: waiting share at num_workers=0 >= 2 x the share at the highest-throughput
setting, measured with the storage-latency mode (1 ms per sample) and real PNG
decoding and augmentation. A second sweep without storage delay shows the
CPU-bound case, where on few cores workers can only help while a core is idle.
"""
from __future__ import annotations

from helpers.hardware.starvation import starvation_sweep

from . import BenchResult, Target

REQUIRED_RATIO = 2.0


def run(quick: bool) -> BenchResult:
    if quick:
        sweep = starvation_sweep(workers=(0, 4), steps=6, batch_size=32, progress=False)
        target = Target("waiting share, num_workers=0 / best setting (quick mode: too few steps to judge)", sweep.starvation_ratio, f">= {REQUIRED_RATIO:g}x", "n/a")
        return BenchResult("starvation", [sweep], [target])
    sweep = starvation_sweep(progress=False)
    sweep.title += f" (storage delay {sweep.latency_ms:g} ms per sample)"
    cpu_bound = starvation_sweep(latency_ms=0.0, progress=False)
    cpu_bound.title += " (no storage delay: decoding only)"
    best = max(sweep.rows, key=lambda p: p.samples_per_s)
    targets = [Target.at_least(f"waiting share, num_workers=0 / at the best setting (num_workers={best.num_workers}, pin_memory={best.pin_memory})", sweep.starvation_ratio, REQUIRED_RATIO, "x")]
    return BenchResult("starvation", [sweep, cpu_bound], targets)
