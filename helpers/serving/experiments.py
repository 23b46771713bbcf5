"""Experiments that start their own services: process workers against threads (lecture 6), batching and Ray Serve (lecture 7)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Sequence

import numpy as np

from helpers.core.procs import ServedProcess
from helpers.core.report import Report, column, format_seconds
from helpers.serving.load import LoadLevel, each_run, load_test, taking_turns
from helpers.serving.server import start_service


def in_turns(services: dict, payloads: Sequence[dict], concurrency: int, max_requests: int, max_seconds: float,
             repeats: int) -> dict:
    """Load every running service ``repeats`` times, the services taking turns (each round starts one later): {name: runs}.

    Other work on the machine comes and goes; taking turns makes it hit every service alike, and the spread of
    each service's runs shows how much it moved the figures."""
    runs: dict = {name: [] for name in services}
    for round_ in range(repeats):
        for name in taking_turns(services, round_):
            runs[name].append(load_test(services[name].url + "/predict", payloads, concurrency, max_requests, max_seconds).rows[0])
    return runs


def percentiles(runs: list[LoadLevel]) -> tuple[float, float]:
    """p50 and p99 over every request of ``runs``."""
    p50, p99 = np.percentile([t for r in runs for t in r.latencies or []] or [float("nan")], [50, 99])
    return float(p50), float(p99)


class HasRuns:
    """A row whose ``runs`` holds requests/s of each repeat: its slowest and fastest."""

    runs: list[float]

    @property
    def slowest(self) -> float:
        return min(self.runs)

    @property
    def fastest(self) -> float:
        return max(self.runs)


@dataclass
class ServerSetup(HasRuns):
    setup: str = column("server")
    workers: int = column("processes")
    threads: int = column("model threads each")
    throughput: float = column("requests/s", ".1f")
    runs: list[float] = column("requests/s, each run", each_run)
    p50: float = column("p50", format_seconds)
    p99: float = column("p99", format_seconds)
    errors: int = column("errors")
    answered: int = 0  # requests answered without error, warm-up included (what the server's own counters saw)


class ServerComparison(Report):
    """The same bounded load on differently configured servers."""

    title = "Worker processes against threads, same load"

    def plot(self, ax=None):
        from helpers.core.plots import horizontal_bars

        return horizontal_bars([r.setup for r in self.rows], [r.throughput for r in self.rows], ax,
                               title=self.title, xlabel="requests/s (median run)")


def compare_servers(payloads: Sequence[dict], setups: Sequence[tuple[int, int]] = ((1, 1), (1, 2), (2, 1)),
                    concurrency: int = 16, max_requests: int = 400, max_seconds: float = 10.0,
                    start: Callable[[int, int], ContextManager[ServedProcess]] | None = None, repeats: int = 1) -> ServerComparison:
    """Start a service per (processes, threads) setup, all at once, warm each up, and load them ``repeats`` times in turns.

    ``start(processes, threads)`` returns a context manager giving the service (default: the kit's own, from
    ``start_service``; a service already running can be lent with ``contextlib.nullcontext(service)``). Idle
    servers wait on their sockets and cost no CPU while another one is loaded.
    """
    start = start or (lambda workers, threads: start_service(workers=workers, threads=threads))
    setups = [tuple(s) for s in setups]
    with contextlib.ExitStack() as stack:
        services = {setup: stack.enter_context(start(*setup)) for setup in setups}
        warm = {setup: load_test(service.url + "/predict", payloads, concurrency, concurrency, max_seconds).rows[0]  # connections, first calls
                for setup, service in services.items()}
        runs = in_turns(services, payloads, concurrency, max_requests, max_seconds, repeats)
    rows = []
    for workers, threads in setups:
        done = runs[workers, threads]
        name = f"{workers} process{'es' if workers > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
        answered = warm[workers, threads].requests - warm[workers, threads].errors + sum(r.requests - r.errors for r in done)
        rows.append(ServerSetup(name, workers, threads, float(np.median([r.throughput for r in done])), [r.throughput for r in done],
                                *percentiles(done), sum(r.errors for r in done), answered))
    return ServerComparison(rows, [f"Each server: {repeats} run(s) of {max_requests} requests at concurrency {concurrency} "
                                   f"(at most {max_seconds:g} s each), after {concurrency} warm-up requests, the servers taking "
                                   "turns; requests/s is the median run's, p50 and p99 over every request; "
                                   "one torch thread per model call."])


@dataclass
class BatchingSetting(HasRuns):
    setting: str = column("server")
    throughput: float = column("requests/s", ".1f")
    runs: list[float] = column("requests/s, each run", each_run)
    p50: float = column("p50", format_seconds)
    p99: float = column("p99", format_seconds)
    mean_batch: float = column("inputs per model call", ".1f")
    errors: int = column("errors")


