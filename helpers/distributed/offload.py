"""Offloading the optimizer to host memory: the device memory it frees, and the copies it adds to every step.

``OffloadedAdam`` keeps Adam's fp32 master weights and moments in host memory (ZeRO-Offload's
split, without its overlap of copies and compute). Lecture 4 writes it in a cell and passes it in; the class here
is the same text (tests/test_hardware_lecture_code.py keeps the two identical). ``offload_memory`` compares it with Adam on
the device: memory per device from ``training_memory`` (without a GPU, two fake CPU devices
stand in for the accelerator and the host), the transfer time derived from a measured copy
bandwidth, and real update times.
"""
from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import is_gpu
from helpers.core.fake import first_device
from helpers.core.memory import training_memory
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import time_interleaved
from helpers.distributed.memsave import demo_transformer, example_batch, mean_square_loss, update_function
from helpers.hardware import transfer_sweep

# Without a GPU, the estimate puts the model on one fake CPU device and the host memory on another.
STAND_IN_ACCELERATOR, STAND_IN_HOST = "cpu:0", "cpu:1"


class OffloadedAdam(torch.optim.Optimizer):
    """Adam whose fp32 master weights and moments live on `host`: the device keeps only the weights and their gradients."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, host="cpu"):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.host = torch.device(host)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # the first step puts an fp32 copy of the weights and both moments on the host
                    master = p.detach().to(self.host, torch.float32, copy=True)
                    state.update(step=0, master=master, exp_avg=torch.zeros_like(master), exp_avg_sq=torch.zeros_like(master))
                grad = p.grad.to(self.host, torch.float32)  # copy 1: the gradient, device -> host
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.lerp_(grad, 1 - beta1)  # Adam's update, on the host: the moments...
                v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denominator = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)
                state["master"].addcdiv_(m, denominator, value=-lr / (1 - beta1**t))  # ...and the fp32 master weights
                p.copy_(state["master"])  # copy 2: the new weights, host -> device, in the model's own dtype


def offloaded_adam(host: str | torch.device, optimizer: type = OffloadedAdam):
    """An optimizer factory (for ``training_memory`` and friends) making ``optimizer`` with its state on ``host``."""

    def factory(params):
        return optimizer(params, host=host)

    factory.__name__ = f"Adam offloaded to {host}"
    return factory


@dataclass
class OffloadRow:
    setup: str = column("setup")
    device_peak: int = column("peak on the device", format_bytes)
    device_optimizer_state: int = column("optimizer state on the device", format_bytes)
    host_bytes: int = column("host memory at its peak", format_bytes)
    copied_per_step: int = column("copied per step", format_bytes)
    transfer_seconds: float = column("copy time (derived)", format_seconds)
    update_seconds: float | None = column("update time (measured)", format_seconds)


class Offload(Report):
    """Memory on the accelerator and the host, with and without offloading the optimizer, and the copies' cost."""

    def __init__(self, rows: list[OffloadRow], notes: list[str], title: str, bandwidth_gbs: float):
        self.title, self.bandwidth_gbs = title, bandwidth_gbs
        self.device_saving = rows[0].device_peak - rows[1].device_peak
        super().__init__(rows, notes)

    def plot(self, ax=None):
        names = [textwrap.fill(r.setup, 22) for r in self.rows]
        ax = plots.grouped_bars(names, {"device": [r.device_peak for r in self.rows], "host": [r.host_bytes for r in self.rows]}, ax,
                                title="Peak memory per device, with and without offloading", ylabel="memory at the peak")
        plots.bytes_axis(ax)
        return ax


def _copy_bandwidth_gbs(device: torch.device, size_bytes: int) -> tuple[float, str]:
    """Measured copy bandwidth for ``size_bytes``: pageable host-to-device on a GPU, host-to-host memory copy on a CPU."""
    sweep = transfer_sweep(sizes_mib=(max(size_bytes / 2**20, 0.25),), device=device)
    point = sweep.rows[0]
    if is_gpu(device):
        return point.pageable_gbs, "pageable host-to-device copy, measured on this GPU"
    return point.host_copy_gbs, "host-to-host memory copy, measured on this CPU (no GPU: no PCIe link to measure)"


