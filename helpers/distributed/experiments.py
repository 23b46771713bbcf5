"""Distributed experiments a lecture cell runs in one call: each launches real gloo (or NCCL) workers and returns a report.

* ``collectives_demo``: broadcast, all_reduce, all_gather and reduce_scatter, each rank's tensor before and after;
* ``traffic_check``: bytes each rank really sent in a ring and a parameter-server all-reduce, beside the formula;
* ``calibrate_link``: point-to-point times between two workers, fitted to the alpha-beta model;
* ``all_reduce_sweep``: hand-written ring (and parameter server) against ``dist.all_reduce`` over message
  sizes and world sizes, with the calibrated model's prediction beside each measurement.

The launcher is ``helpers.core.workers.launch``; what runs inside the workers is in ``helpers.distributed.collectives``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from helpers.core import plots
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.workers import WorkerError, WorkerTimeout, available_cores, launch  # noqa: F401  (re-exported)
from helpers.distributed.collectives import ALL_REDUCES, count_traffic, ping_pong, time_collective
from helpers.distributed.comm_models import Link, all_reduce_time, bytes_sent_per_worker, comm_costs, fit_link  # noqa: F401  (re-exported)

KIB, MIB = 1024, 1024 * 1024
FLOAT_BYTES = 4


# ---------------------------------------------------------------- the four collectives


@dataclass
class CollectiveRow:
    operation: str = column("operation")
    rank: int = column("rank")
    before: str = column("before")
    after: str = column("after")


class CollectivesDemo(Report):
    title = "Collectives on a real process group: each rank's tensor before and after"


def _show(t: torch.Tensor) -> str:
    return "[" + ", ".join(f"{v:g}" for v in t.tolist()) + "]"


def _run_collectives() -> list[CollectiveRow]:
    rank, world = dist.get_rank(), dist.get_world_size()
    rows = []

    def record(name: str, before: torch.Tensor, after: torch.Tensor) -> None:
        rows.append(CollectiveRow(name, rank, _show(before), _show(after)))

    x = torch.full((2,), float(rank + 1))
    before = x.clone()
    dist.broadcast(x, src=0)
    record("broadcast from rank 0", before, x)
    x = torch.arange(2, dtype=torch.float32) + 10 * rank
    before = x.clone()
    dist.all_reduce(x)
    record("all_reduce (sum)", before, x)
    x = torch.tensor([float(rank)])
    gathered = [torch.empty(1) for _ in range(world)]
    dist.all_gather(gathered, x)
    record("all_gather", x, torch.cat(gathered))
    x = torch.arange(world, dtype=torch.float32) + 10 * rank
    out = torch.empty(1)
    dist.reduce_scatter(out, list(x.chunk(world)))
    record("reduce_scatter (sum)", x, out)
    return rows


def collectives_demo(world_size: int = 4, timeout: float = 60) -> CollectivesDemo:
    """Run the four collectives of data-parallel training on ``world_size`` workers and show every rank's data."""
    per_rank = launch(_run_collectives, world_size, timeout=timeout, echo=False)
    rows = sorted((r for rows in per_rank for r in rows), key=lambda r: (_OPERATION_ORDER.index(r.operation.split()[0]), r.rank))
    return CollectivesDemo(rows, [f"backend: gloo on {world_size} processes" if not torch.cuda.is_available() else f"{world_size} processes"])


_OPERATION_ORDER = ["broadcast", "all_reduce", "all_gather", "reduce_scatter"]


# ---------------------------------------------------------------- traffic counted vs formula


@dataclass
class TrafficRow:
    scheme: str = column("scheme")
    world_size: int = column("N")
    message_bytes: int = column("message", format_bytes)
    most_sent_by_a_rank: int = column("max sent by a rank", ",d")
    least_sent_by_a_rank: int = column("min sent by a rank", ",d")
    formula_per_worker: float = column("formula", ",.0f")
    peers_of_rank_0: str = column("rank 0 sends to")
    correct: bool = column("result == dist.all_reduce")


class TrafficCheck(Report):
    title = "Bytes each rank really sent in one all-reduce, beside the formula"


