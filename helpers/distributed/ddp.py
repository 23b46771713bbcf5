"""DistributedDataParallel, measured: gradient buckets, compute/communication overlap, ``no_sync`` and scaling.

Each function launches real workers (``helpers.core.workers``), wraps a model in DDP, and watches what DDP does
through a communication hook that records when each bucket's all-reduce is launched and how big it is.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from helpers.core import plots
from helpers.core.models import LeNet
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.workers import available_cores, launch
from helpers.distributed.collectives import time_collective, torch_all_reduce
from helpers.distributed.comm_models import Link, all_reduce_time


def mlp(width: int = 512, depth: int = 8) -> nn.Sequential:
    """A deep stack of equal linear layers: many gradients of equal size, so buckets are easy to see."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class BucketLog:
    """The comm hook's notebook: (launch time, bytes) of every bucket all-reduce DDP starts."""

    def __init__(self):
        self.events: list[tuple[float, int]] = []

    def clear(self) -> None:
        self.events.clear()


def recording_hook(log, bucket):
    """A DDP communication hook: note the bucket, then all-reduce it exactly as DDP's default does."""
    buffer = bucket.buffer()
    log.events.append((time.perf_counter(), buffer.numel() * buffer.element_size()))
    return default_hooks.allreduce_hook(None, bucket)


# DDP checks the hook's annotations as objects, which `from __future__ import annotations` would turn into strings.
recording_hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}


def _wrap(model: nn.Module, bucket_cap_mb: float | None = None) -> tuple[DistributedDataParallel, BucketLog]:
    options = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = DistributedDataParallel(model, **options)
    log = BucketLog()
    ddp.register_comm_hook(log, recording_hook)
    return ddp, log


def _batch(model_in: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, model_in, generator=g), torch.randn(batch, model_in, generator=g)


# ---------------------------------------------------------------- buckets and overlap


@dataclass
class BucketRun:
    bucket_cap_mb: float = column("bucket_cap_mb", "g")
    buckets: int = column("buckets per step")
    largest_bucket: int = column("largest bucket", format_bytes)
    first_launch_pct: float = column("1st all-reduce at % of backward", ".0f")
    step_seconds: float = column("DDP step", format_seconds)
    compute_seconds: float = column("compute only", format_seconds)
    all_reduce_seconds: float = column("all-reduce alone", format_seconds)
    hidden_pct: float = column("comm. hidden %", ".0f")


class BucketSweep(Report):
    """Per bucket cap: how many all-reduces DDP starts, how early the first starts, and the step time."""

    title = "DDP gradient buckets: count, overlap with backward, step time"

    def plot(self, ax=None):
        caps = [f"{r.bucket_cap_mb:g} MB" for r in self.rows]
        ax = plots.grouped_bars(caps, {"DDP step": [r.step_seconds * 1e3 for r in self.rows],
                                       "compute only": [r.compute_seconds * 1e3 for r in self.rows],
                                       "compute + all-reduce, no overlap": [(r.compute_seconds + r.all_reduce_seconds) * 1e3 for r in self.rows]},
                                ax, title="DDP step time by bucket cap", xlabel="bucket_cap_mb", ylabel="milliseconds per step")
        return ax


