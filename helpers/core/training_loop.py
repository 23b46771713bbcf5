"""A device-agnostic training loop that times waiting for data apart from computing, and CPU-vs-GPU training.

``train`` moves the model and every batch to the device, shows a tqdm bar, and
returns a report: per epoch the seconds spent waiting for the loader and the
seconds spent computing (device synchronised before every clock reading),
throughput and losses. ``train_on_devices`` trains copies of one model on the
CPU, the GPU and (with two or more GPUs) DataParallel, side by side.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from helpers.core import plots
from helpers.core.data import make_MNIST_loader
from helpers.core.device import gpu_available, gpu_notice, is_gpu, pick_device, synchronize
from helpers.core.models import LeNet
from helpers.core.report import Report, column, format_seconds
from helpers.core.step import training_step


def _percent(share: float) -> str:
    return f"{100 * share:.1f}%"


@dataclass
class EpochTimes:
    epoch: int = column("epoch")
    steps: int = column("steps")
    samples: int = column("samples", ",")
    waiting_s: float = column("waiting for data", format_seconds)
    computing_s: float = column("computing", format_seconds)
    waiting_share: float = column("waiting share", _percent, init=False)
    samples_per_s: float = column("samples/s", ",.0f")
    mean_loss: float = column("mean loss", ".3f")

    def __post_init__(self):
        self.waiting_share = self.waiting_s / (self.waiting_s + self.computing_s)


class TrainReport(Report):
    """Where a training run's time went, per epoch: waiting for the next batch vs computing on it."""

    def __init__(self, rows: Sequence[EpochTimes], *, device: torch.device, model_name: str, losses: list[float], step_waits: list[float], step_computes: list[float], num_workers: int, pin_memory: bool, source: str | None):
        self.device = device
        self.model_name = model_name
        self.losses = losses
        self.step_waits = step_waits
        self.step_computes = step_computes
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.source = source
        self.steps = sum(r.steps for r in rows)
        self.samples = sum(r.samples for r in rows)
        self.waiting_s = sum(r.waiting_s for r in rows)
        self.computing_s = sum(r.computing_s for r in rows)
        self.total_s = self.waiting_s + self.computing_s
        self.waiting_share = self.waiting_s / self.total_s if self.total_s else 0.0
        self.samples_per_s = self.samples / self.total_s if self.total_s else 0.0
        self.final_loss = losses[-1] if losses else float("nan")
        self.title = f"Training {model_name} on {device}: {self.samples:,} samples in {format_seconds(self.total_s)}"
        notes = [
            f"num_workers={num_workers}, pin_memory={pin_memory}, data: {source or 'unnamed'}.",
            "waiting = time blocked on the loader for the next batch; computing = copy to the device, forward, "
            "backward and optimizer step, with the device synchronised before each clock reading.",
        ]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        """Stacked bars per epoch: seconds waiting for data under seconds computing."""
        return plots.stacked_bars(
            [f"epoch {r.epoch}" for r in self.rows],
            {"waiting": [r.waiting_s for r in self.rows], "computing": [r.computing_s for r in self.rows]},
            ax,
            title=f"{self.model_name} on {self.device}: where the time went",
            ylabel="seconds",
        )

    def plot_losses(self, ax=None):
        """The training loss at every step."""
        steps = list(range(1, len(self.losses) + 1))
        return plots.line_chart({"loss": (steps, self.losses)}, ax, title=f"{self.model_name}: training loss", xlabel="step", ylabel="cross-entropy loss")


