"""What automatic mixed precision saves on one training step: time (measured), and memory by category
(weights, gradients, optimizer state, activations) from ``helpers.core.memory.training_memory``.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import fast_dtypes, gpu_notice, is_gpu, peak_flops, pick_device
from helpers.core.memory import make_optimizer, training_memory
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.step import amp_name, resolve_amp, training_step
from helpers.core.timing import timeit

SAME_SPEED = 1.1  # a speed-up within this factor of 1 counts as no change
CPU_LOW_FLAGS = {"bf16": ("avx512_bf16", "amx_bf16"), "fp16": ("avx512_fp16", "amx_fp16")}  # helpers.core.device.cpu_native_dtypes reads these


@dataclass
class StepMemory:
    """Bytes of one training step by category; ``activation_bytes`` is the most forward keeps for backward."""

    mode: str
    parameters: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    peak_bytes: int

    @property
    def bytes_per_parameter(self) -> float:
        """Persistent training state (weights, gradients, optimizer state) per parameter."""
        return (self.param_bytes + self.grad_bytes + self.optimizer_bytes) / self.parameters


def step_memory(
    model: nn.Module,
    example_input: torch.Tensor,
    optimizer: str | Callable = "adam",
    amp: str | None = None,
    device: str | torch.device | None = None,
) -> StepMemory:
    """One training step's memory by category, from ``training_memory`` (fake tensors: nothing is allocated).

    ``optimizer`` is one of training_memory's names ("sgd", "sgd_momentum", "adam") or a
    factory; ``amp`` is None (fp32), "bf16", "fp16" or True (the device's default). The
    activations are the largest amount forward held at any point of the step; the tests
    check training_memory against real steps.
    """
    device = pick_device(device)
    return _step_memory(model, example_input, optimizer, resolve_amp(amp, device), device)


def _step_memory(model: nn.Module, example_input: torch.Tensor, optimizer: str | Callable, low: torch.dtype | None,
                 device: torch.device) -> StepMemory:
    """``step_memory`` with the device and the autocast dtype already resolved."""
    report = training_memory(model, example_input, optimizer, amp=low or False, device=device)
    on_device = [snapshot.get(report.device, {}) for _, snapshot in report.timeline]
    return StepMemory(
        mode=f"AMP {amp_name(low)}" if low else "fp32",
        parameters=report.param_count,
        param_bytes=report.param_bytes,
        grad_bytes=report.grad_bytes,
        optimizer_bytes=report.state_bytes,
        activation_bytes=max((s.get("activations", 0) for s in on_device), default=0),
        peak_bytes=report.peak_bytes,
    )


@dataclass
class PrecisionRun:
    mode: str = column("mode")
    step_seconds: float = column("step time", format_seconds)
    speedup: float = column("speed-up", ".2f")
    memory: StepMemory
    # the memory's figures, copied out so that the table's columns are fields
    weights: int = column("weights", format_bytes, init=False)
    gradients: int = column("gradients", format_bytes, init=False)
    optimizer_state: int = column("optimizer state", format_bytes, init=False)
    activations: int = column("activations", format_bytes, init=False)
    peak: int = column("peak", format_bytes, init=False)
    bytes_per_parameter: float = column("bytes / parameter", ".1f", init=False)

    def __post_init__(self):
        m = self.memory
        self.weights, self.gradients, self.optimizer_state = m.param_bytes, m.grad_bytes, m.optimizer_bytes
        self.activations, self.peak, self.bytes_per_parameter = m.activation_bytes, m.peak_bytes, m.bytes_per_parameter


class AmpComparison(Report):
    """fp32 against AMP on one model: step time, and memory by category."""

    title = "fp32 vs automatic mixed precision: one training step"

    def __init__(self, rows, notice: str | None, device: torch.device, native_low: bool):
        fp32, amp = rows
        notes = [f"activations: {amp.memory.activation_bytes / fp32.memory.activation_bytes:.2f}x of fp32; "
                 f"weights + gradients + optimizer state: {amp.memory.bytes_per_parameter:.1f} vs {fp32.memory.bytes_per_parameter:.1f} bytes per parameter"]
        super().__init__(rows, notes)
        self.notice = notice
        self.fp32, self.amp = fp32, amp
        self.device, self.native_low = device, native_low

    def speed_sentence(self) -> str:
        """What AMP did to the step time here, and why, read from the measured speed-up and the device's 16-bit support."""
        low, speedup = self.amp.mode.removeprefix("AMP "), self.amp.speedup
        if speedup >= SAME_SPEED:
            return (f"AMP ran the step {speedup:.2f}x as fast as fp32 on {self.device}: its matrix products ran in {low} on "
                    "units built for it, and its 16-bit tensors moved half the bytes.")
        if not self.native_low and not is_gpu(self.device):
            flags = " nor ".join(CPU_LOW_FLAGS.get(low, ()))
            why = (f"this CPU's flags (/proc/cpuinfo) list neither {flags}, so it likely has no native {low} arithmetic and the "
                   "16-bit products are converted to fp32 work, with casts around them" if flags else
                   f"this CPU has no {low} instructions the kit knows of")
        elif not self.native_low:
            why = f"{self.device} has no native {low} arithmetic (its compute capability), so the 16-bit products are converted back to fp32 work"
        elif is_gpu(self.device):
            why = ("a likely cause on a GPU, not measured here: the step's products are too small to keep the 16-bit units busy, "
                   "so kernel launches and memory traffic set its time (Lecture 5b), and autocast adds casts of its own")
        else:
            why = (f"this CPU's flags list {low} instructions, yet the step was not faster; the cause was not measured here "
                   "(autocast's casts, and kernels that do not use those instructions, are candidates)")
        timing = f"at fp32's speed ({speedup:.2f}x)" if speedup > 1 / SAME_SPEED else f"slower than fp32 ({1 / speedup:.2f}x its time)"
        return f"AMP ran the step {timing} on {self.device}: {why}. Its gain here is the activation memory."

    def plot(self, ax=None):
        parts = {
            "weights": [r.memory.param_bytes / 2**20 for r in self.rows],
            "gradients": [r.memory.grad_bytes / 2**20 for r in self.rows],
            "optimizer state": [r.memory.optimizer_bytes / 2**20 for r in self.rows],
            "activations": [r.memory.activation_bytes / 2**20 for r in self.rows],
        }
        return plots.stacked_bars([r.mode for r in self.rows], parts, ax, title="Training memory by category", ylabel="MiB")


def compute_bound_width(device: str | torch.device | None, batch: int, busy_seconds: float = 2e-4, cpu_width: int = 256) -> int:
    """Width of square linear layers whose (batch x width) @ (width x width) products take ``busy_seconds`` each at
    the device's 16-bit peak: far longer than a kernel launch (a few us), so AMP's faster units show in the step time.
    A multiple of 128 (tensor-core tiles). A CPU gets ``cpu_width``; a GPU whose peak the kit does not know, 4096."""
    device = pick_device(device)
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"compute_bound_width: batch={batch!r}; give the rows per step as a positive int")
    if not is_gpu(device):
        return cpu_width
    peak = peak_flops(device, amp_name(resolve_amp(True, device)))
    if peak is None:
        return 4096
    return max(128, round((busy_seconds * peak / (2 * batch)) ** 0.5 / 128) * 128)


