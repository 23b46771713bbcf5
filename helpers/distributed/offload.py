"""Offloading the optimizer to host memory: the device memory it frees, and the copies it adds to every step.

``OffloadedAdam`` keeps Adam's fp32 master weights and moments in host memory (ZeRO-Offload's
split, without its overlap of copies and compute). ``offload_memory`` compares it with Adam on
the device: memory per device from ``training_memory`` (without a GPU, two fake CPU devices
stand in for the accelerator and the host), the transfer time derived from a measured copy
bandwidth, and real update times.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import is_gpu
from helpers.core.fake import first_device
from helpers.core.memory import MasterWeightAdam, training_memory
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import time_interleaved
from helpers.distributed.memsave import demo_transformer, example_batch, mean_square_loss, update_function
from helpers.hardware import transfer_sweep

# Without a GPU, the estimate puts the model on one fake CPU device and the host memory on another.
STAND_IN_ACCELERATOR, STAND_IN_HOST = "cpu:0", "cpu:1"


class OffloadedAdam(MasterWeightAdam):
    """Adam whose fp32 master weights and moments live on ``host``: the device keeps only weights and gradients.

    Each step copies the gradients to the host, updates the master weights there, and copies
    them back into the (possibly half-precision) parameters on the device.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 host: str | torch.device = "cpu"):
        super().__init__(params, lr=lr, betas=betas, eps=eps, master_device=host)


def offloaded_adam(host: str | torch.device):
    """An optimizer factory (for ``training_memory`` and friends) making ``OffloadedAdam`` with its state on ``host``."""

    def factory(params):
        return OffloadedAdam(params, host=host)

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


def offload_memory(model: nn.Module | None = None, batch_size: int = 2, rounds: int = 3) -> Offload:
    """Adam on the device against Adam offloaded to the host: device and host memory, copy time, update time.

    The model runs where it is (a GPU when the notebook put it there). Rows: fp32 with Adam on
    the device; fp32 with ``OffloadedAdam``; half-precision weights with the fp32 master copy
    and Adam on the host (ZeRO-Offload's layout, memory only). ``rounds`` > 0 times real updates.
    """
    model = model if model is not None else demo_transformer()
    example = example_batch(model, batch_size)
    real_device = first_device(model)  # a parameter's device always carries its index (cuda:0), as the report's keys do
    gpu = is_gpu(real_device)
    accelerator, host = (str(real_device), "cpu") if gpu else (STAND_IN_ACCELERATOR, STAND_IN_HOST)
    half = torch.float16 if gpu else torch.bfloat16
    setups = [
        ("Adam on the device (fp32)", dict(optimizer="adam")),
        ("Adam offloaded to the host (fp32)", dict(optimizer=offloaded_adam(host))),
        (f"{str(half).replace('torch.', '')} weights, fp32 master + Adam on the host", dict(optimizer=offloaded_adam(host), dtype=half)),
    ]
    seconds = {}
    if rounds > 0:
        updates = {"device": update_function(model, example, "adam"), "offloaded": update_function(model, example, offloaded_adam("cpu"))}
        seconds = {key: t.fastest for key, t in time_interleaved(updates, real_device, rounds, cpu_threads=1).items()}
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
             "Update times are real steps on " + (str(real_device) if gpu else "the CPU, where 'offloading' copies host to host: the copies cost "
                                                   "memory bandwidth, not a PCIe link") + "; ZeRO-Offload hides the copies behind backward, this "
             "optimizer does not."]
    return Offload(rows, notes, f"Offloading Adam to host memory (batch {batch_size})", bandwidth)
