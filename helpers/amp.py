"""What automatic mixed precision saves, measured on one real training step: time, and memory by category
(weights, gradients, optimizer state, activations) read with torch's MemTracker.

``step_memory`` is the one place that measures; it takes the arguments of a whole-step memory estimate
(model, example input, optimizer, amp), so the two can be compared or exchanged.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from . import plots
from .bench import timeit
from .device import gpu_notice, is_gpu, pick_device, synchronize
from .precision import DTYPE_NAMES, amp_dtype
from .report import Column, Report, format_bytes, format_seconds


@dataclass
class StepMemory:
    """Bytes of one training step by category; ``activation_bytes`` is what forward keeps for backward."""

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


def make_optimizer(optimizer: str | Callable, params) -> torch.optim.Optimizer:
    """'adam' (one tensor at a time, so no multi-tensor temporaries blur the state's size), 'sgd' with momentum, or a factory."""
    if callable(optimizer):
        return optimizer(params)
    choices = {"adam": lambda p: torch.optim.Adam(p, foreach=False), "sgd": lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)}
    if optimizer not in choices:
        raise ValueError(f"unknown optimizer {optimizer!r}: pass 'adam', 'sgd' or a function params -> torch.optim.Optimizer")
    return choices[optimizer](params)


def _loss(out: torch.Tensor) -> torch.Tensor:
    """A stand-in loss (mean square of the output, in fp32): the memory and time are the model's, not the loss's."""
    return out.float().square().mean()


def _train_step(model, optimizer, x, low: torch.dtype | None, scaler=None) -> None:
    """Forward (under autocast when ``low`` is set), the loss, backward, optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=low or torch.float32, enabled=low is not None):
        out = model(x)
    loss = _loss(out)
    if scaler is None:
        loss.backward()
        optimizer.step()
    else:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def step_memory(
    model: nn.Module,
    example_input: torch.Tensor,
    optimizer: str | Callable = "adam",
    amp: str | None = None,
    device: str | torch.device | None = None,
) -> StepMemory:
    """Measure the memory of one real training step by category with torch's MemTracker.

    Two steps run under the tracker (the first creates the optimizer state);
    during the second it reads what forward saved for backward, the gradients after
    backward and the optimizer state after the step. On a GPU the peak is
    torch.cuda.max_memory_allocated, which counts every tensor on the device.
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    device = pick_device(device)
    low = amp_dtype(device, amp) if amp else None
    model = copy.deepcopy(model).to(device)
    x = example_input.to(device)
    opt = make_optimizer(optimizer, model.parameters())
    scaler = torch.amp.GradScaler(device.type) if low == torch.float16 else None
    tracker = MemTracker()
    tracker.track_external(model, opt)
    readings = {}
    if is_gpu(device):
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with tracker:
        for _ in range(2):
            tracker.reset_mod_stats()
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=low or torch.float32, enabled=low is not None):
                out = model(x)
            readings["forward"] = _categories(tracker.get_tracker_snapshot(), device)
            loss = _loss(out)
            (scaler.scale(loss) if scaler else loss).backward()
            del out, loss
            readings["backward"] = _categories(tracker.get_tracker_snapshot(), device)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            readings["step"] = _categories(tracker.get_tracker_snapshot(), device)
    peak = _categories(tracker.get_tracker_snapshot("peak"), device)["Total"]
    if is_gpu(device):
        synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    return StepMemory(
        mode=f"AMP {DTYPE_NAMES[low]}" if low else "fp32",
        parameters=sum(p.numel() for p in model.parameters()),
        param_bytes=readings["step"]["PARAM"],
        grad_bytes=readings["backward"]["GRAD"],
        optimizer_bytes=readings["step"]["OPT"],
        activation_bytes=readings["forward"]["ACT"],
        peak_bytes=peak,
    )


def _categories(snapshot: dict, device: torch.device) -> dict[str, int]:
    """MemTracker's snapshot for ``device`` as {'PARAM': bytes, 'GRAD': ..., 'Total': ...}."""
    per_device = next((v for k, v in snapshot.items() if torch.device(k).type == device.type), {})
    return {getattr(k, "name", k): v for k, v in per_device.items()}


@dataclass
class PrecisionRun:
    mode: str
    step_seconds: float
    speedup: float
    memory: StepMemory


class AmpComparison(Report):
    """fp32 against AMP on one model: step time, and memory by category."""

    title = "fp32 vs automatic mixed precision: one training step"
    columns = (
        Column("mode", "mode"),
        Column("step_seconds", "step time", format_seconds),
        Column("speedup", "speed-up", ".2f"),
        Column("memory", "weights", lambda m: format_bytes(m.param_bytes)),
        Column("memory", "gradients", lambda m: format_bytes(m.grad_bytes)),
        Column("memory", "optimizer state", lambda m: format_bytes(m.optimizer_bytes)),
        Column("memory", "activations", lambda m: format_bytes(m.activation_bytes)),
        Column("memory", "peak", lambda m: format_bytes(m.peak_bytes)),
        Column("memory", "bytes / parameter", lambda m: f"{m.bytes_per_parameter:.1f}"),
    )

    def __init__(self, rows, notice: str | None):
        fp32, amp = rows
        notes = [f"activations: {amp.memory.activation_bytes / fp32.memory.activation_bytes:.2f}x of fp32; "
                 f"weights + gradients + optimizer state: {amp.memory.bytes_per_parameter:.1f} vs {fp32.memory.bytes_per_parameter:.1f} bytes per parameter"]
        super().__init__(rows, notes)
        self.notice = notice
        self.fp32, self.amp = fp32, amp

    def plot(self, ax=None):
        parts = {
            "weights": [r.memory.param_bytes / 2**20 for r in self.rows],
            "gradients": [r.memory.grad_bytes / 2**20 for r in self.rows],
            "optimizer state": [r.memory.optimizer_bytes / 2**20 for r in self.rows],
            "activations": [r.memory.activation_bytes / 2**20 for r in self.rows],
        }
        return plots.stacked_bars([r.mode for r in self.rows], parts, ax, title="Training memory by category", ylabel="MiB")


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
    low = amp_dtype(device, amp)
    rows = []
    for dtype in (None, low):
        net = copy.deepcopy(model).to(device)
        opt = make_optimizer(optimizer, net.parameters())
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        x = example_input.to(device)
        seconds = timeit(_train_step, net, opt, x, dtype, scaler, device=device, min_run_time=min_run_time).median
        memory = step_memory(model, example_input, optimizer, DTYPE_NAMES[dtype] if dtype else None, device)
        rows.append(PrecisionRun(memory.mode, seconds, rows[0].step_seconds / seconds if rows else 1.0, memory))
    return AmpComparison(rows, notice)