def train(
    model: nn.Module,
    loader: Iterable,
    epochs: int = 1,
    device: str | torch.device | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    lr: float = 0.01,
    max_steps: int | None = None,
    progress: bool = True,
    step: Callable[[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> TrainReport:
    """Train ``model`` on ``loader`` for ``epochs`` on ``device`` and report waiting vs computing time.

    The model is moved to the device before the optimizer is built (default: SGD
    with momentum 0.9 at ``lr``); each batch follows with ``non_blocking=True``
    on a GPU, which overlaps the copy only when the loader pins memory.
    ``max_steps`` caps the steps per epoch (for quick runs). ``step``: a notebook's own
    training step, ``step(model, optimizer, inputs, targets)`` returning the loss, used
    instead of the kit's (then ``loss_fn`` is the step's business).
    """
    device = pick_device(device)
    model.to(device).train()
    optimizer = optimizer or torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = loss_fn or nn.functional.cross_entropy
    non_blocking = is_gpu(device)
    limits = [n for n in (len(loader) if hasattr(loader, "__len__") else None, max_steps) if n]
    steps_per_epoch = min(limits) if limits else None  # None: an iterable of unknown length, run to its end
    name = type(getattr(model, "module", model)).__name__ + (" (DataParallel)" if isinstance(model, nn.DataParallel) else "")
    rows, losses, waits, computes = [], [], [], []
    bar = tqdm(total=epochs * steps_per_epoch if steps_per_epoch else None, desc=f"{name} on {device}", disable=not progress, leave=True)
    for epoch in range(1, epochs + 1):
        epoch_losses, samples = [], 0
        synchronize(device)
        ready = time.perf_counter()
        for index, (inputs, targets) in enumerate(loader, start=1):
            arrived = time.perf_counter()
            inputs, targets = inputs.to(device, non_blocking=non_blocking), targets.to(device, non_blocking=non_blocking)
            if step is None:
                loss = training_step(model, optimizer, inputs, lambda output, targets=targets: loss_fn(output, targets))
            else:
                loss = step(model, optimizer, inputs, targets)
            synchronize(device)
            value = loss.item()
            done = time.perf_counter()
            waits.append(arrived - ready)
            computes.append(done - arrived)
            epoch_losses.append(value)
            samples += len(targets)
            bar.set_postfix_str(f"epoch {epoch}/{epochs}, loss {value:.3f}", refresh=False)
            bar.update()
            ready = time.perf_counter()
            if index == steps_per_epoch:
                break
        if not epoch_losses:
            raise ValueError(f"the loader yielded no batches in epoch {epoch}: check its data set is not empty (and drop_last with fewer samples than a batch).")
        losses += epoch_losses
        wait_s, compute_s = sum(waits[-len(epoch_losses):]), sum(computes[-len(epoch_losses):])
        rows.append(EpochTimes(epoch, len(epoch_losses), samples, wait_s, compute_s, samples / (wait_s + compute_s), sum(epoch_losses) / len(epoch_losses)))
    bar.close()
    return TrainReport(
        rows,
        device=device,
        model_name=name,
        losses=losses,
        step_waits=waits,
        step_computes=computes,
        num_workers=getattr(loader, "num_workers", 0),
        pin_memory=getattr(loader, "pin_memory", False),
        source=getattr(loader, "source", None),
    )


# ---------------------------------------------------------------- CPU vs GPU


@dataclass
class DeviceRun:
    setup: str = column("setup")
    device: str = column("device")
    batch_size: int = column("batch")
    steps: int = column("steps")
    seconds: float = column("time", format_seconds)
    samples_per_s: float = column("samples/s", ",.0f")
    waiting_share: float = column("waiting share", _percent)
    final_loss: float = column("final loss", ".3f")


class DeviceComparison(Report):
    """The same model, data and initial weights trained on each available setup."""

    title = "Training on CPU vs GPU"

    def __init__(self, rows: Sequence[DeviceRun], reports: dict[str, TrainReport], notices: list[str]):
        super().__init__(rows, notices)
        self.reports = reports
        self.notices = notices

    def speedup(self, setup: str, over: str = "CPU") -> float:
        """Throughput of ``setup`` divided by that of ``over``."""
        return self.find(setup=setup).samples_per_s / self.find(setup=over).samples_per_s

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, ylabel="samples per second")
        ax.bar([r.setup for r in self.rows], [r.samples_per_s for r in self.rows], color=[plots.color_for(r.device.split(":")[0], i) for i, r in enumerate(self.rows)])
        return ax


def train_on_devices(
    model_fn: Callable[[], nn.Module] = LeNet,
    epochs: int = 1,
    cpu_batch_size: int = 128,
    gpu_batch_size: int = 512,
    max_steps: int | None = None,
    subset: int | None = None,
    num_workers: int = 0,
    progress: bool = True,
    step: Callable[[nn.Module, torch.optim.Optimizer, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> DeviceComparison:
    """Train one model (same initial weights, same data) on the CPU, on one GPU, and with DataParallel.

    The GPU runs use a larger batch, as the lecture did, since a GPU needs more
    work per step to be busy. Each setup first trains two untimed steps on a
    throwaway copy, so one-off start-up costs are not billed to it. Without a
    GPU, or with fewer than two, the missing setups are named in a notice instead.
    ``model_fn`` and ``step`` may be a notebook's own network and training step (see ``train``).
    """
    initial = model_fn()
    setups = [("CPU", "cpu", cpu_batch_size)]
    notices = []
    if gpu_available():
        setups.append(("GPU", "cuda:0", gpu_batch_size))
        if torch.cuda.device_count() >= 2:
            setups.append((f"DataParallel x{torch.cuda.device_count()}", "cuda:0", gpu_batch_size * torch.cuda.device_count()))
        else:
            notices.append("DataParallel needs two or more GPUs; this machine has one, so it is left out.")
    else:  # shown once, in the report's notes
        notices.append(gpu_notice("training on a GPU and with DataParallel", "cpu", echo=False))
    rows, reports = [], {}
    for setup, device, batch_size in setups:
        loader = make_MNIST_loader(batch_size=batch_size, num_workers=num_workers, subset=subset, verbose=not reports)
        fresh = (lambda: nn.DataParallel(copy.deepcopy(initial).to(device))) if setup.startswith("DataParallel") else (lambda: copy.deepcopy(initial))
        train(fresh(), loader, 1, device, max_steps=2, progress=False, step=step)  # untimed warm-up: CUDA context, kernel choice, allocations
        report = train(fresh(), loader, epochs, device, max_steps=max_steps, progress=progress, step=step)
        reports[setup] = report
        rows.append(DeviceRun(setup, str(report.device), batch_size, report.steps, report.total_s, report.samples_per_s, report.waiting_share, report.final_loss))
    return DeviceComparison(rows, reports, notices)