def amp_comparison(
    model: nn.Module,
    example_input: torch.Tensor,
    device: str | torch.device | None = None,
    amp: str | None = None,
    optimizer: str | Callable = "adam",
    min_run_time: float = 0.5,
) -> AmpComparison:
    """Time a training step and measure its memory in fp32 and under autocast (bf16 on a CPU, fp16 on a GPU by default)."""
    device = pick_device(device)
    notice = gpu_notice("tensor-core mixed precision", device)
    low = resolve_amp(True if amp is None else amp, device)
    if low is None:
        raise ValueError("amp_comparison compares fp32 with AMP: pass amp=None (the device's default), 'fp16' or 'bf16', not False")
    rows = []
    for dtype in (None, low):
        net = copy.deepcopy(model).to(device)
        opt = make_optimizer(optimizer, list(net.parameters()), foreach=None)
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        x = example_input.to(device)
        seconds = timeit(training_step, net, opt, x, amp_dtype=dtype, scaler=scaler, device=device, min_run_time=min_run_time).median
        memory = _step_memory(model, example_input, optimizer, dtype, device)
        rows.append(PrecisionRun(memory.mode, seconds, rows[0].step_seconds / seconds if rows else 1.0, memory))
    return AmpComparison(rows, notice, device, amp_name(low) in fast_dtypes(device))
