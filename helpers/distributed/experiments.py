"""Distributed measurements a lecture cell runs in one call, on the cell's own code: each launches real gloo (or NCCL) workers.

* ``traffic_check``: bytes each rank really sent in the all-reduces a cell wrote, beside the formula;
* ``calibrate_link``: point-to-point times between two workers, fitted to the alpha-beta model;
* ``all_reduce_sweep``: a cell's all-reduces against ``dist.all_reduce`` over message sizes and world sizes,
  with the calibrated model's prediction and its error (fastest measured / model) beside each measurement.

Every launch is timed against other programs' use of the CPU (``helpers.core.load``), so a table measured on a
busy machine says so.

An all-reduce is given as ``{scheme: fn}``: ``fn(tensor)`` sums ``tensor`` over the ranks in place and returns
it; ``scheme`` names the cost formula of ``helpers.distributed.comm_models`` it follows ("ring", "tree",
"butterfly", "parameter server"), or anything else for no formula. The launcher is ``helpers.core.workers.launch``.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist

from helpers.core import load, plots
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.workers import WorkerError, WorkerTimeout, available_cores, launch  # noqa: F401  (re-exported)
from helpers.distributed.collectives import count_traffic, ping_pong, torch_all_reduce
from helpers.distributed.comm_models import (  # noqa: F401  (re-exported)
    SCHEMES,
    Link,
    all_reduce_time,
    bytes_sent_per_worker,
    comm_costs,
    fit_link,
    model_error,
    server_bytes_sent,
    within,
)

KIB, MIB = 1024, 1024 * 1024
FLOAT_BYTES = 4


def launch_beside_load(*args: Any, **kwargs: Any) -> tuple[list[Any], float]:
    """``launch``, and how many cores other programs kept busy meanwhile (recorded: the next table built says so)."""
    with load.OtherLoad() as other:
        results = launch(*args, **kwargs)
    load.record(other.cores)
    return results, other.cores


def timed_launch(*args: Any, **kwargs: Any) -> list[Any]:
    """``launch``, noting how many cores other programs kept busy meanwhile (the next table built says so)."""
    return launch_beside_load(*args, **kwargs)[0]


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
    server_sent: int | None = column("sent by the server (rank 0)", ",d", optional=True)
    server_formula: float | None = column("server's formula", ",.0f", optional=True)
    correct: bool = column("result == dist.all_reduce")

    @property
    def server_holds(self) -> bool | None:
        """For a parameter server: whether rank 0, the server, sent what its formula says; None for other schemes."""
        return None if self.server_formula is None else self.server_sent == self.server_formula


class TrafficCheck(Report):
    title = "Bytes each rank really sent in one all-reduce, beside the formula"


AllReduces = Mapping[str, Callable[[torch.Tensor], torch.Tensor]]


def _workers_of(scheme: str, world: int) -> int:
    """Workers in a scheme's formula: a parameter server's N-1 workers talk to rank 0, the server."""
    return max(world - 1, 1) if scheme == "parameter server" else world


def _count(all_reduces: AllReduces, numel: int) -> dict:
    rank = dist.get_rank()
    data = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    expected = data.clone()
    dist.all_reduce(expected)
    out = {}
    for name, fn in all_reduces.items():
        with count_traffic() as traffic:
            result = fn(data.clone())
        out[name] = (traffic.bytes_sent, sorted(traffic.peers), torch.allclose(result, expected, rtol=1e-5, atol=1e-5))
    return out


def traffic_check(all_reduces: AllReduces, world_sizes: Sequence[int] = (2, 3, 4), numel: int = 1001, timeout: float = 60) -> TrafficCheck:
    """Run each ``{scheme: fn}`` all-reduce on real workers and count the bytes every rank sends, beside the scheme's formula."""
    rows = []
    message = numel * FLOAT_BYTES
    for world in world_sizes:
        per_rank = launch(_count, world, args=(dict(all_reduces), numel), timeout=timeout, echo=False)
        for name in all_reduces:
            sent = [r[name][0] for r in per_rank]
            formula = bytes_sent_per_worker(name, message, _workers_of(name, world)) if name in SCHEMES else float("nan")
            server = name == "parameter server"
            rows.append(TrafficRow(name, world, message, max(sent), min(sent), formula, ", ".join(map(str, per_rank[0][name][1])) or "nobody",
                                   server_sent=sent[0] if server else None,
                                   server_formula=server_bytes_sent(message, _workers_of(name, world)) if server else None,
                                   correct=all(r[name][2] for r in per_rank)))
    notes = ["formula: the bytes one worker sends in the scheme's cost model (helpers.distributed.comm_models)."]
    if "parameter server" in all_reduces:
        notes.append("Parameter server: rank 0 is the server and also a worker, so N ranks make N-1 workers beside it. formula: a worker's "
                     "share, M; server's formula: (N-1) x M, the sum sent to each of the N-1 others (it receives as much).")
    return TrafficCheck(rows, notes)