def _median_step(step, steps: int) -> float:
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _bucket_worker(caps: Sequence[float], width: int, depth: int, batch: int, steps: int) -> list[BucketRun]:
    rank = dist.get_rank()
    x, y = _batch(width, batch, seed=rank)
    runs = []
    for cap in caps:
        torch.manual_seed(0)
        ddp, log = _wrap(mlp(width, depth), cap)
        marks: list[float] = []

        def step():
            ddp.zero_grad(set_to_none=False)
            loss = nn.functional.mse_loss(ddp(x), y)
            marks.append(time.perf_counter())
            loss.backward()

        def compute_only():
            with ddp.no_sync():
                ddp.zero_grad(set_to_none=False)
                nn.functional.mse_loss(ddp(x), y).backward()

        for _ in range(2):  # DDP rebuilds its buckets in gradient-ready order after the first step
            step()
        log.clear()
        marks.clear()
        seconds = _median_step(step, steps)
        per_step = len(log.events) // steps
        first = [log.events[i * per_step][0] - marks[i] for i in range(steps)]
        last = [log.events[i * per_step + per_step - 1][0] - marks[i] for i in range(steps)]
        first_pct = 100 * statistics.median(f / end if end > 0 else 1.0 for f, end in zip(first, last))
        compute = _median_step(compute_only, steps)
        grads = sum(p.numel() for p in ddp.parameters())
        comm = time_collective(torch_all_reduce, grads, repeats=max(3, steps // 2))
        hidden = 100 * max(0.0, compute + comm - seconds) / comm if comm > 0 else 0.0
        runs.append(BucketRun(cap, per_step, max(b for _, b in log.events), first_pct, seconds, compute, comm, min(hidden, 100.0)))
    return runs


def bucket_sweep(caps_mb: Sequence[float] = (1, 2, 4, 25), world_size: int = 2, width: int = 512, depth: int = 8,
                 batch: int = 64, steps: int = 10, timeout: float = 300) -> BucketSweep:
    """Train an MLP with DDP at each ``bucket_cap_mb`` and measure buckets, overlap and step time."""
    runs = launch(_bucket_worker, world_size, args=(list(caps_mb), width, depth, batch, steps), timeout=timeout, echo=False)[0]
    grads = gradient_bytes(mlp(width, depth))
    notes = [
        f"{world_size} workers, an MLP of {depth} linear {width}x{width} layers: {format_bytes(grads)} of gradients per step.",
        "'1st all-reduce at %': when DDP launched its first bucket, as a share of the time from the start of backward "
        "to the launch of its last bucket. Small: communication starts while backward still runs.",
        "'comm. hidden %': (compute only + all-reduce alone - DDP step) / all-reduce alone.",
    ]
    return BucketSweep(runs, notes)


# ---------------------------------------------------------------- gradient accumulation with no_sync


@dataclass
class AccumulationRun:
    method: str = column("method")
    all_reduces_per_update: int = column("all-reduces per update")
    bytes_per_update: int = column("bytes all-reduced per update", format_bytes)
    seconds_per_update: float = column("time per update", format_seconds)
    same_gradients: bool = column("same gradients as one big batch")


class AccumulationDemo(Report):
    title = "Gradient accumulation over micro-batches: with and without no_sync()"


def _accumulation_worker(accumulate: Callable, micro_batches: int, width: int, depth: int, batch: int, repeats: int) -> list[AccumulationRun]:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ddp, log = _wrap(mlp(width, depth), None)
    batches = [_batch(width, batch, seed=1000 * rank + i) for i in range(micro_batches)]
    # reference: the gradient of the whole local batch at once, averaged over ranks
    reference = mlp(width, depth)
    reference.load_state_dict(ddp.module.state_dict())
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    nn.functional.mse_loss(reference(x), y).backward()
    expected = [p.grad.clone() for p in reference.parameters()]
    for g in expected:
        dist.all_reduce(g)
        g /= world

    runs = []
    for name, no_sync in (("all-reduce every micro-batch", False), ("no_sync() until the last micro-batch", True)):
        accumulate(ddp, batches, no_sync)  # warm-up
        log.clear()
        accumulate(ddp, batches, no_sync)
        same = all(torch.allclose(p.grad, e, rtol=1e-4, atol=1e-6) for p, e in zip(ddp.parameters(), expected))
        calls, sent = len(log.events), sum(b for _, b in log.events)
        seconds = _median_step(lambda: accumulate(ddp, batches, no_sync), repeats)
        runs.append(AccumulationRun(name, calls, sent, seconds, same))
    return runs


def accumulation_demo(accumulate: Callable, micro_batches: int = 4, world_size: int = 2, width: int = 512, depth: int = 8, batch: int = 16,
                      repeats: int = 5, timeout: float = 300) -> AccumulationDemo:
    """Run ``accumulate(ddp_model, micro_batches, no_sync)`` (one update's gradients over [(x, y), ...]) both ways.

    Counts DDP's all-reduces with a communication hook, times the update, and compares the gradients with those
    of the whole batch at once.
    """
    runs = launch(_accumulation_worker, world_size, args=(accumulate, micro_batches, width, depth, batch, repeats), timeout=timeout, echo=False)[0]
    return AccumulationDemo(runs, [f"{world_size} workers, {micro_batches} micro-batches of {batch} per update."])


# ---------------------------------------------------------------- scaling, measured and modelled


@dataclass
class ScalingPoint:
    workers: int = column("N")
    measured_compute: float | None = column("compute (measured)", format_seconds)
    measured_step: float | None = column("step (measured)", format_seconds)
    measured_speedup: float | None = column("speedup (measured)", ".2f")
    model_compute: float = column("compute (model)", format_seconds)
    model_comm: float = column("all-reduce (model)", format_seconds)
    model_step: float = column("step (model)", format_seconds)
    model_speedup: float = column("speedup (model)", ".2f")

    @property
    def ran_here(self) -> bool:
        return self.measured_step is not None


class Scaling(Report):
    """Strong scaling of data-parallel LeNet training: measured here, and the calibrated model up to many workers."""

    title = "Data-parallel scaling, fixed global batch: measured here, and the model"

    def plot(self, ax=None):
        measured = [r for r in self.rows if r.ran_here]
        ax = plots.line_chart({
            "measured": ([r.workers for r in measured], [r.measured_speedup for r in measured]),
            "model": ([r.workers for r in self.rows], [r.model_speedup for r in self.rows]),
            "ideal": ([r.workers for r in self.rows], [float(r.workers) for r in self.rows]),
        }, ax, styles={"model": "--", "ideal": ":"}, title="Data-parallel speedup over one worker", xlabel="workers N (log scale)",
            ylabel="speedup (log scale)", logx=True, logy=True)
        return ax


def _scaling_worker(global_batch: int, steps: int) -> tuple[float, float, int]:
    world, rank = dist.get_world_size(), dist.get_rank()
    torch.manual_seed(0)
    ddp = DistributedDataParallel(LeNet())
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(global_batch // world, 1, 28, 28, generator=g), torch.randint(0, 10, (global_batch // world,), generator=g)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()

    def compute_only():
        with ddp.no_sync():
            optimizer.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()

    for _ in range(2):
        step()
    return _median_step(step, steps), _median_step(compute_only, steps), torch.get_num_threads()


def scaling(world_sizes: Sequence[int] = (1, 2, 4), global_batch: int = 256, steps: int = 10, link: Link | None = None,
            model_workers: Sequence[int] = (8, 16, 32, 64), timeout: float = 300) -> Scaling:
    """Measure LeNet training steps at each N here, and model every N: compute / N plus a ring all-reduce.

    The model assumes one device per worker, each as fast as the measured single worker (its compute time,
    without communication, calibrates it), and the alpha-beta ``link``: compute shrinks as 1/N, the ring's
    latency-bound rounds grow with N. Measured runs use one thread per worker on this machine's cores.
    """
    grads = gradient_bytes(LeNet())
    measured = {}
    for n in world_sizes:
        measured[n] = launch(_scaling_worker, n, args=(global_batch, steps), threads=1, timeout=timeout, echo=False)[0]
    smallest = min(measured)
    base_compute = measured[smallest][1] * smallest  # one worker's compute for the whole global batch
    base_step = measured[1][0] if 1 in measured else None
    rows = []
    for n in sorted(set(world_sizes) | set(model_workers)):
        comm = all_reduce_time("ring", grads, n, link) if link else 0.0
        step, compute = measured[n][:2] if n in measured else (None, None)
        rows.append(ScalingPoint(n, compute, step, base_step / step if base_step and step else None,
                                 base_compute / n, comm, base_compute / n + comm, 0.0))
    model_one = base_compute + (all_reduce_time("ring", grads, 1, link) if link else 0.0)
    for r in rows:
        r.model_speedup = model_one / r.model_step
    notes = [f"LeNet, global batch {global_batch} split over N workers, {format_bytes(grads)} of gradients per step.",
             f"Measured: N processes with one thread each (one core per worker, as one GPU per worker) on this machine's "
             f"{available_cores()} cores; beyond {available_cores()} workers they share cores.",
             "Model: compute = the measured one-worker compute / N (one device per worker), all-reduce = ring alpha-beta "
             + (f"({link.source})." if link else "(no link given: zero)."),
             f"Rows without a measurement ({', '.join(str(r.workers) for r in rows if not r.ran_here)} workers) are predictions only."]
    return Scaling(rows, notes)