def offload_memory(model: nn.Module | None = None, optimizer: type = OffloadedAdam, batch_size: int = 2, rounds: int = 3) -> Offload:
    """Adam on the device against Adam offloaded to the host: device and host memory, copy time, update time.

    ``optimizer`` is the offloading optimizer, a class taking ``(params, host=...)`` (the lecture passes its
    cell's ``OffloadedAdam``). The model runs where it is (a GPU when the notebook put it there). Rows: fp32
    with Adam on the device; fp32 with ``optimizer``; half-precision weights with the fp32 master copy and
    Adam on the host (ZeRO-Offload's layout, memory only). ``rounds`` > 0 times real updates.
    """
    model = model if model is not None else demo_transformer()
    example = example_batch(model, batch_size)
    real_device = first_device(model)  # a parameter's device always carries its index (cuda:0), as the report's keys do
    gpu = is_gpu(real_device)
    accelerator, host = (str(real_device), "cpu") if gpu else (STAND_IN_ACCELERATOR, STAND_IN_HOST)
    half = torch.float16 if gpu else torch.bfloat16
    setups = [
        ("Adam on the device (fp32)", dict(optimizer="adam")),
        ("Adam offloaded to the host (fp32)", dict(optimizer=offloaded_adam(host, optimizer))),
        (f"{str(half).replace('torch.', '')} weights, fp32 master + Adam on the host", dict(optimizer=offloaded_adam(host, optimizer), dtype=half)),
    ]
    times: dict[str, list[float]] = {}
    if rounds > 0:
        updates = {"device": update_function(model, example, "adam"), "offloaded": update_function(model, example, offloaded_adam("cpu", optimizer))}
        for _ in range(rounds):  # one update of each per round, the two taking turns: every round's time is kept, for the spread
            for key, turns in time_interleaved(updates, real_device, 1, cpu_threads=1).items():
                times.setdefault(key, []).append(turns.fastest)
    seconds = {key: min(values) for key, values in times.items()}
    reports = [training_memory(model, example, loss_fn=mean_square_loss, device=accelerator, **settings) for _, settings in setups]
    moved = [2 * r.param_bytes if i else 0 for i, r in enumerate(reports)]  # gradients out, weights back: both the parameters' size
    bandwidth, basis = _copy_bandwidth_gbs(real_device, max(moved) // 2)
    rows = []
    for i, ((name, _), report) in enumerate(zip(setups, reports)):
        measured = seconds.get("offloaded" if i == 1 else "device") if i < 2 else None
        rows.append(OffloadRow(name, report.peak_by_device[accelerator], report.categories_by_device[accelerator]["optimizer state"],
                               report.peak_by_device.get(host, 0), moved[i], moved[i] / (bandwidth * 1e9), measured))
    where = f"on {accelerator}" if gpu else f"on {STAND_IN_ACCELERATOR} standing in for the accelerator and {STAND_IN_HOST} for the host"
    notes = [f"{type(model).__name__}, batch {batch_size}: memory from training_memory {where}.",
             f"Offloading frees {format_bytes(rows[0].device_peak - rows[1].device_peak)} on the device; every step then copies the gradients "
             f"to the host and the weights back ({format_bytes(rows[1].copied_per_step)}), {format_seconds(rows[1].transfer_seconds)} at "
             f"{bandwidth:.1f} GB/s ({basis}).",
             f"Update times are real steps (the fastest of {rounds} rounds in which the two take turns) on " + (str(real_device) if gpu else "the CPU, where 'offloading' copies host to host: the copies cost "
                                                   "memory bandwidth, not a PCIe link") + "; ZeRO-Offload hides the copies behind backward, this "
             "optimizer does not."]
    report = Offload(rows, notes, f"Offloading Adam to host memory (batch {batch_size})", bandwidth)
    report.update_times = times  # "device" and "offloaded": one update's seconds in each round
    return report