class BatchingTradeoff(Report):
    """A plain server against dynamically batching ones, under the same bounded load, in turns."""

    title = "Dynamic batching: throughput against latency"

    def plot(self, ax=None):
        from helpers.core.plots import labelled_scatter

        points = {r.setting: (r.throughput, r.p99 * 1e3) for r in self.rows}
        return labelled_scatter(points, ax, title=self.title, xlabel="requests/s (median run)", ylabel="p99 latency (ms)",
                                from_zero=True)


def batching_tradeoff(payloads: Sequence[dict], settings: Sequence[tuple[int, float]] = ((8, 2.0), (32, 5.0)),
                      concurrency: int = 16, max_requests: int = 400, max_seconds: float = 10.0,
                      repeats: int = 3) -> BatchingTradeoff:
    """The plain service and one per (max batch size, max wait ms) setting, all running at once, each loaded ``repeats``
    times in turns (after a warm-up), so that other work on the machine hits every server alike."""
    from helpers.serving.load import read_metrics

    servers = [(0, 0.0), *[(int(size), float(wait)) for size, wait in settings]]
    with contextlib.ExitStack() as stack:
        services = {s: stack.enter_context(start_service(batch_size=s[0], max_wait_ms=s[1])) for s in servers}
        for service in services.values():
            load_test(service.url + "/predict", payloads, concurrency, concurrency, max_seconds)  # connections, first calls
        runs = in_turns(services, payloads, concurrency, max_requests, max_seconds, repeats)
        metrics = {s: read_metrics(service.url) for s, service in services.items()}
    rows = []
    for batch_size, wait in servers:
        done, counted = runs[batch_size, wait], metrics[batch_size, wait]
        calls = counted.get("model_batch_inputs_count", 0.0)
        mean = counted["model_batch_inputs_sum"] / calls if calls else 1.0
        name = "plain (one call per request)" if not batch_size else f"batch <= {batch_size}, wait <= {wait:g} ms"
        rows.append(BatchingSetting(name, float(np.median([r.throughput for r in done])), [r.throughput for r in done],
                                    *percentiles(done), mean, sum(r.errors for r in done)))
    return BatchingTradeoff(rows, [f"Each server: {repeats} run(s) of {max_requests} single-image requests at concurrency "
                                   f"{concurrency} (at most {max_seconds:g} s each), the servers taking turns after a warm-up; "
                                   "requests/s is the median run's, p50 and p99 over every request."])


@dataclass
class EngineRow(HasRuns):
    server: str = column("server")
    throughput: float = column("requests/s", ".1f")
    runs: list[float] = column("requests/s, each run", each_run)
    p50: float = column("p50", format_seconds)
    p99: float = column("p99", format_seconds)
    errors: int = column("errors")
    answers: list = field(default_factory=list)  # its predictions for the first 8 payloads, sent as one request


class EngineComparison(Report):
    """The kit's batching server against Ray Serve's @serve.batch, same model, settings and load."""

    title = "The kit's batcher against Ray Serve"


def kit_vs_ray_serve(payloads: Sequence[dict], batch_size: int = 32, max_wait_ms: float = 2.0, concurrency: int = 16,
                     max_requests: int = 400, max_seconds: float = 20.0, repeats: int = 3) -> EngineComparison:
    """The same bounded load on the kit's batching service and on Ray Serve (a local Ray instance), both running,
    ``repeats`` times in turns after a warm-up; then each answers the first 8 payloads in one request
    (``EngineRow.answers``), so the lecture can show they agree."""
    import httpx

    from helpers.serving.ray_service import start_ray_service

    first_eight = {"inputs": [row for payload in payloads[:8] for row in payload["inputs"]]}
    names = {"kit: FastAPI + DynamicBatcher": lambda: start_service(batch_size=batch_size, max_wait_ms=max_wait_ms),
             "Ray Serve: @serve.batch": lambda: start_ray_service(batch_size, max_wait_ms)}
    with contextlib.ExitStack() as stack:
        services = {name: stack.enter_context(start()) for name, start in names.items()}
        for service in services.values():
            load_test(service.url + "/predict", payloads, concurrency, min(32, max_requests), max_seconds)  # warm-up
        runs = in_turns(services, payloads, concurrency, max_requests, max_seconds, repeats)
        answers = {name: httpx.post(service.url + "/predict", json=first_eight, timeout=60).json()["predictions"]
                   for name, service in services.items()}
    rows = [EngineRow(name, float(np.median([r.throughput for r in runs[name]])), [r.throughput for r in runs[name]],
                      *percentiles(runs[name]), sum(r.errors for r in runs[name]), answers[name]) for name in names]
    return EngineComparison(rows, [f"batch <= {batch_size}, wait <= {max_wait_ms:g} ms; each server: {repeats} run(s) of "
                                   f"{max_requests} single-image requests at concurrency {concurrency}, the two taking turns "
                                   "after 32 warm-up requests each; requests/s is the median run's. Ray runs locally with 2 CPUs."])
