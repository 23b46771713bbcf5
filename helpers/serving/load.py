"""A bounded load generator: N concurrent clients, a cap on requests and on seconds, latency percentiles.

Written here rather than taken from Locust or k6 because on a 2-core laptop those tools' own processes
would take the cores the server needs; an asyncio loop with one httpx client is enough to saturate a
one-process Python service, and its every request is bounded in count and time. For real load tests
of a deployed service, use Locust, k6 or wrk against it from another machine.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Sequence

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from helpers.core.report import Report, column, format_seconds


def each_run(rates: list[float] | None) -> str:
    """Requests/s of each repeat, in the order they ran: '612, 655, 640'."""
    return "" if rates is None else ", ".join(f"{r:.0f}" for r in rates)


@dataclass
class LoadLevel:
    """What one concurrency level achieved (over every repeat: throughput is the median repeat's, latencies pooled)."""

    concurrency: int = column("concurrency")
    requests: int = column("requests", ",")
    errors: int = column("errors", ",")
    throughput: float = column("requests/s", ".1f")
    runs: list[float] | None = column("requests/s, each run", each_run, optional=True)  # None when the level ran once
    inputs_per_s: float = column("inputs/s", ",.0f", default=0.0)
    p50: float = column("p50", format_seconds, default=float("nan"))
    p95: float = column("p95", format_seconds, default=float("nan"))
    p99: float = column("p99", format_seconds, default=float("nan"))
    seconds: float = column("wall time", ".2f", default=0.0)
    latencies: list[float] | None = None
    first_error: str = ""

    @property
    def slowest(self) -> float:
        """The lowest requests/s of its repeats (its only one when it ran once)."""
        return min(self.runs or [self.throughput])

    @property
    def fastest(self) -> float:
        """The highest requests/s of its repeats."""
        return max(self.runs or [self.throughput])


class LoadReport(Report):
    """Throughput and latency percentiles per concurrency level, under a bounded load."""

    title = "Bounded load on the service"

    def plot(self, ax=None):
        """Latency percentiles against throughput, one point per concurrency level."""
        from helpers.core.plots import line_chart

        series = {name: ([r.throughput for r in self.rows], [getattr(r, name) * 1e3 for r in self.rows])
                  for name in ("p50", "p95", "p99")}
        ax = line_chart(series, ax, title=self.title, xlabel="throughput (requests/s); point labels: concurrency",
                        ylabel="latency (ms)")
        for r in self.rows:
            ax.annotate(str(r.concurrency), (r.throughput, r.p99 * 1e3), textcoords="offset points", xytext=(4, 4), fontsize=8)
        return ax


async def _run_level(url: str, payloads: Sequence[dict], concurrency: int, max_requests: int, max_seconds: float,
                     timeout: float) -> LoadLevel:
    latencies: list[float] = []
    errors: list[str] = []
    issued = 0
    deadline = float("inf")  # set when the clock starts, below
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal issued
        while issued < max_requests and time.perf_counter() < deadline:
            payload = payloads[issued % len(payloads)]
            issued += 1
            start = time.perf_counter()
            try:
                answer = await http.post(url, json=payload)
                ok = answer.status_code == 200
                reason = "" if ok else f"HTTP {answer.status_code}: {answer.text[:200]}"
            except httpx.HTTPError as err:
                ok, reason = False, f"{type(err).__name__}: {err}"
            latencies.append(time.perf_counter() - start)
            if not ok:
                errors.append(reason)

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as http:
        begin = time.perf_counter()  # the clock starts after the client is built (its setup is no request's time) ...
        deadline = begin + max_seconds
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
        wall = time.perf_counter() - begin  # ... and stops at the last answer, before the connections close
    done = np.array(latencies) if latencies else np.array([float("nan")])
    p50, p95, p99 = np.percentile(done, [50, 95, 99])
    per_request = len(payloads[0].get("inputs", [None])) if payloads else 1
    return LoadLevel(concurrency, len(latencies), len(errors), len(latencies) / wall, None, len(latencies) * per_request / wall,
                     float(p50), float(p95), float(p99), wall, latencies, errors[0] if errors else "")


def pooled(runs: list[LoadLevel]) -> LoadLevel:
    """One level's repeats as one row: counts added, the median repeat's rates, percentiles over every request."""
    if len(runs) == 1:
        return runs[0]
    latencies = [t for r in runs for t in r.latencies or []]
    p50, p95, p99 = np.percentile(latencies or [float("nan")], [50, 95, 99])
    rates = [r.throughput for r in runs]
    median = float(np.median(rates))
    errors = [r.first_error for r in runs if r.first_error]
    return LoadLevel(runs[0].concurrency, sum(r.requests for r in runs), sum(r.errors for r in runs), median, rates,
                     float(np.median([r.inputs_per_s for r in runs])), float(p50), float(p95), float(p99),
                     sum(r.seconds for r in runs), latencies, errors[0] if errors else "")


def _run(coroutine):
    """Run a coroutine from plain code or from a notebook cell (whose event loop is already running)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def load_test(url: str, payloads: Sequence[dict], concurrency: int | Sequence[int] = 8, max_requests: int = 500,
              max_seconds: float = 10.0, timeout: float = 30.0, repeats: int = 1) -> LoadReport:
    """POST ``payloads`` (cycled) to ``url`` from ``concurrency`` clients, at most ``max_requests`` and ``max_seconds`` per level.

    ``concurrency`` may be a list of levels (a concurrency sweep). With ``repeats`` > 1 the levels run in that many
    rounds, taking turns (each round starts one level later), so that other work on the machine hits every level
    alike; a row then holds every repeat's requests/s (``runs``), their median, and percentiles over all its requests.
    """
    levels = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if not payloads:
        raise ValueError("load_test needs at least one payload to send")
    if any(c < 1 for c in levels) or max_requests < 1 or max_seconds <= 0 or repeats < 1:
        raise ValueError(f"concurrency levels must be >= 1 and the caps and repeats positive; got {levels}, "
                         f"max_requests={max_requests}, max_seconds={max_seconds}, repeats={repeats}")
    runs: dict[int, list[LoadLevel]] = {i: [] for i in range(len(levels))}
    for round_ in range(repeats):
        for i in taking_turns(range(len(levels)), round_):
            runs[i].append(_run(_run_level(url, payloads, levels[i], max_requests, max_seconds, timeout)))
    rows = [pooled(runs[i]) for i in range(len(levels))]
    notes = [f"Each level: at most {max_requests:,} requests and {max_seconds:g} s, from one asyncio client process"
             + (f"; {repeats} rounds in which the levels take turns: requests/s is the median round's, percentiles over "
                "every request." if repeats > 1 else ".")]
    notes += [f"concurrency {r.concurrency}: first error: {r.first_error}" for r in rows if r.errors]
    return LoadReport(rows, notes)


def taking_turns(items, round_: int) -> list:
    """``items`` in the order of round ``round_``: each round starts one item later, so none always goes first."""
    items = list(items)
    shift = round_ % len(items) if items else 0
    return items[shift:] + items[:shift]


def read_metrics(base_url: str, timeout: float = 60.0) -> dict[str, float]:
    """The service's /metrics, parsed with prometheus-client's own parser: {sample name{labels}: value}. Waits up to a
    minute by default: right after a load test the service may still be working through the requests its clients gave
    up on."""
    text = httpx.get(base_url.rstrip("/") + "/metrics", timeout=timeout).raise_for_status().text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


@dataclass
class Phase:
    """One part of a request's time: its median over the requests sent, and its share of the client's total."""

    phase: str = column("where the time goes")
    median: float = column("median", format_seconds)
    share: float = column("share of total", ".0%")


class RequestBreakdown(Report):
    """Where one request's time goes: the server's own phases (from Server-Timing) and the rest (HTTP, network, queueing)."""

    title = "One request, taken apart"

    def __init__(self, rows, inputs: int, requests: int):
        self.inputs, self.requests = inputs, requests
        super().__init__(rows, [f"Median of {requests} sequential requests with {inputs} image(s) each; "
                                "'encode JSON (client)' is timed by the client; 'HTTP, network and framework' is the client's "
                                "total minus that and the server's phases."])

    def plot(self, ax=None):
        from helpers.core.plots import horizontal_bars

        parts = [r for r in self.rows if r.phase != "client total"]
        return horizontal_bars([r.phase for r in parts], [r.median * 1e3 for r in parts], ax,
                               title=self.title, xlabel="median time (ms)")


PHASE_LABELS = {"parse": "parse JSON", "validate": "validate input", "model": "run the model", "serialize": "serialise the answer"}
ENCODE, OTHER, TOTAL = "encode JSON (client)", "HTTP, network and framework", "client total"


def request_breakdown(base_url: str, pixels, inputs: int = 1, requests: int = 50) -> RequestBreakdown:
    """Send ``requests`` sequential /predict requests of ``inputs`` images; split each one's time by phase.

    The phases are the server's ``Server-Timing`` entries, labelled by their ``desc`` where the server gives one, and
    the client's own JSON encoding of the body (timed here, encoded as httpx's ``json=`` would); the rest of the
    client's total is HTTP, the network stack, the framework and waiting.
    """
    from helpers.serving.service import timing_entries

    rows: list[dict[str, float]] = []
    headers = {"Content-Type": "application/json"}
    with httpx.Client(timeout=30) as http:
        body = {"inputs": pixels[:inputs].tolist()}
        http.post(base_url + "/predict", json=body).raise_for_status()  # warm-up: connection, first model call
        for _ in range(requests):
            start = time.perf_counter()
            content = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
            encoded = time.perf_counter()
            answer = http.post(base_url + "/predict", content=content, headers=headers)
            total = time.perf_counter() - start
            answer.raise_for_status()
            if "server-timing" not in answer.headers:
                raise ValueError(f"{base_url}/predict sent no Server-Timing header: the breakdown needs the server's own phases")
            phases = {desc or PHASE_LABELS.get(name, name): seconds for name, desc, seconds in timing_entries(answer.headers["server-timing"])}
            phases[ENCODE] = encoded - start
            phases[OTHER] = max(total - sum(phases.values()), 0.0)
            phases[TOTAL] = total
            rows.append(phases)
    total = float(np.median([r[TOTAL] for r in rows]))
    return RequestBreakdown([Phase(label, float(np.median([r[label] for r in rows])), float(np.median([r[label] for r in rows])) / total)
                             for label in rows[0]], inputs, requests)
