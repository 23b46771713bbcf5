"""Lecture 6's experiments that start their own services: process workers against in-process threads."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

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


class ServerComparison(Report):
    """The same bounded load on differently configured servers."""

    title = "Worker processes against threads, same load"

    def best(self) -> ServerSetup:
        return max(self.rows, key=lambda r: r.throughput)

    def plot(self, ax=None):
        from helpers.core.plots import horizontal_bars

        return horizontal_bars([r.setup for r in self.rows], [r.throughput for r in self.rows], ax,
                               title=self.title, xlabel="requests/s")


def compare_servers(payloads: Sequence[dict], setups: Sequence[tuple[int, int]] = ((1, 1), (1, 2), (2, 1)),
                    concurrency: int = 16, max_requests: int = 400, max_seconds: float = 10.0) -> ServerComparison:
    """Start a service per (processes, threads) setup in turn, load each the same way, and stop it."""
    rows = []
    for workers, threads in setups:
        with start_service(workers=workers, threads=threads) as service:
            level = load_test(service.url + "/predict", payloads, concurrency, max_requests, max_seconds).rows[0]
        name = f"{workers} process{'es' if workers > 1 else ''} x {threads} thread{'s' if threads > 1 else ''}"
        rows.append(ServerSetup(name, workers, threads, level.throughput, level.p50, level.p99, level.errors))
    return ServerComparison(rows, [f"Each server: {max_requests} requests at concurrency {concurrency} (at most {max_seconds:g} s); "
                                   "one torch thread per model call."])
