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
from helpers.core.workers import available_cores
from helpers.distributed.comm_models import Link, all_reduce_time, model_error
from helpers.distributed.experiments import launch_beside_load, timed_launch


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


GROUPS = 3  # rounds are dealt into this many groups; a verdict holds only if it holds in every group


def group_fastest(times: Sequence[float], groups: int = GROUPS) -> list[float]:
    """The fastest of every ``groups``-th round, for each group: other programs only ever add time, so the fastest
    round of a group is its best view of the undisturbed machine, and the groups' spread is the noise."""
    return [min(times[g::groups]) for g in range(min(groups, len(times)))]


@dataclass
class BucketRun:
    bucket_cap_mb: float = column("bucket_cap_mb", "g")
    buckets: int = column("buckets per step")
    largest_bucket: int = column("largest bucket", format_bytes)
    first_launch_pct: float = column("1st all-reduce at % of backward", ".0f")
    step_seconds: float = column("DDP step", format_seconds)
    one_bucket_seconds: float = column("one bucket (no overlap)", format_seconds)
    compute_seconds: float = column("compute only", format_seconds)
    all_reduce_seconds: float = column("all-reduce alone", format_seconds)
    hidden_pct: float | None = column("comm. hidden %", ".0f")
    hidden_spread: str = column("hidden %, range over groups")
    hidden_low: float
    hidden_high: float

    @property
    def is_baseline(self) -> bool:
        """One bucket: the same setup as the one-bucket baseline, so its difference from it is noise, not overlap."""
        return self.buckets == 1


class BucketSweep(Report):
    """Per bucket cap: how many all-reduces DDP starts, how early the first starts, the step time, and how much of a
    one-bucket step's communication time (its all-reduce starts when backward ends) it hid behind backward;
    ``noise_pct``: how far two identical one-bucket runs fell apart, on the same scale; ``other_cores``: how many
    cores other programs kept busy meanwhile."""

    title = "DDP gradient buckets: count, overlap with backward, step time"

    def __init__(self, rows, notes=(), noise_pct: float = 0.0, other_cores: float = 0.0):
        super().__init__(rows, notes)
        self.noise_pct, self.other_cores = noise_pct, other_cores

    def plot(self, ax=None):
        caps = [f"{r.bucket_cap_mb:g} MB" for r in self.rows]
        ax = plots.grouped_bars(caps, {"DDP step": [r.step_seconds * 1e3 for r in self.rows],
                                       "one bucket (no overlap)": [r.one_bucket_seconds * 1e3 for r in self.rows],
                                       "compute only": [r.compute_seconds * 1e3 for r in self.rows]},
                                ax, title="DDP step time by bucket cap (fastest rounds)", xlabel="bucket_cap_mb", ylabel="milliseconds per step")
        return ax


