"""Lectures 1, 1b and 5b: the roofline, hand-written kernels against the library, launch overhead, which kernels ran.

On a GPU this is where the GPU-only figures of those lectures are checked in one run: a CUDA graph and
mode="reduce-overhead" against eager, the Triton kernels against each other and cuBLAS, tensor-core
kernels named in a profile, the roofline with the datasheet's roofs. On a CPU the same targets read n/a
with the reason, and the CPU sides (cache-blocked loops, torch.compile, oneDNN's bf16 kernels) are checked.
"""
from __future__ import annotations

import torch

from helpers.core.device import cpu_native_dtypes, is_gpu, pick_device
from helpers.hardware.kernels import matmul_kernels, triton_available, triton_check
from helpers.hardware.roofline import operator_roofline
from helpers.training.kernel_table import CPU_CONV, CPU_GEMM, TENSOR_CORE, KernelTable, cnn_training_step, kernels_by_class
from helpers.training.launch_overhead import ARITHMETIC, COMPILED, EAGER, GRAPH, REDUCE_OVERHEAD, measure_launch_overhead

from . import BenchResult, Target, full_runs_only

COMPILE_SECONDS_MAX = 30  # a lecture waits for the compiler at most this long (issue 10's budget)


def _op_chain(x):
    """64 tiny element-wise ops in a row: multiply, add, tanh in turn (the chain Lecture 5b writes in a cell)."""
    for i in range(64):
        x = x * 1.01 if i % 3 == 0 else (x + 0.01 if i % 3 == 1 else torch.tanh(x))
    return x


def _speedup(what: str, row, minimum: float) -> Target:
    """A variant's speed-up over eager, or n/a with the row's own reason when it could not run here."""
    if row.speedup is None:
        return Target.not_here(what, f">= {minimum:g}x", row.note)
    return Target.at_least(what, row.speedup, minimum, "x")


def launch_targets(launch, compiled: bool) -> list[Target]:
    """The launch-overhead lesson: eager is mostly overhead, and each way of removing it pays."""
    eager = launch.find(variant=EAGER)
    arithmetic_share = launch.find(variant=ARITHMETIC).call_seconds / eager.call_seconds
    targets = [Target.at_least("eager chain: share of each op that is overhead", 100 * (1 - arithmetic_share), 50, "%"),
               _speedup("CUDA graph replay vs eager", launch.find(variant=GRAPH), 2.0),
               _speedup("torch.compile (default) vs eager", launch.find(variant=COMPILED), 1.5),
               _speedup("torch.compile (reduce-overhead) vs eager", launch.find(variant=REDUCE_OVERHEAD), 2.0)]
    setups = [r.setup_seconds for r in launch.rows if r.variant in (COMPILED, REDUCE_OVERHEAD) and r.setup_seconds is not None]
    if setups:
        targets.append(Target.at_most("longest compile of the chain", max(setups), COMPILE_SECONDS_MAX, " s"))
    else:
        targets.append(Target.not_here("longest compile of the chain", f"<= {COMPILE_SECONDS_MAX} s",
                                       "quick run: no compilation" if not compiled else "nothing compiled"))
    return targets


def kernel_targets(timings, gpu: bool) -> list[Target]:
    """The blocking lesson at the largest size both kernels ran: tiled Triton vs naive on a GPU, blocked vs reordered loops on a CPU."""
    slow, fast = ("triton naive", "triton tiled") if gpu else ("reordered", "blocked")
    what = f"{fast} vs {slow} kernel, GFLOP/s ratio at the largest shared n"
    both = {p.n for p in timings.rows if p.kernel == slow} & {p.n for p in timings.rows if p.kernel == fast}
    if not both:
        return [Target.not_here(what, ">= 2x", f"the {slow} kernel did not run at any size the {fast} one did")]
    n = max(both)
    ratio = timings.find(kernel=fast, n=n).gflops / timings.find(kernel=slow, n=n).gflops
    return [Target.at_least(f"{what} (n={n:,})", ratio, 2.0, "x")]


