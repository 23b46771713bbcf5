"""Matmul throughput by size, device and dtype; the timer cross-check; the tensor-core shape effect."""
from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from torch.utils import benchmark as torch_benchmark

from helpers.core.device import gpu_available, peak_flops
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import timeit
from helpers.hardware import matmul_sweep, tensor_core_shapes

from . import BenchResult, Target


@dataclass
class TimerRound:
    round: int = column("round")
    kit: float = column("helpers timeit", format_seconds)
    torch: float = column("torch Timer", format_seconds)
    difference_pct: float = column("difference %", ".2f")


class TimerAgreement(Report):
    title = "helpers.core.timing.timeit vs torch.utils.benchmark (same threads, blocked_autorange)"


def timer_agreement(n: int = 1024, rounds: int = 5, min_run_time: float = 0.5) -> TimerAgreement:
    """Time an n x n fp32 CPU matmul with both timers, interleaved, ``rounds`` times.

    Both use every CPU thread torch has. ``.difference_pct`` is the median over
    rounds of |kit / torch - 1|: interleaving and the median keep one disturbed
    round (a noisy neighbour on a shared machine) from deciding the verdict.
    """
    a, b = torch.randn(n, n), torch.randn(n, n)
    threads = torch.get_num_threads()
    rows = []
    for i in range(rounds):
        kit = timeit(torch.matmul, a, b, device="cpu", min_run_time=min_run_time).median
        reference = torch_benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads).blocked_autorange(min_run_time=min_run_time).median
        rows.append(TimerRound(i + 1, kit, reference, 100 * abs(kit - reference) / reference))
    report = TimerAgreement(rows)
    report.difference_pct = statistics.median(r.difference_pct for r in rows)
    report.threads = threads
    return report


def run(quick: bool) -> BenchResult:
    agreement = timer_agreement(n=512 if quick else 1024, rounds=3 if quick else 5, min_run_time=0.2 if quick else 0.5)
    sweep = matmul_sweep(sizes=(64, 256) if quick else None, min_run_time=0.05 if quick else 0.2)
    agreement_target = "timeit vs torch.utils.benchmark at n=1024, median |difference| over rounds"
    if quick:
        targets = [Target.not_here(agreement_target, "<= 10%", "quick run")]
    else:
        targets = [Target.at_most(agreement_target, agreement.difference_pct, 10, "%")]
    reports = [agreement, sweep]
    bf16_target = ("bf16 matmul n=8192, % of dense peak", ">= 70%")
    if not gpu_available() or quick:
        targets.append(Target.not_here(*bf16_target, "no GPU here" if not gpu_available() else "quick run"))
    elif peak_flops("cuda", "bf16") is None:
        targets.append(Target.not_here(*bf16_target, "this GPU's peak is not in helpers/hardware_specs.py"))
    else:
        reports.append(tensor_core_shapes())
        point = next((p for p in sweep.rows if (p.device, p.dtype, p.n) == ("cuda", "bf16", 8192)), None)
        targets.append(Target.at_least(bf16_target[0], point.pct_of_peak if point else None, 70, "%"))
    return BenchResult("matmul", reports, targets)
