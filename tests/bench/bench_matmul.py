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
        kit = timeit(torch.matmul, a, b, device="cpu", min_run_time=min_run_time, num_threads=threads).median
        reference = torch_benchmark.Timer("a @ b", globals={"a": a, "b": b}, num_threads=threads).blocked_autorange(min_run_time=min_run_time).median
        rows.append(TimerRound(i + 1, kit, reference, 100 * abs(kit - reference) / reference))
    report = TimerAgreement(rows)
    report.difference_pct = statistics.median(r.difference_pct for r in rows)
    report.threads = threads
    return report


def event_loop_gflops(n: int, dtype: torch.dtype, device: str | torch.device = "cuda", warmups: int = 10, products: int = 50) -> float:
    """GFLOP/s of an n x n product timed the plainest way: ``warmups`` calls, then CUDA events around ``products``
    back-to-back calls. The sweep's timer must agree with it: a timer that adds its own overhead would not."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"event_loop_gflops: CUDA events time GPU work only, got device {device}; run it on a machine with a GPU")
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    for _ in range(warmups):
        torch.matmul(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(products):
        torch.matmul(a, b)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / products  # elapsed_time is in milliseconds
    return 2 * n**3 / seconds / 1e9


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
    event_target = ("bf16 matmul n=8192, sweep vs a plain CUDA-event loop, |difference| %", "<= 5%")
    if not gpu_available() or quick:
        why = "no GPU here" if not gpu_available() else "quick run"
        targets += [Target.not_here(*bf16_target, why), Target.not_here(*event_target, why)]
    elif peak_flops("cuda", "bf16") is None:
        targets.append(Target.not_here(*bf16_target, "this GPU's peak is not in helpers/hardware_specs.py"))
    else:
        reports.append(tensor_core_shapes())
        point = next((p for p in sweep.rows if (p.device, p.dtype, p.n) == ("cuda", "bf16", 8192)), None)
        targets.append(Target.at_least(bf16_target[0], point.pct_of_peak if point else None, 70, "%"))
        plain = event_loop_gflops(8192, torch.bfloat16)
        sweep.notes.append(f"the same bf16 n=8192 product timed by a plain CUDA-event loop (10 warm-ups, 50 products): {plain:,.0f} GFLOP/s")
        targets.append(Target.at_most(event_target[0], 100 * abs(point.gflops / plain - 1) if point else None, 5, "%"))
    return BenchResult("matmul", reports, targets)