def _count(numel: int) -> dict:
    rank = dist.get_rank()
    data = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    expected = data.clone()
    dist.all_reduce(expected)
    out = {}
    for name in ("ring (send/recv)", "parameter server (send/recv)"):
        with count_traffic() as traffic:
            result = ALL_REDUCES[name](data.clone())
        out[name] = (traffic.bytes_sent, sorted(traffic.peers), torch.allclose(result, expected, rtol=1e-5, atol=1e-5))
    return out


def traffic_check(world_sizes: Sequence[int] = (2, 3, 4), numel: int = 1001, timeout: float = 60) -> TrafficCheck:
    """Count the bytes every rank sends in the hand-written ring and parameter-server all-reduces."""
    rows = []
    message = numel * FLOAT_BYTES
    for world in world_sizes:
        per_rank = launch(_count, world, args=(numel,), timeout=timeout, echo=False)
        for name, scheme in (("ring (send/recv)", "ring"), ("parameter server (send/recv)", "parameter server")):
            sent = [r[name][0] for r in per_rank]
            # rank 0 is the server, so N-1 ranks are the parameter server's workers
            formula = bytes_sent_per_worker(scheme, message, world if scheme == "ring" else max(world - 1, 1))
            rows.append(TrafficRow(name, world, message, max(sent), min(sent), formula, ", ".join(map(str, per_rank[0][name][1])) or "nobody",
                                   all(r[name][2] for r in per_rank)))
    return TrafficCheck(rows, ["Parameter server: rank 0 is the server (it sends the sum to all N-1 workers); the formula is a worker's share."])


# ---------------------------------------------------------------- calibrating the link


@dataclass
class LinkPoint:
    message_bytes: int = column("message", format_bytes)
    seconds: float = column("measured (one way)", format_seconds)
    model_seconds: float = column("model alpha + b*beta", format_seconds)


class LinkCalibration(Report):
    """One-way message times between two workers and the fitted alpha-beta line; ``.link`` holds the fit."""

    title = "Point-to-point time between two workers (fastest of repeats), and the fitted alpha-beta model"

    def __init__(self, rows, link: Link, notes=()):
        super().__init__(rows, notes)
        self.link = link

    def plot(self, ax=None):
        xs = [r.message_bytes for r in self.rows]
        return plots.measured_and_model({"one-way time": (xs, [r.seconds for r in self.rows])}, {"one-way time": (xs, [r.model_seconds for r in self.rows])},
                                        ax, title="Point-to-point time between two workers", xlabel="message size (log scale)",
                                        ylabel="one-way time (log scale)", logx=True, logy=True, xunit="bytes", yunit="seconds")


