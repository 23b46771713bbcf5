"""The starving accelerator: training throughput and time spent waiting for data against DataLoader workers.

``starvation_sweep`` trains the same model on the same ``EncodedDigits`` data
(PNG decode and augmentation on the CPU, plus an optional per-sample storage
delay) with num_workers = 0, 1, 2, ... and, on a GPU, pin_memory off and on.
"""
from __future__ import annotations

import copy
import os
import time
import warnings
from dataclasses import dataclass
from statistics import median
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.data import DataLoader, RandomSampler
from tqdm.auto import tqdm

from helpers.core import plots
from helpers.core.data import EncodedDigits, make_encoded_MNIST, make_loader
from helpers.core.device import cpu_threads, gpu_notice, is_gpu, pick_device
from helpers.core.models import LeNet
from helpers.core.report import Report, column, format_seconds
from helpers.core.training_loop import _percent, train

DATASET_SAMPLES = 1024  # distinct digits; runs draw from them with replacement, augmented afresh each time


@dataclass
class StarvationPoint:
    num_workers: int = column("num_workers")
    pin_memory: bool = column("pin_memory")
    steps: int = column("steps")
    startup_s: float = column("first batch (start-up)", format_seconds)
    waiting_s: float = column("waiting", format_seconds)
    computing_s: float = column("computing", format_seconds)
    samples_per_s: float = column("samples/s", ",.0f")
    waiting_share: float = column("waiting share", _percent)


class StarvationSweep(Report):
    """Throughput and waiting share per (num_workers, pin_memory), measured in the steady state."""

    title = "Starving the accelerator: DataLoader workers"

    def __init__(self, rows: Sequence[StarvationPoint], notes: Sequence[str], *, device: torch.device, batch_size: int, latency_ms: float, cpu_ms_per_sample: float):
        super().__init__(rows, notes)
        self.device = device
        self.batch_size = batch_size
        self.latency_ms = latency_ms
        self.cpu_ms_per_sample = cpu_ms_per_sample

    @property
    def starvation_ratio(self) -> float:
        """Waiting share with no workers divided by the waiting share at the best setting."""
        best = max(self.rows, key=lambda p: p.samples_per_s)
        return self.find(num_workers=0, pin_memory=False).waiting_share / max(best.waiting_share, 1e-9)

    def plot(self, ax=None):
        """Two panels: throughput, and the share of time spent waiting for data, against num_workers."""
        if ax is None:
            import matplotlib.pyplot as plt

            _, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
        else:
            left, right = ax
        counts = sorted({p.num_workers for p in self.rows})
        position = {w: i for i, w in enumerate(counts)}  # evenly spaced: 0, 1, 2, 4, 8, ... read as steps
        throughput, share = {}, {}
        for pinned in sorted({p.pin_memory for p in self.rows}):
            points = sorted((p for p in self.rows if p.pin_memory == pinned), key=lambda p: p.num_workers)
            name = "pinned" if pinned else ("pageable" if is_gpu(self.device) else "training on " + self.device.type)
            throughput[name] = ([position[p.num_workers] for p in points], [p.samples_per_s for p in points])
            share[name] = ([position[p.num_workers] for p in points], [100 * p.waiting_share for p in points])
        plots.line_chart(throughput, left, title="Throughput", xlabel="num_workers", ylabel="samples per second")
        plots.line_chart(share, right, title="Time waiting for data", xlabel="num_workers", ylabel="% of training time")
        for axis in (left, right):
            axis.set_xticks(range(len(counts)), [str(w) for w in counts])
        left.set_ylim(bottom=0)
        right.set_ylim(0, 100)
        return left, right


def starvation_sweep(
    workers: Sequence[int] = (0, 1, 2, 4, 8, 16),
    pin_memory: Sequence[bool] | None = None,
    batch_size: int = 64,
    steps: int = 32,
    latency_ms: float = 1.0,
    augment: bool = True,
    model_fn: Callable[[], nn.Module] = LeNet,
    device: str | torch.device | None = None,
    threads: int | None = None,
    dataset: EncodedDigits | None = None,
    progress: bool = True,
) -> StarvationSweep:
    """Train ``model_fn()`` per setting and measure how long it waits for data.

    Each sample costs a PNG decode and (``augment``) a random affine transform on
    the CPU, after a ``latency_ms`` sleep standing in for slow storage (0 turns it
    off; ``dataset`` replaces the default data and its settings). Each setting
    times ``steps`` steps (at least 4 per worker) in the steady state, after taking
    the first batch (workers starting; its wait is shown apart) and the two per
    worker loaded ahead without training on them.
    ``pin_memory`` defaults to (False, True) on a GPU and (False,) elsewhere.
    Training on the CPU uses ``threads`` torch threads (default: one fewer than
    the cores), leaving the workers a core.
    """
    device = pick_device(device)
    threads = threads or (torch.get_num_threads() if is_gpu(device) else max(1, (os.cpu_count() or 1) - 1))
    if pin_memory is None:
        pin_memory = (False, True) if is_gpu(device) else (False,)
    if any(pin_memory) and not is_gpu(device):
        gpu_notice("pin_memory (page-locked buffers for host-to-device copies)", device)
        pin_memory = (False,)
    if dataset is None:
        dataset = make_encoded_MNIST(subset=DATASET_SAMPLES, augment=augment, latency_ms=latency_ms)
    if len(dataset) < batch_size:
        raise ValueError(f"the data set has {len(dataset)} samples, fewer than one batch of {batch_size}: pass more data or a smaller batch_size.")
    cpu_ms = dataset.cpu_ms_per_sample()
    settings = [(w, pin) for pin in pin_memory for w in workers]
    with cpu_threads(threads), warnings.catch_warnings():
        # torch warns when workers outnumber cores; workers that wait on storage use no CPU, so here that is the point.
        warnings.filterwarnings("ignore", message="This DataLoader will create")
        rows = _measure(dataset, settings, model_fn(), batch_size, steps, device, progress)
    notes = _explain(dataset, cpu_ms, batch_size, median(p.computing_s / p.steps for p in rows), device, threads)
    longer = sorted({p.num_workers for p in rows if p.steps > steps})
    if longer:  # say why the steps column is not the same everywhere
        notes.insert(2, f"Each run times max(steps, 4 x num_workers) steps: {steps} asked for, and {', '.join(str(4 * w) for w in longer)} "
                        f"with {', '.join(str(w) for w in longer)} workers, so that refilling {'their' if len(longer) > 1 else 'its'} "
                        "pipeline is a small part of the measurement. Waiting and computing are totals over a run's steps; "
                        "samples/s and the waiting share compare the runs.")
    return StarvationSweep(rows, notes, device=device, batch_size=batch_size, latency_ms=dataset.latency_ms, cpu_ms_per_sample=cpu_ms)