# ---------------------------------------------------------------- calibrating the link


@dataclass
class LinkPoint:
    message_bytes: int = column("message", format_bytes)
    seconds: float = column("measured (one way)", format_seconds)
    model_seconds: float = column("model alpha + b*beta", format_seconds)
    error: float = column("measured / model", ".2f")


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
    seconds = timed_launch(lambda: [ping_pong(b // FLOAT_BYTES, repeats) for b in sizes], 2, timeout=timeout, echo=False)[0]
    link = fit_link(sizes, seconds, source=f"fitted to {len(sizes)} ping-pong sizes between 2 local gloo workers")
    rows = [LinkPoint(b, s, link.message_time(b), model_error(s, link.message_time(b))) for b, s in zip(sizes, seconds)]
    notes = [f"alpha (latency) = {format_seconds(link.alpha)}, bandwidth 1/beta = {link.bandwidth / 1e9:.2f} GB/s",
             "measured / model: the fit's error at each size (1.00: exact)."]
    return LinkCalibration(rows, link, notes)


# ---------------------------------------------------------------- all-reduce sweep


@dataclass
class AllReducePoint:
    implementation: str = column("implementation")
    world_size: int = column("N")
    message_bytes: int = column("message", format_bytes)
    fastest: float = column("fastest", format_seconds)
    seconds: float = column("median", format_seconds)
    slowest: float = column("slowest", format_seconds)
    model_seconds: float | None = column("model", format_seconds)
    error: float | None = column("fastest / model", ".1f")
    bus_gbs: float = column("bus GB/s", ".2f")


class AllReduceSweep(Report):
    """Measured all-reduce times by implementation, world size and message size, with the model and its error beside them."""

    title = "All-reduce: measured time (fastest, median, slowest round), the alpha-beta model, and its error"

    def __init__(self, rows, link: Link | None, notes=()):
        super().__init__(rows, notes)
        self.link = link

    floors: dict[int, float] = {}  # {N: fastest round of one empty dist.barrier(), timed like every row}

    def model_errors(self, implementation: str) -> dict[int, dict[int, float]]:
        """``{N: {message bytes: fastest / model}}`` for one implementation: the model's error at every measured point."""
        errors: dict[int, dict[int, float]] = {}
        for r in self.rows:
            if r.implementation == implementation and r.error is not None:
                errors.setdefault(r.world_size, {})[r.message_bytes] = r.error
        if not errors:
            raise ValueError(f"no modelled rows for {implementation!r}: give all_reduce_sweep a link and a scheme the model knows")
        return errors

    def _series(self, keep, x_of) -> tuple[dict, dict]:
        measured, model = {}, {}
        for impl in dict.fromkeys(r.implementation for r in self.rows):
            rows = [r for r in self.rows if r.implementation == impl and keep(r)]
            measured[impl] = ([x_of(r) for r in rows], [r.fastest for r in rows])
            if self.link and all(r.model_seconds is not None for r in rows):
                model[impl] = ([x_of(r) for r in rows], [r.model_seconds for r in rows])
        return measured, model

    def plot(self, ax=None, world_size: int | None = None):
        """Time against message size for one world size (default: the largest), fastest measured round solid, model dashed."""
        world_size = world_size or max(r.world_size for r in self.rows)
        measured, model = self._series(lambda r: r.world_size == world_size, lambda r: r.message_bytes)
        return plots.measured_and_model(measured, model, ax, title=f"All-reduce time, N = {world_size} workers",
                                        xlabel="message size (log scale)", ylabel="time (log scale)", logx=True, logy=True, xunit="bytes", yunit="seconds")

    def plot_world_sizes(self, ax=None, message_bytes: int | None = None):
        """Time against N at one message size (default: the largest), fastest measured round solid, model dashed."""
        message_bytes = message_bytes or max(r.message_bytes for r in self.rows)
        measured, model = self._series(lambda r: r.message_bytes == message_bytes, lambda r: r.world_size)
        ax = plots.measured_and_model(measured, model, ax, title=f"All-reduce time against N, {format_bytes(message_bytes)}",
                                      xlabel="workers N", ylabel="time", yunit="seconds")
        ax.set_xticks(sorted({r.world_size for r in self.rows}))
        return ax


LIBRARY = "dist.all_reduce"


def collective_rounds(fn: Callable[[torch.Tensor], torch.Tensor], numel: int, repeats: int) -> list[float]:
    """Seconds of ``fn(tensor)`` in each of ``repeats`` rounds after a warm-up, each the slowest rank's, all ranks starting at a barrier."""
    tensor = torch.ones(numel)
    fn(tensor)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn(tensor)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return times


def _barrier(tensor: torch.Tensor) -> torch.Tensor:
    """A collective that moves no data: timed like the all-reduces, it measures what the timing itself costs."""
    dist.barrier()
    return tensor


FLOOR = "timing floor"


def _sweep(all_reduces: AllReduces, numels: Sequence[int], repeats: int) -> dict:
    times = {(name, n): collective_rounds(fn, n, repeats) for name, fn in all_reduces.items() for n in numels}
    times[(FLOOR, 1)] = collective_rounds(_barrier, 1, repeats)
    return times


def all_reduce_sweep(
    all_reduces: AllReduces,
    world_sizes: Sequence[int] = (2, 3, 4),
    sizes_bytes: Sequence[int] = (KIB, 64 * KIB, MIB, 16 * MIB),
    repeats: int = 5,
    link: Link | None = None,
    timeout: float = 300,
) -> AllReduceSweep:
    """Time each ``{scheme: fn}`` all-reduce, and ``dist.all_reduce`` beside them, for every world size and message size."""
    if not all_reduces or not all(callable(fn) for fn in all_reduces.values()):
        raise ValueError("pass the all-reduces to time as {scheme: function}, e.g. {'butterfly': butterfly_all_reduce}")
    timed = {**all_reduces, LIBRARY: torch_all_reduce}
    numels = [max(1, int(b) // FLOAT_BYTES) for b in sizes_bytes]
    rows, floors = [], {}
    for world in world_sizes:
        times = timed_launch(_sweep, world, args=(timed, numels, repeats), timeout=timeout, echo=False)[0]
        floors[world] = min(times[(FLOOR, 1)])
        for name in timed:
            for n in numels:
                message, rounds = n * FLOAT_BYTES, times[(name, n)]
                median = statistics.median(rounds)
                bus = 2 * (world - 1) / world * message / median / 1e9 if world > 1 else 0.0
                model = all_reduce_time(name, message, _workers_of(name, world), link) if link and name in SCHEMES else None
                error = model_error(min(rounds), model) if model else None
                rows.append(AllReducePoint(name, world, message, min(rounds), median, max(rounds), model, error, bus))
    notes = [f"{repeats} timed rounds per row after a warm-up, each the slowest rank's time; the spread runs from the fastest to the slowest.",
             "fastest / model: the model's error. The model describes an undisturbed link, so it is compared with the fastest round.",
             "bus GB/s = 2(N-1)/N x message / median time: the per-link rate a ring needs; compare it across N.",
             "Timing floor, the fastest round of a dist.barrier() (no data) timed the same way: "
             + ", ".join(f"{format_seconds(f)} at N = {n}" for n, f in floors.items())
             + ". Every round pays it (the ranks leave the starting barrier at different moments, and each must be woken); the link model has no such term."]
    cores = available_cores()
    if max(world_sizes) > cores:
        notes.append(f"Only {cores} CPU cores here: at N > {cores} the workers take turns on the cores, which the model does not know about.")
    if link:
        notes.append(f"Model: {link.source}.")
    sweep = AllReduceSweep(rows, link, notes)
    sweep.floors = floors
    return sweep