def calibrate_link(sizes_bytes: Sequence[int] = (4, 4 * KIB, 64 * KIB, MIB, 8 * MIB), repeats: int = 10, timeout: float = 120) -> LinkCalibration:
    """Measure ping-pong times between two gloo workers and fit alpha (latency) and beta (seconds per byte)."""
    sizes = [max(FLOAT_BYTES, int(b)) for b in sizes_bytes]
    seconds = launch(lambda: [ping_pong(b // FLOAT_BYTES, repeats) for b in sizes], 2, timeout=timeout, echo=False)[0]
    link = fit_link(sizes, seconds, source=f"fitted to {len(sizes)} ping-pong sizes between 2 local gloo workers")
    rows = [LinkPoint(b, s, link.message_time(b)) for b, s in zip(sizes, seconds)]
    notes = [f"alpha (latency) = {format_seconds(link.alpha)}, bandwidth 1/beta = {link.bandwidth / 1e9:.2f} GB/s"]
    return LinkCalibration(rows, link, notes)


# ---------------------------------------------------------------- all-reduce sweep


SCHEME_OF = {"ring (send/recv)": "ring", "parameter server (send/recv)": "parameter server", "dist.all_reduce": "ring"}


@dataclass
class AllReducePoint:
    implementation: str = column("implementation")
    world_size: int = column("N")
    message_bytes: int = column("message", format_bytes)
    seconds: float = column("measured", format_seconds)
    model_seconds: float | None = column("model", format_seconds)
    bus_gbs: float = column("bus GB/s", ".2f")


class AllReduceSweep(Report):
    """Measured all-reduce times by implementation, world size and message size, with the model beside them."""

    title = "All-reduce: measured time, and the alpha-beta model's prediction"

    def __init__(self, rows, link: Link | None, notes=()):
        super().__init__(rows, notes)
        self.link = link

    def _series(self, keep, x_of) -> tuple[dict, dict]:
        measured, model = {}, {}
        for impl in dict.fromkeys(r.implementation for r in self.rows):
            rows = [r for r in self.rows if r.implementation == impl and keep(r)]
            measured[impl] = ([x_of(r) for r in rows], [r.seconds for r in rows])
            if self.link and impl != "dist.all_reduce":
                model[impl] = ([x_of(r) for r in rows], [r.model_seconds for r in rows])
        return measured, model

    def plot(self, ax=None, world_size: int | None = None):
        """Time against message size for one world size (default: the largest), measured solid, model dashed."""
        world_size = world_size or max(r.world_size for r in self.rows)
        measured, model = self._series(lambda r: r.world_size == world_size, lambda r: r.message_bytes)
        return plots.measured_and_model(measured, model, ax, title=f"All-reduce time, N = {world_size} workers",
                                        xlabel="message size (log scale)", ylabel="time (log scale)", logx=True, logy=True, xunit="bytes", yunit="seconds")

    def plot_world_sizes(self, ax=None, message_bytes: int | None = None):
        """Time against N at one message size (default: the largest), measured solid, model dashed."""
        message_bytes = message_bytes or max(r.message_bytes for r in self.rows)
        measured, model = self._series(lambda r: r.message_bytes == message_bytes, lambda r: r.world_size)
        ax = plots.measured_and_model(measured, model, ax, title=f"All-reduce time against N, {format_bytes(message_bytes)}",
                                      xlabel="workers N", ylabel="time", yunit="seconds")
        ax.set_xticks(sorted({r.world_size for r in self.rows}))
        return ax


def _sweep(names: Sequence[str], numels: Sequence[int], repeats: int) -> dict:
    return {(name, n): time_collective(ALL_REDUCES[name], n, repeats) for name in names for n in numels}


def model_for(implementation: str, message_bytes: float, world_size: int, link: Link) -> float:
    """The alpha-beta prediction for one of ``ALL_REDUCES`` (the parameter server's N-1 workers talk to rank 0)."""
    scheme = SCHEME_OF[implementation]
    workers = world_size - 1 if scheme == "parameter server" else world_size
    return all_reduce_time(scheme, message_bytes, max(workers, 1), link)


def all_reduce_sweep(
    world_sizes: Sequence[int] = (2, 3, 4),
    sizes_bytes: Sequence[int] = (KIB, 64 * KIB, MIB, 16 * MIB),
    implementations: Sequence[str] = ("ring (send/recv)", "dist.all_reduce"),
    repeats: int = 5,
    link: Link | None = None,
    timeout: float = 300,
) -> AllReduceSweep:
    """Time each all-reduce implementation for every world size and message size (one launch per world size)."""
    unknown = set(implementations) - set(ALL_REDUCES)
    if unknown:
        raise ValueError(f"unknown implementation(s) {sorted(unknown)}; choose from {list(ALL_REDUCES)}")
    numels = [max(1, int(b) // FLOAT_BYTES) for b in sizes_bytes]
    rows = []
    for world in world_sizes:
        times = launch(_sweep, world, args=(list(implementations), numels, repeats), timeout=timeout, echo=False)[0]
        for name in implementations:
            for n in numels:
                message, seconds = n * FLOAT_BYTES, times[(name, n)]
                bus = 2 * (world - 1) / world * message / seconds / 1e9 if world > 1 else 0.0
                rows.append(AllReducePoint(name, world, message, seconds, model_for(name, message, world, link) if link else None, bus))
    notes = ["bus GB/s = 2(N-1)/N x message / time: the per-link rate a ring needs; compare it across N."]
    cores = available_cores()
    if max(world_sizes) > cores:
        notes.append(f"Only {cores} CPU cores here: at N > {cores} the workers take turns on the cores, which the model does not know about.")
    if link:
        notes.append(f"Model: {link.source}.")
    return AllReduceSweep(rows, link, notes)