def warmup_batches(num_workers: int) -> int:
    """Batches taken before timing: the first (workers starting) and the two per worker they were asked to load ahead."""
    return 2 * num_workers + 1


class _Started:
    """A loader's iterator already past its warm-up batches (taken without training), for ``train`` to consume.

    Draining the batches the workers loaded while they were being started leaves
    them mid-way through their next ones, as in the steady state, so neither the
    start-up time nor batches loaded during it land in the measurement.
    """

    def __init__(self, loader: DataLoader, warmup: int, steps: int):
        self.num_workers, self.pin_memory, self.source = loader.num_workers, loader.pin_memory, getattr(loader, "source", None)
        self.steps = steps
        self.iterator = iter(loader)
        start = time.perf_counter()
        next(self.iterator)
        self.startup_s = time.perf_counter() - start
        for _ in range(warmup - 1):
            next(self.iterator)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return self.iterator


def _measure(dataset, settings, initial: nn.Module, batch_size: int, steps: int, device: torch.device, progress: bool) -> list[StarvationPoint]:
    """Train a fresh copy of ``initial`` per (num_workers, pin_memory) setting and time its steady state.

    Samples are drawn with replacement, so a small data set feeds runs of any length;
    runs with many workers get at least 4 steps per worker, so one refill of the
    pipeline is a small part of the measurement.
    """
    train(copy.deepcopy(initial), make_loader(dataset, batch_size), device=device, max_steps=2, progress=False)  # pay one-off costs first
    rows = []
    for num_workers, pinned in tqdm(settings, desc="num_workers x pin_memory", disable=not progress):
        run_steps, warmup = max(steps, 4 * num_workers), warmup_batches(num_workers)
        sampler = RandomSampler(dataset, replacement=True, num_samples=batch_size * (warmup + run_steps))
        started = _Started(make_loader(dataset, batch_size, num_workers, pinned, shuffle=False, sampler=sampler), warmup, run_steps)
        report = train(copy.deepcopy(initial), started, device=device, progress=False)
        rows.append(StarvationPoint(num_workers, pinned, report.steps, started.startup_s, report.waiting_s, report.computing_s, report.samples_per_s, report.waiting_share))
    return rows


def _explain(dataset: EncodedDigits, cpu_ms: float, batch_size: int, compute_s_per_step: float, device: torch.device, threads: int) -> list[str]:
    """What the workers can overlap on this machine, in numbers measured by the sweep."""
    cores = os.cpu_count() or 1
    per_batch_cpu = cpu_ms * batch_size
    per_batch_storage = dataset.latency_ms * batch_size
    lines = [
        f"Per batch of {batch_size}: {per_batch_cpu:.1f} ms of CPU work to decode and {'augment' if dataset.augment else 'convert'} "
        f"({cpu_ms:.3f} ms per sample, measured), {per_batch_storage:.1f} ms of storage delay ({dataset.latency_ms:g} ms per sample, "
        f"a sleep that uses no CPU), against {1e3 * compute_s_per_step:.1f} ms of training compute on {device}.",
        "With num_workers=0 the training process does all of it itself between steps, so the model waits for every sample. "
        "Each run first takes 2 x num_workers + 1 batches untimed (workers starting and loading ahead), then times its steps.",
        f"Workers are separate processes: their storage waits overlap with each other and with training (N workers hide about N "
        f"batches' delay at once), and their decoding leaves the training process. This machine has {cores} CPU cores shared by "
        f"the workers and training, so decoding is only hidden while training leaves a core idle; more workers cannot add CPU time.",
    ]
    if not is_gpu(device):
        lines.append(
            f"Here the model trains on the CPU too ({threads} torch thread{'s' if threads > 1 else ''}, leaving the workers a core: a training "
            "thread whose core a worker takes stalls the others at every parallel step), so compute and decoding compete; "
            "on a GPU the compute leaves the CPU and the same sweep shows the GPU starving."
        )
    return lines
