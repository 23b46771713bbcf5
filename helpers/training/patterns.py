"""The three profile patterns (compute bound, launch bound, synchronisation bound): per-step figures derived from a
torch.profiler run, a diagnosis that reads them, and the programs of helpers.training.workloads diagnosed and fixed.
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass
from typing import Callable

import torch
from torch.autograd import DeviceType

from helpers.core import plots
from helpers.core.device import gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_seconds
from helpers.core.timing import range_verdict, timeit
from helpers.training.workloads import Program, make_compute_bound, make_launch_bound, make_sync_bound

SYNC_OPS = {"aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"}
TINY_OP_US = 50.0  # CPU: a median op this short is mostly dispatch overhead
MANY_OPS = 50  # per step
SYNC_STALL_SHARE = 0.05  # GPU: of the step spent from a sync until the next op starts
OPS_PER_SYNC = 20  # CPU: a host read at least this often means host and device take turns
GPU_BUSY_SHARE = 0.5  # below it, the GPU mostly waits for the host


@dataclass
class ProfileMetrics:
    """What a profile of repeated steps shows, per step."""

    device: str
    steps: int
    step_seconds: float
    ops_per_step: float
    median_op_us: float
    op_share: float  # of wall time inside PyTorch ops (the rest: Python and other host work)
    syncs_per_step: float
    sync_stall_share: float  # of wall time from each sync until the next op starts: when a GPU would have nothing queued
    device_busy: float | None  # GPU only: kernel time / wall time
    top_op: str
    top_op_share: float  # of the time inside ops


def _ancestors(event) -> list:
    """The ops (and runtime calls) that enclose ``event`` on its thread, innermost first."""
    chain, parent = [], event.cpu_parent
    while parent is not None:
        chain.append(parent)
        parent = parent.cpu_parent
    return chain


def metrics_from_profile(events, wall_seconds: float, steps: int, device: torch.device) -> ProfileMetrics:
    """Derive per-step figures from torch.profiler events: op count and time, sync points and the stalls after them."""
    cpu_events = [e for e in events if e.device_type == DeviceType.CPU]
    outer_ops = [e for e in cpu_events if e.name.startswith("aten::") and not any(a.name.startswith("aten::") for a in _ancestors(e))]
    syncs = [e for e in cpu_events if e.name in SYNC_OPS and not any(a.name in SYNC_OPS for a in _ancestors(e))]
    durations = sorted(e.cpu_time_total for e in outer_ops)
    op_us = sum(durations)
    starts = sorted(e.time_range.start for e in outer_ops)
    stall_us = 0.0
    for sync in syncs:  # from the sync's start to the next op that does not belong to it
        following = bisect.bisect_left(starts, sync.time_range.end)
        if following < len(starts):
            stall_us += starts[following] - sync.time_range.start
    by_name: dict[str, float] = {}
    for e in outer_ops:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.cpu_time_total
    top = max(by_name, key=by_name.get) if by_name else "-"
    busy = None
    if is_gpu(device):
        kernel_us = sum(e.time_range.elapsed_us() for e in events if e.device_type == DeviceType.CUDA)
        busy = kernel_us / 1e6 / wall_seconds
    wall_us = wall_seconds * 1e6
    return ProfileMetrics(
        device=str(device),
        steps=steps,
        step_seconds=wall_seconds / steps,
        ops_per_step=len(outer_ops) / steps,
        median_op_us=durations[len(durations) // 2] if durations else 0.0,
        op_share=min(op_us / wall_us, 1.0),
        syncs_per_step=len(syncs) / steps,
        sync_stall_share=min(stall_us / wall_us, 1.0),
        device_busy=busy,
        top_op=top,
        top_op_share=by_name.get(top, 0.0) / op_us if op_us else 0.0,
    )


def metrics_from_profiler(prof, device: str | torch.device | None = None) -> ProfileMetrics:
    """The figures of a finished torch.profiler run whose loop called ``prof.step()`` once per step.

    The steps are the profiler's own ``ProfilerStep`` ranges (those recorded by the
    schedule), and their summed length is the wall time: the profiling loop is the
    caller's (Lecture 5b writes it).
    """
    device = pick_device(device)
    events = prof.events()
    spans = [e for e in events if e.name.startswith("ProfilerStep") and e.device_type == DeviceType.CPU]
    if not spans:
        raise ValueError("metrics_from_profiler: no ProfilerStep ranges in this profile; call prof.step() after every step")
    wall = sum(e.time_range.elapsed_us() for e in spans) / 1e6
    return metrics_from_profile(events, wall, len(spans), device)


def diagnose(m: ProfileMetrics) -> tuple[str, str]:
    """The profile pattern ``m`` shows, and the evidence, by three rules checked in order.

    1. synchronisation bound: the host reads device results every step, and the
       time from each read to the next op is a noticeable share of the step
       (``SYNC_STALL_SHARE``). On a GPU that time is the queue draining; on a CPU,
       which runs ops synchronously, it is the host work the reads wait for. Frequent
       reads that cost little are reported, not diagnosed: they do not bind this step;
    2. launch bound: on a GPU, the GPU is mostly idle; on a CPU, many ops per
       step, the median one so short that dispatching it costs about as much as
       running it (the median, not the mean, so a few slow ops do not hide it);
    3. otherwise compute bound: the time is inside a few substantial ops.
    """
    cheap_reads = ""
    if m.syncs_per_step >= 1:
        ops_per_sync = m.ops_per_step / m.syncs_per_step
        reads = f"{m.syncs_per_step:.0f} host reads of device results per step, one every {ops_per_sync:.0f} ops"
        if m.sync_stall_share >= SYNC_STALL_SHARE and (m.device_busy is not None or ops_per_sync <= OPS_PER_SYNC):
            where = "with the GPU's queue empty" if m.device_busy is not None else "the host and the ops take turns"
            return "synchronisation bound", f"{reads}; from each read to the next op: {m.sync_stall_share:.1%} of the step, {where}"
        if m.device_busy is None and ops_per_sync <= OPS_PER_SYNC:
            cheap_reads = (f"; its {reads} cost only {m.sync_stall_share:.1%} of the step here, under the "
                           f"{SYNC_STALL_SHARE:.0%} that would make it synchronisation bound (a CPU runs ops synchronously: no queue "
                           f"to drain; on a GPU each read empties the queue)")
    if m.device_busy is not None:
        if m.device_busy < GPU_BUSY_SHARE:
            return "launch bound", f"the GPU is busy {m.device_busy:.0%} of the time; {m.ops_per_step:.0f} ops per step, median {m.median_op_us:.1f} us of host time each"
        return "compute bound", f"the GPU is busy {m.device_busy:.0%} of the time; {m.top_op} takes {m.top_op_share:.0%} of op time"
    if m.median_op_us < TINY_OP_US and m.ops_per_step >= MANY_OPS:
        return "launch bound", (f"{m.ops_per_step:.0f} ops per step, median {m.median_op_us:.1f} us; {m.op_share:.0%} of the step "
                                f"is inside ops, the rest is Python and dispatch" + cheap_reads)
    return "compute bound", (f"{m.ops_per_step:.0f} ops per step, median {m.median_op_us:,.0f} us; {m.op_share:.0%} of the step inside ops, "
                             f"{m.top_op} {m.top_op_share:.0%} of it" + cheap_reads)


@dataclass
class PatternDiagnosis:
    program: str = column("program")
    expected: str
    verdict: str = column("diagnosis")
    evidence: str = column("evidence from the profile")
    fix: str = column("fix")
    step_seconds: float = column("step", format_seconds)
    fixed_seconds: float = column("fixed", format_seconds)
    speedup: float = column("speed-up", ".2f")
    outcome: str = column("fix vs step")
    metrics: ProfileMetrics
    step_range: tuple[float, float] = (0.0, 0.0)  # fastest and slowest round of the step
    fixed_range: tuple[float, float] = (0.0, 0.0)  # the same for the fixed step


def fix_outcome(step_times: list[float], fixed_times: list[float]) -> str:
    """'faster' when every round of the fixed step beat every round of the step, 'slower' the other way round,
    else 'a tie': the two ranges overlap, so the gap is inside this machine's run-to-run spread."""
    return range_verdict(fixed_times, step_times)