def _step_times(step, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


ONE_BUCKET, AGAIN, NO_SYNC = "one bucket", "one bucket, again", "no_sync"  # the baseline, an identical run of it (the noise), compute only


def _bucket_worker(caps: Sequence[float], width: int, depth: int, batch: int, rounds: int) -> tuple[list[BucketRun], float]:
    rank = dist.get_rank()
    x, y = _batch(width, batch, seed=rank)
    grads = gradient_bytes(mlp(width, depth))
    wrapped = {}
    for cap in [*caps, ONE_BUCKET, AGAIN, NO_SYNC]:  # a model of its own for each way
        torch.manual_seed(0)
        wrapped[cap] = _wrap(mlp(width, depth), cap if cap in caps else 2 * grads / 2**20 + 1)  # above the gradient: one bucket
    marks: dict = {cap: [] for cap in wrapped}
    flat = torch.zeros(grads // 4)

    def step(cap):
        ddp = wrapped[cap][0]
        ddp.zero_grad(set_to_none=False)
        loss = nn.functional.mse_loss(ddp(x), y)
        marks[cap].append(time.perf_counter())
        loss.backward()

    def compute_only():
        ddp = wrapped[NO_SYNC][0]
        with ddp.no_sync():
            ddp.zero_grad(set_to_none=False)
            nn.functional.mse_loss(ddp(x), y).backward()

    ways = {**{cap: (lambda cap=cap: step(cap)) for cap in [*caps, ONE_BUCKET, AGAIN]}, "compute": compute_only, "all-reduce": lambda: dist.all_reduce(flat)}
    for way in ways.values():
        way()
        way()  # DDP rebuilds its buckets in gradient-ready order after the first step
    for cap, (_, log) in wrapped.items():
        log.clear()
        marks[cap].clear()
    times: dict = {name: [] for name in ways}
    names = list(ways)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # the ways take turns, each round starting one later
            times[name] += _step_times(ways[name], 1)
    comm, base = min(times["all-reduce"]), group_fastest(times[ONE_BUCKET])
    exposed = max(min(times[ONE_BUCKET]) - min(times["compute"]), comm)  # what communication adds to a step that cannot overlap it
    noise = max(abs(100 * (b - t) / exposed) for b, t in zip(base, group_fastest(times[AGAIN])))
    runs = []
    for cap in caps:
        log = wrapped[cap][1]
        per_step = len(log.events) // rounds
        first = [log.events[i * per_step][0] - marks[cap][i] for i in range(rounds)]
        last = [log.events[i * per_step + per_step - 1][0] - marks[cap][i] for i in range(rounds)]
        first_pct = 100 * statistics.median(f / end if end > 0 else 1.0 for f, end in zip(first, last))
        hidden = [100 * (b - t) / exposed for b, t in zip(base, group_fastest(times[cap]))]  # paired: one-bucket steps of the same rounds
        low, high = min(hidden), max(hidden)
        runs.append(BucketRun(cap, per_step, max(b for _, b in log.events), first_pct, min(times[cap]), min(times[ONE_BUCKET]),
                              min(times["compute"]), comm, statistics.median(hidden), f"{round(low)} to {round(high)}", low, high))
    for run in runs:
        if run.is_baseline:  # the baseline's own setup: nothing can hide, so how far it fell from the baseline is noise too
            noise = max(noise, abs(run.hidden_low), abs(run.hidden_high))
            run.hidden_pct, run.hidden_spread = None, f"one bucket: noise, {round(run.hidden_low)} to {round(run.hidden_high)}"
    return runs, noise


def bucket_sweep(caps_mb: Sequence[float] = (1, 2, 4, 25), world_size: int = 2, width: int = 512, depth: int = 8,
                 batch: int = 64, steps: int = 10, timeout: float = 300) -> BucketSweep:
    """Train an MLP with DDP at each ``bucket_cap_mb`` and measure buckets, overlap and step time over ``steps`` rounds.

    In every round each cap's step, a step with one bucket (its all-reduce can only start when backward ends), the
    same again (the noise: two identical runs), a step without communication and the gradient's all-reduce alone
    take turns; the hidden share pairs each cap's steps with the one-bucket steps of the same rounds.
    """
    results, other = launch_beside_load(_bucket_worker, world_size, args=(list(caps_mb), width, depth, batch, steps), timeout=timeout, echo=False)
    runs, noise = results[0]
    grads = gradient_bytes(mlp(width, depth))
    notes = [
        f"{world_size} workers, an MLP of {depth} linear {width}x{width} layers, batch {batch}: {format_bytes(grads)} of gradients per step; "
        f"times are rank 0's fastest of {steps} rounds.",
        "'1st all-reduce at %': when DDP launched its first bucket, as a share of the time from the start of backward "
        "to the launch of its last bucket. Small: communication starts while backward still runs.",
        "'comm. hidden %': how much of the communication time of a one-bucket step (its step - compute only, at least the all-reduce "
        "alone) this cap saved: one-bucket step - this step, over it. One bucket is DDP with nothing to overlap: its all-reduce "
        f"starts when backward ends. From the fastest round of each of {GROUPS} groups of rounds (every third round): the median "
        "and the range over the groups.",
        f"Noise: {noise:.0f}%, on the same scale: the most that a second, identical one-bucket DDP, or a cap that also made one bucket "
        "(the baseline's setup), fell from the one-bucket step in any group.",
    ]
    return BucketSweep(runs, notes, noise, other)


# ---------------------------------------------------------------- gradient accumulation with no_sync


@dataclass
class AccumulationRun:
    method: str = column("method")
    all_reduces_per_update: int = column("all-reduces per update")
    bytes_per_update: int = column("bytes all-reduced per update", format_bytes)
    seconds_per_update: float = column("time per update, fastest", format_seconds)
    slowest_update: float = column("slowest", format_seconds)
    same_gradients: bool = column("same gradients as one big batch")
    group_fastest: list[float] | None = None


class AccumulationDemo(Report):
    title = "Gradient accumulation over micro-batches: with and without no_sync()"

    def verdict(self) -> str:
        """no_sync() against every micro-batch: faster only where it won in every group of rounds by more than two identical
        groups of the same way ever differed (the noise); else a tie."""
        every, no_sync = self.rows
        wins = [e - n for e, n in zip(every.group_fastest, no_sync.group_fastest)]
        noise = max(max(r.group_fastest) - min(r.group_fastest) for r in self.rows)
        if min(wins) > noise:
            return (f"no_sync() was faster in every group of rounds, by {format_seconds(min(wins))} to {format_seconds(max(wins))} per update "
                    f"(noise: {format_seconds(noise)}), {every.seconds_per_update / no_sync.seconds_per_update:.1f}x fastest against fastest")
        if max(wins) < -noise:
            return f"no_sync() was slower in every group of rounds, by more than the noise ({format_seconds(noise)})"
        return (f"a tie: the gap per update ranged {format_seconds(min(wins))} to {format_seconds(max(wins))} over the groups, "
                f"against a noise of {format_seconds(noise)}")


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

    ways = {"all-reduce every micro-batch": False, "no_sync() until the last micro-batch": True}
    counted = {}
    for name, no_sync in ways.items():
        accumulate(ddp, batches, no_sync)  # warm-up (and DDP rebuilds its buckets after its first step)
        log.clear()
        accumulate(ddp, batches, no_sync)
        same = all(torch.allclose(p.grad, e, rtol=1e-4, atol=1e-6) for p, e in zip(ddp.parameters(), expected))
        counted[name] = (len(log.events), sum(b for _, b in log.events), same)
    times: dict = {name: [] for name in ways}
    for _ in range(repeats * GROUPS):  # the two ways take turns, every round
        for name, no_sync in ways.items():
            times[name] += _step_times(lambda no_sync=no_sync: accumulate(ddp, batches, no_sync), 1)
    return [AccumulationRun(name, *counted[name][:2], min(times[name]), max(times[name]), counted[name][2], group_fastest(times[name]))
            for name in ways]


def accumulation_demo(accumulate: Callable, micro_batches: int = 4, world_size: int = 2, width: int = 512, depth: int = 8, batch: int = 16,
                      repeats: int = 5, timeout: float = 300) -> AccumulationDemo:
    """Run ``accumulate(ddp_model, micro_batches, no_sync)`` (one update's gradients over [(x, y), ...]) both ways.

    Counts DDP's all-reduces with a communication hook, times the update, and compares the gradients with those
    of the whole batch at once.
    """
    runs = timed_launch(_accumulation_worker, world_size, args=(accumulate, micro_batches, width, depth, batch, repeats), timeout=timeout, echo=False)[0]
    first_cap = dist._DEFAULT_FIRST_BUCKET_BYTES
    return AccumulationDemo(runs, [f"{world_size} workers, {micro_batches} micro-batches of {batch} per update; DDP with bucket_cap_mb left unset: "
                                   f"buckets of 25 MB, but the first capped at {format_bytes(first_cap)} (dist._DEFAULT_FIRST_BUCKET_BYTES), "
                                   f"which DDP applies only when bucket_cap_mb is not given: so {runs[1].all_reduces_per_update} all-reduces "
                                   f"per backward here, where an explicit bucket_cap_mb=25 puts a gradient under 25 MB in one bucket.",
                                   "all-reduces: DDP's calls counted by a communication hook in one update, after DDP rebuilt its buckets.",
                                   f"time: rank 0's fastest and slowest of {repeats * GROUPS} updates per way, the two ways taking turns; "
                                   f"verdict() compares the fastest of each of {GROUPS} groups of them."])


# ---------------------------------------------------------------- scaling, measured and modelled


@dataclass
class ScalingPoint:
    workers: int = column("N")
    measured_compute: float | None = column("compute only (fastest)", format_seconds)
    measured_step: float | None = column("step (measured)", format_seconds)
    step_spread: str = column("step, fastest per group")
    measured_speedup: float | None = column("speedup (measured)", ".2f")
    model_compute: float = column("compute (model)", format_seconds)
    model_comm: float = column("all-reduce (model)", format_seconds)
    model_step: float = column("step (model)", format_seconds)
    model_speedup: float = column("speedup (model)", ".2f")
    error: float | None = column("measured / model", ".2f")

    @property
    def ran_here(self) -> bool:
        return self.measured_step is not None


class Scaling(Report):
    """Strong scaling of data-parallel LeNet training: measured here, the model beside each measurement and its error;
    ``extrapolate`` adds the model's rows beyond what ran (for a model that fits)."""

    title = "Data-parallel scaling, fixed global batch: measured here, and the model"

    def __init__(self, rows, notes=(), *, base_compute: float, gradient_bytes: int, link: Link | None, other_cores: float = 0.0):
        super().__init__(rows, notes)
        self.base_compute, self.gradient_bytes, self.link, self.other_cores = base_compute, gradient_bytes, link, other_cores

    def model_point(self, workers: int) -> ScalingPoint:
        """The model alone at ``workers``: the one-worker compute / N, plus a ring all-reduce on the link."""
        return _model_point(workers, self.base_compute, self.gradient_bytes, self.link)

    def extrapolate(self, workers: Sequence[int]) -> Scaling:
        """These rows and the model's predictions at ``workers`` (not measured): only for a model that fits the measured rows."""
        extra = [self.model_point(n) for n in workers if n not in {r.workers for r in self.rows}]
        notes = [*self.notes, f"Rows without a measurement ({', '.join(str(r.workers) for r in extra)} workers) are the model's predictions only."]
        return Scaling(sorted([*self.rows, *extra], key=lambda r: r.workers), notes, base_compute=self.base_compute,
                       gradient_bytes=self.gradient_bytes, link=self.link, other_cores=self.other_cores)

    def plot(self, ax=None):
        measured = [r for r in self.rows if r.ran_here]
        ax = plots.line_chart({
            "measured": ([r.workers for r in measured], [r.measured_speedup for r in measured]),
            "model": ([r.workers for r in self.rows], [r.model_speedup for r in self.rows]),
            "ideal": ([r.workers for r in self.rows], [float(r.workers) for r in self.rows]),
        }, ax, styles={"model": "--", "ideal": ":"}, title="Data-parallel speedup over one worker", xlabel="workers N (log scale)",
            ylabel="speedup (log scale)", logx=True, logy=True)
        return ax


def _model_point(workers: int, base_compute: float, grads: int, link: Link | None) -> ScalingPoint:
    comm = all_reduce_time("ring", grads, workers, link) if link else 0.0
    step = base_compute / workers + comm
    return ScalingPoint(workers, None, None, "", None, base_compute / workers, comm, step, base_compute / step, None)


def _scaling_worker(global_batch: int, steps: int) -> tuple[list[float], float]:
    """This worker's wall-clock seconds of every DDP step, and of the fastest step without communication (taking turns with them)."""
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
    steps_taken, computed = [], []
    for _ in range(steps):  # a step and a step without communication take turns, timed alike: other programs only add time to either
        steps_taken += _step_times(step, 1)
        computed += _step_times(compute_only, 1)
    return steps_taken, min(computed)


def scaling(world_sizes: Sequence[int] = (1, 2, 4), global_batch: int = 256, steps: int = 10, link: Link | None = None,
            model_workers: Sequence[int] = (), timeout: float = 300) -> Scaling:
    """Measure LeNet training steps at each N here, with the model beside each (and at ``model_workers``, unmeasured).

    The model assumes one device per worker, each as fast as the measured single worker (its fastest step without
    communication, wall-clock like the steps it is compared with), and the alpha-beta ``link``: compute
    shrinks as 1/N, the ring's latency-bound rounds grow with N. Measured runs use one thread per worker on this
    machine's cores; a measured step is wall-clock time, the fastest of ``steps``.
    """
    grads = gradient_bytes(LeNet())
    measured, busy = {}, 0.0
    for n in sorted(world_sizes):
        measured[n], other = launch_beside_load(_scaling_worker, n, args=(global_batch, steps), threads=1, timeout=timeout, echo=False)
        measured[n], busy = measured[n][0], max(busy, other)
    smallest = min(measured)
    base_compute = measured[smallest][1] * smallest  # one worker's compute for the whole global batch: its fastest step without communication
    base_step = min(measured[1][0]) if 1 in measured else None
    rows = []
    for n, (steps_taken, compute) in measured.items():
        point, step = _model_point(n, base_compute, grads, link), min(steps_taken)
        point.measured_compute, point.measured_step = compute, step
        point.step_spread = ", ".join(map(format_seconds, group_fastest(steps_taken)))
        point.measured_speedup, point.error = (base_step / step if base_step else None), model_error(step, point.model_step)
        rows.append(point)
    notes = [f"LeNet, global batch {global_batch} split over N workers, {format_bytes(grads)} of gradients per step; the fastest of "
             f"{steps} steps (other programs only add time; the model describes an undisturbed machine), and of each of {GROUPS} groups of them beside.",
             f"Measured: N processes with one thread each (one core per worker, as one GPU per worker) on this machine's "
             f"{available_cores()} cores; beyond {available_cores()} workers they share cores.",
             "compute only: the fastest step under no_sync() (no all-reduce), taking turns with the DDP steps.",
             "Model: compute = the one-worker compute-only time / N (one device per worker), all-reduce = ring alpha-beta "
             + (f"({link.source})." if link else "(no link given: zero)."),
             "measured / model: the model's error at each measured N (1.00: exact)."]
    report = Scaling(rows, notes, base_compute=base_compute, gradient_bytes=grads, link=link, other_cores=busy)
    return report.extrapolate(model_workers) if model_workers else report
