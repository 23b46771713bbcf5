"""Hand-written ring all-reduce (send/recv) against dist.all_reduce: world sizes 2-4, messages from 1 KiB to 64 MiB."""
from __future__ import annotations

from dataclasses import dataclass

from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.distributed.experiments import KIB, MIB, all_reduce_sweep, calibrate_link, traffic_check

from . import BenchResult, Target

RING, TORCH = "ring (send/recv)", "dist.all_reduce"


@dataclass
class RatioRow:
    world_size: int = column("N")
    message_bytes: int = column("message", format_bytes)
    ring_seconds: float = column("ring", format_seconds)
    torch_seconds: float = column("dist.all_reduce", format_seconds)
    ratio: float = column("ring / all_reduce", ".2f")


class RingVsTorch(Report):
    title = "Ring all-reduce (send/recv) vs dist.all_reduce"


def run(quick: bool) -> BenchResult:
    world_sizes = (2,) if quick else (2, 3, 4)
    sizes = (KIB, 64 * KIB) if quick else (KIB, 16 * KIB, 256 * KIB, 4 * MIB, 64 * MIB)
    link = calibrate_link(sizes_bytes=(4, 64 * KIB, MIB) if quick else (4, 4 * KIB, 64 * KIB, MIB, 8 * MIB), repeats=5 if quick else 10)
    sweep = all_reduce_sweep(world_sizes, sizes, (RING, TORCH), repeats=2 if quick else 5, link=link.link)
    rows = []
    for world in world_sizes:
        for size in sizes:
            ring, torch_ = sweep.find(implementation=RING, world_size=world, message_bytes=size).seconds, sweep.find(implementation=TORCH, world_size=world, message_bytes=size).seconds
            rows.append(RatioRow(world, size, ring, torch_, ring / torch_))
    ratios = RingVsTorch(rows, ["Both timed as the slowest rank's median over repeats, after a warm-up; gloo on this machine's CPU cores."])
    traffic = traffic_check(world_sizes=(2, 3) if quick else (2, 3, 4), numel=1001)
    correct = all(r.correct for r in traffic.rows)
    largest = max(r.message_bytes for r in rows)
    at_two = next(r for r in rows if r.world_size == 2 and r.message_bytes == largest)
    targets = [
        Target.at_least("ring and parameter-server all-reduce equal dist.all_reduce (1 = all N)", float(correct), 1.0),
    ]
    timing = f"ring / dist.all_reduce time, N = 2, {format_bytes(largest)}"
    targets.append(Target.not_here(timing, "<= 3x", "quick run: too few repeats to judge") if quick else Target.at_most(timing, at_two.ratio, 3.0, "x"))
    return BenchResult("allreduce", [ratios, sweep, link, traffic], targets)