def profile_targets(device) -> tuple[list[Target], KernelTable]:
    """Tensor-core kernels named in a bf16 step's profile on a GPU; oneDNN's bf16 implementations on a CPU that has them."""
    step = cnn_training_step(device, batch=32, channels=32, image=32, dtype="bf16")
    table = kernels_by_class(step, steps=3, device=device, label="bf16 autocast step", threads=None if is_gpu(device) else 1)
    if is_gpu(device):
        return [Target.at_least("distinct tensor-core kernels in a bf16 autocast step", table.find(kernel_class=TENSOR_CORE).kernels, 1)], table
    what = "oneDNN bf16 conv/matmul implementations in a bf16 autocast step"
    if "bf16" not in cpu_native_dtypes():
        return [Target.not_here(what, ">= 1", "this CPU has no bf16 arithmetic")], table
    if table.onednn is None or not table.onednn.rows:
        return [Target.not_here(what, ">= 1", "oneDNN logged no primitive here")], table
    bf16 = [r for r in table.onednn.rows if r.kernel_class in (CPU_GEMM, CPU_CONV) and ("bf16" in r.name or "amx" in r.name)]
    return [Target.at_least(what, len(bf16), 1)], table


def roofline_targets(roofline) -> list[Target]:
    """Element-wise work runs near the bandwidth roof; the largest matmul near the compute roof."""
    memory = [r for r in roofline.rows if r.bound == "memory"]
    matmuls = [r for r in roofline.rows if r.kind == "matmul"]
    targets = []
    if memory:  # well above the roof means caches served the data: the sizes are too small for this machine
        best = max(r.pct_of_roof for r in memory)
        targets += [Target.at_least("best memory-bound operator, % of its bandwidth roof", best, 50, "%"),
                    Target.at_most("best memory-bound operator, % of its bandwidth roof", best, 125, "%")]
    largest = max(matmuls, key=lambda r: r.flops) if matmuls else None
    if largest is not None and largest.bound == "compute":
        targets.append(Target.at_least(f"largest matmul ({largest.shape}), % of the compute roof", largest.pct_of_roof, 40, "%"))
    return targets


def run(quick: bool) -> BenchResult:
    device = pick_device(None)
    gpu = is_gpu(device)
    # element-wise sizes and the bandwidth stream stay the device's own even when quick: smaller ones fit in caches
    roofline = operator_roofline(device, matmul_sizes=(256, 1024) if quick else None, conv_batch=2 if quick else None,
                                 attention_seq=256 if quick else None, min_run_time=0.05 if quick else 0.1)
    check = triton_check(device=device)
    agreeing = sum(bool(r.agrees) for r in check.rows)
    triton_ok, why_not = triton_available()
    if gpu:
        timings = matmul_kernels((512, 1024) if quick else (512, 1024, 2048, 4096), device)
    else:
        timings = matmul_kernels((256, 512) if quick else (256, 1024, 4096), "cpu", rows=128 if quick else 256,
                                 naive_up_to=256, min_run_time=0.05 if quick else 0.1, rounds=1 if quick else 3)
    launch = measure_launch_overhead(_op_chain, 64, device=device, min_run_time=0.05 if quick else 0.2, compile=not quick)
    profiled, kernels = profile_targets(device)
    targets = [*full_runs_only(roofline_targets(roofline), quick),
               Target.at_least("Triton kernels that agree with torch.matmul", agreeing, 2) if triton_ok
               else Target.not_here("Triton kernels that agree with torch.matmul", ">= 2", why_not),
               *full_runs_only(kernel_targets(timings, gpu), quick), *full_runs_only(launch_targets(launch, compiled=not quick), quick), *profiled]
    return BenchResult("kernels", [roofline, check, timings, launch, kernels], targets)