class ProfilePatterns(Report):
    """Three small programs, each diagnosed from its own profile, then fixed and timed again."""

    title = "Profile patterns: diagnosis from the profile, and the fix measured"

    def conclusions(self) -> list[str]:
        """Per program: the diagnosis against the pattern it reproduces, and the fix's effect with both ranges."""
        lines = []
        for r in self.rows:
            if r.verdict == r.expected:
                diagnosis = f"diagnosed {r.verdict}, as expected"
            else:
                diagnosis = f"diagnosed {r.verdict}, not {r.expected}"
                if r.expected == "synchronisation bound" and r.metrics.device_busy is None:
                    diagnosis += (f" (its {r.metrics.syncs_per_step:.0f} host reads per step cost {r.metrics.sync_stall_share:.1%} of it "
                                  f"on this CPU; on a GPU each read drains the queue, and the pattern shows)")
            ranges = (f"step {format_seconds(r.step_range[0])} to {format_seconds(r.step_range[1])}, fixed "
                      f"{format_seconds(r.fixed_range[0])} to {format_seconds(r.fixed_range[1])}")
            if r.outcome == "a tie":
                fix = f"the fix is a tie: the ranges overlap ({ranges}), so its {r.speedup:.2f}x is inside the noise"
            else:
                fix = f"the fixed step is {r.speedup:.2f}x as fast, {r.outcome} in every round ({ranges})"
            lines.append(f"{r.expected}: {diagnosis}; {fix}.")
        return lines

    def plot(self, ax=None):
        """Each program on the map a diagnosis reads: ops per step against the median op's duration."""
        points = {r.expected: (r.metrics.ops_per_step, max(r.metrics.median_op_us, 0.1)) for r in self.rows}
        notes = {r.expected: "; ".join(part for part in (
            f"{r.metrics.syncs_per_step:.0f} host reads per step" if r.metrics.syncs_per_step else "",
            f"GPU busy {r.metrics.device_busy:.0%}" if r.metrics.device_busy is not None else "",
        ) if part) for r in self.rows}
        ax = plots.labelled_scatter(points, ax, notes, title="What each profile shows", xlabel="ops per step (log scale)",
                                    ylabel="median op duration, us (log scale)", logx=True, logy=True)
        ax.axhline(TINY_OP_US, linestyle="--", color="grey", linewidth=1)
        ax.annotate("tiny ops: dispatch costs as much as the work", (1.0, TINY_OP_US), xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8, color="grey")
        ax.margins(0.3)
        return ax


