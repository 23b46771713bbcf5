"""Experiments that start their own services: process workers against threads (lecture 6), batching and Ray Serve (lecture 7)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, ContextManager, Sequence

from helpers.core.procs import ServedProcess
from helpers.core.report import Report, column, format_seconds
from helpers.serving.load import load_test
from helpers.serving.server import start_service


@dataclass
class ServerSetup:
    setup: str = column("server")
    workers: int = column("processes")
    threads: int = column("model threads each")
    throughput: float = column("requests/s", ".1f")
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
                               title=self.title, xlabel="requests/s")


def compare_servers(payloads: Sequence[dict], setups: Sequence[tuple[int, int]] = ((1, 1), (1, 2), (2, 1)),
                    concurrency: int = 16, max_requests: int = 400, max_seconds: float = 10.0,
                    start: Callable[[int, int], ContextManager[ServedProcess]] | None = None) -> ServerComparison:
    """Start a service per (processes, threads) setup in turn, warm it up, load each the same way, and stop it.

    ``start(processes, threads)`` returns a context manager giving the service (default: the kit's own, from
    ``start_service``; a service already running can be lent with ``contextlib.nullcontext(service)``).
    """
    start = start or (lambda workers, threads: start_service(workers=workers, threads=threads))
    rows = []
    for workers, threads in setups:
        with start(workers, threads) as service:
            warm = load_test(service.url + "/predict", payloads, concurrency, concurrency, max_seconds).rows[0]  # connections, first calls
            level = load_test(service.url + "/predict", payloads, concurrency, max_requests, max_seconds).rows[0]
        name = f"{workers} process{'es' if workers > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
        rows.append(ServerSetup(name, workers, threads, level.throughput, level.p50, level.p99, level.errors,
                                warm.requests - warm.errors + level.requests - level.errors))
    return ServerComparison(rows, [f"Each server: {max_requests} requests at concurrency {concurrency} (at most {max_seconds:g} s), "
                                   f"after {concurrency} warm-up requests; "
                                   "one torch thread per model call."])


@dataclass
class BatchingSetting:
    setting: str = column("server")
    throughput: float = column("requests/s", ".1f")
    p50: float = column("p50", format_seconds)
    p99: float = column("p99", format_seconds)
    mean_batch: float = column("inputs per model call", ".1f")
    errors: int = column("errors")


class BatchingTradeoff(Report):
    """A plain server against dynamically batching ones, under the same bounded load."""

    title = "Dynamic batching: throughput against latency"

    def plot(self, ax=None):
        from helpers.core.plots import labelled_scatter

        points = {r.setting: (r.throughput, r.p99 * 1e3) for r in self.rows}
        return labelled_scatter(points, ax, title=self.title, xlabel="requests/s", ylabel="p99 latency (ms)", from_zero=True)


def batching_tradeoff(payloads: Sequence[dict], settings: Sequence[tuple[int, float]] = ((8, 2.0), (32, 5.0)),
                      concurrency: int = 16, max_requests: int = 400, max_seconds: float = 10.0) -> BatchingTradeoff:
    """The plain service, then one per (max batch size, max wait ms) setting, each under the same load."""
    from helpers.serving.load import read_metrics

    rows = []
    for batch_size, wait in [(0, 0.0), *settings]:
        with start_service(batch_size=batch_size, max_wait_ms=wait) as service:
            level = load_test(service.url + "/predict", payloads, concurrency, max_requests, max_seconds).rows[0]
            metrics = read_metrics(service.url)
        calls = metrics.get("model_batch_inputs_count", 0.0)
        mean = metrics["model_batch_inputs_sum"] / calls if calls else 1.0
        name = "plain (one call per request)" if not batch_size else f"batch <= {batch_size}, wait <= {wait:g} ms"
        rows.append(BatchingSetting(name, level.throughput, level.p50, level.p99, mean, level.errors))
    return BatchingTradeoff(rows, [f"Each server: {max_requests} single-image requests at concurrency {concurrency} "
                                   f"(at most {max_seconds:g} s)."])


@dataclass
class EngineRow:
    server: str = column("server")
    throughput: float = column("requests/s", ".1f")
    p50: float = column("p50", format_seconds)
    p99: float = column("p99", format_seconds)
    errors: int = column("errors")
    answers: list = field(default_factory=list)  # its predictions for the first 8 payloads, sent as one request


class EngineComparison(Report):
    """The kit's batching server against Ray Serve's @serve.batch, same model, settings and load."""

    title = "The kit's batcher against Ray Serve"


def kit_vs_ray_serve(payloads: Sequence[dict], batch_size: int = 32, max_wait_ms: float = 2.0, concurrency: int = 16,
                     max_requests: int = 400, max_seconds: float = 20.0) -> EngineComparison:
    """The same bounded load on the kit's batching service and on Ray Serve (a local Ray instance); then each
    answers the first 8 payloads in one request (``EngineRow.answers``), so the lecture can show they agree."""
    import httpx

    from helpers.serving.ray_service import start_ray_service

    first_eight = {"inputs": [row for payload in payloads[:8] for row in payload["inputs"]]}
    rows = []
    for name, start in (("kit: FastAPI + DynamicBatcher", lambda: start_service(batch_size=batch_size, max_wait_ms=max_wait_ms)),
                        ("Ray Serve: @serve.batch", lambda: start_ray_service(batch_size, max_wait_ms))):
        with start() as service:
            load_test(service.url + "/predict", payloads, concurrency, min(32, max_requests), max_seconds)  # warm-up
            level = load_test(service.url + "/predict", payloads, concurrency, max_requests, max_seconds).rows[0]
            answers = httpx.post(service.url + "/predict", json=first_eight, timeout=60).json()["predictions"]
        rows.append(EngineRow(name, level.throughput, level.p50, level.p99, level.errors, answers))
    return EngineComparison(rows, [f"batch <= {batch_size}, wait <= {max_wait_ms:g} ms, {max_requests} single-image requests at "
                                   f"concurrency {concurrency}, after 32 warm-up requests; Ray runs locally with 2 CPUs."])