def _interleaved_medians(step: Callable, fixed: Callable, device: torch.device, rounds: int, min_run_time: float) -> tuple[list, list]:
    """Each function's median seconds per call in ``rounds`` rounds in which the two take turns, so that a passing
    disturbance of the machine hits both alike; the rounds' spread is the run-to-run noise."""
    step_times, fixed_times = [], []
    for _ in range(rounds):
        step_times.append(timeit(step, device=device, min_run_time=min_run_time).median)
        fixed_times.append(timeit(fixed, device=device, min_run_time=min_run_time).median)
    return step_times, fixed_times


def diagnose_program(program: Program, profile_steps: Callable, device: torch.device, steps: int = 5,
                     min_run_time: float = 0.2, rounds: int = 5) -> PatternDiagnosis:
    """Profile a program with ``profile_steps(step, steps)``, diagnose it, and time it and its fix in ``rounds``
    interleaved rounds of helpers.timeit (``min_run_time`` split between the rounds)."""
    metrics = metrics_from_profiler(profile_steps(program.step, steps), device)
    verdict, evidence = diagnose(metrics)
    slow, fast = _interleaved_medians(program.step, program.fixed, device, rounds, max(min_run_time / rounds, 0.01))
    step_seconds, fixed_seconds = statistics.median(slow), statistics.median(fast)
    return PatternDiagnosis(program.name, program.expected, verdict, evidence, program.fix, step_seconds, fixed_seconds,
                            step_seconds / fixed_seconds, fix_outcome(slow, fast), metrics, (min(slow), max(slow)), (min(fast), max(fast)))


def profile_patterns(
    profile_steps: Callable,
    device: str | torch.device | None = None,
    steps: int = 5,
    min_run_time: float = 0.2,
    compute_n: int | None = None,
    launch_samples: int = 64,
    decode_length: int = 24,
    rounds: int = 5,
) -> ProfilePatterns:
    """Reproduce, profile, diagnose and fix the three patterns on ``device`` (the GPU version when there is one).

    ``profile_steps(step, steps)`` is the profiling loop: it calls ``step`` under
    torch.profiler, ``prof.step()`` after each call, and returns the profiler.
    ``compute_n`` is the matmul size of the compute-bound program, ``launch_samples``
    the number of one-sample calls of the launch-bound one, ``decode_length`` the
    tokens per step of the synchronisation-bound one; each program and its fix are timed in ``rounds``
    interleaved rounds, and the fix's outcome (faster, slower, a tie) compares their ranges.
    """
    device = pick_device(device)
    notice = gpu_notice("the GPU view of the patterns (kernel time, host-device stalls)", device)
    programs = [make_compute_bound(device, compute_n), make_launch_bound(device, launch_samples), make_sync_bound(device, length=decode_length)]
    rows = [diagnose_program(p, profile_steps, device, steps, min_run_time, rounds) for p in programs]
    note = (f"step and fixed: the median of {rounds} rounds in which the two took turns; the fix counts as faster (or slower) "
            "only when every one of its rounds beat (or lost to) every round of the step, else it is a tie")
    return ProfilePatterns(rows, [note], notice=notice)
