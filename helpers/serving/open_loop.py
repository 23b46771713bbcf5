"""Open-loop load: requests sent on a schedule (Poisson arrivals at a set rate) whatever the answers.

A closed loop (``load_test``: N clients, each waiting for its answer before sending again) slows down
with the server, so a stalled server sees fewer requests and its queue never shows in the latencies:
*coordinated omission*. Users do not queue politely. Here every request has a scheduled send time drawn
before the run (exponential gaps at ``rate`` per second, seeded), is sent at that time whether or not
earlier ones were answered, and its latency is counted from the *scheduled* time, so time spent waiting
behind a slow server (or a late client) is in the figure. This is the method of vLLM's serving benchmark
(``--request-rate`` with Poisson arrivals); for language models the request callable may also report when
its first token came and how many tokens it produced, giving TTFT, TPOT and inter-token latency.

Locust and k6 were considered: Locust's users are closed loops (``constant_throughput`` only paces each
user), and k6's ``constant-arrival-rate`` is open but fixed-interval, outside Python, and would take the
cores a 2-core laptop's server needs. One asyncio loop firing tasks at numpy's exponential gaps is enough.
``closed_loop_test`` runs the same request callable the other way, for the comparison.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from helpers.core.report import Report, column, format_seconds

SendFn = Callable[[int], Awaitable[Any]]


@dataclass
class RequestRecord:
    """One request: when it was due, sent and answered (``time.perf_counter`` seconds), and what it reported."""

    index: int
    scheduled: float
    sent: float = float("nan")
    finished: float = float("nan")
    error: str = ""
    first_token: float | None = None   # when the first output token arrived, if the callable says
    token_times: list[float] | None = None
    output_tokens: int | None = None

    @property
    def latency(self) -> float:
        """From the scheduled send time to the answer: queueing at the client and server included."""
        return self.finished - self.scheduled

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.scheduled

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (vLLM's definition); None for one-token answers."""
        if self.first_token is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.finished - self.first_token) / (self.output_tokens - 1)


@dataclass
class LoadRun:
    """What one load level achieved: a rate (open loop) or a number of clients (closed loop)."""

    mode: str = column("load")
    offered: float | None = column("rate sent (req/s)", ".1f", optional=True)
    achieved: float = column("answered (req/s)", ".1f")
    requests: int = column("requests", ",")
    errors: int = column("errors", ",")
    p50: float = column("p50", format_seconds)
    p90: float = column("p90", format_seconds)
    p99: float = column("p99", format_seconds)
    send_lag: float = column("p99 send lag", format_seconds)
    output_tps: float | None = column("output tokens/s", ",.0f", optional=True)
    ttft_p50: float | None = column("TTFT p50", format_seconds, optional=True)
    ttft_p99: float | None = column("TTFT p99", format_seconds, optional=True)
    tpot_p50: float | None = column("TPOT p50", format_seconds, optional=True)
    itl_p50: float | None = column("ITL p50", format_seconds, optional=True)
    seconds: float = column("wall time", ".2f")
    records: list[RequestRecord] = field(default_factory=list, repr=False)
    first_error: str = ""


class OpenLoopReport(Report):
    """Latency percentiles per load level (latency counted from the scheduled send time in open loops)."""

    title = "Load on the service"

    def plot(self, ax=None):
        """p50 and p99 latency against the rate answered, one point per level."""
        from helpers.core.plots import line_chart

        series = {name: ([r.achieved for r in self.rows], [getattr(r, name) * 1e3 for r in self.rows]) for name in ("p50", "p99")}
        return line_chart(series, ax, title=self.title, xlabel="requests answered per second", ylabel="latency (ms)")


def poisson_schedule(rate: float, count: int, seed: int = 0) -> np.ndarray:
    """``count`` send times (seconds from the start) of a Poisson process at ``rate`` per second: exponential gaps."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, size=count)
    return np.cumsum(gaps) - gaps[0]  # the first request goes at once


async def _call(send: SendFn, record: RequestRecord, timeout: float) -> None:
    record.sent = time.perf_counter()
    try:
        answer = await asyncio.wait_for(send(record.index), timeout)
    except asyncio.TimeoutError:
        record.error = f"no answer within {timeout:g} s"
        answer = None
    except Exception as err:  # a failed request is counted, never stops the run
        record.error = f"{type(err).__name__}: {err}"[:300]
        answer = None
    record.finished = time.perf_counter()
    if isinstance(answer, dict):
        record.first_token = answer.get("first_token")
        record.token_times = answer.get("token_times")
        record.output_tokens = answer.get("output_tokens")
        if answer.get("error"):
            record.error = str(answer["error"])[:300]


def requests_due(rate: float, seconds: float) -> int:
    """Enough Poisson arrivals at ``rate``/s to fill ``seconds`` (the mean plus ten standard deviations): the schedule
    that ``max_seconds`` alone ends."""
    expected = rate * seconds
    return int(expected + 10 * expected ** 0.5 + 10)


async def run_open_loop(send: SendFn, rate: float, max_requests: int | None = 200, max_seconds: float = 10.0,
                        seed: int = 0, timeout: float = 60.0) -> list[RequestRecord]:
    """Send ``send(i)`` at Poisson times at ``rate``/s until ``max_requests`` (None: no cap) or ``max_seconds``; await every answer."""
    begin = time.perf_counter()
    due = poisson_schedule(rate, max_requests or requests_due(rate, max_seconds), seed)
    records = [RequestRecord(i, begin + t) for i, t in enumerate(due) if t < max_seconds]
    tasks = []
    for record in records:
        delay = record.scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(_call(send, record, timeout)))
    await asyncio.gather(*tasks)
    await _close(send)
    return records


async def run_closed_loop(send: SendFn, concurrency: int, max_requests: int = 200, max_seconds: float = 10.0,
                          timeout: float = 60.0) -> list[RequestRecord]:
    """``concurrency`` clients, each sending its next request when its last one is answered (scheduled = sent)."""
    records: list[RequestRecord] = []
    deadline = time.perf_counter() + max_seconds

    async def client() -> None:
        while len(records) < max_requests and time.perf_counter() < deadline:
            record = RequestRecord(len(records), time.perf_counter())
            records.append(record)
            await _call(send, record, timeout)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    await _close(send)
    return records


async def _close(send: SendFn) -> None:
    if hasattr(send, "aclose"):
        await send.aclose()


class HttpSender:
    """A request callable for ``open_loop_test``/``closed_loop_test``: POST ``payloads[i % len(payloads)]`` as JSON to ``url``.

    At most ``max_connections`` requests are in flight, each on a connection of its own; a request due while all are
    busy waits its turn in order (its latency still counts from its due time, as a user's would). Its
    ``httpx.AsyncClient`` is opened on first use in the running event loop and closed by ``aclose()``; a status other
    than 200 counts as an error.
    """

    def __init__(self, url: str, payloads: Sequence[dict], timeout: float = 60.0, max_connections: int = 1000):
        if not payloads:
            raise ValueError("HttpSender needs at least one payload to send")
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self.url, self.payloads, self.timeout, self.max_connections = url, list(payloads), timeout, max_connections
        self._client = None
        self._slots: asyncio.Semaphore | None = None  # first come, first served: a queue without httpx's pool scanning it

    async def __call__(self, i: int) -> dict:
        import httpx

        if self._client is None:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections)
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=limits)
            self._slots = asyncio.Semaphore(self.max_connections)
        async with self._slots:
            answer = await self._client.post(self.url, json=self.payloads[i % len(self.payloads)])
        return {} if answer.status_code == 200 else {"error": f"HTTP {answer.status_code}: {answer.text[:200]}"}

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _percentiles(values: Sequence[float | None], qs=(50, 90, 99)) -> list[float | None]:
    kept = [v for v in values if v is not None and np.isfinite(v)]
    return [float(v) for v in np.percentile(kept, qs)] if kept else [None] * len(qs)


def summarise(records: list[RequestRecord], mode: str, offered: float | None = None) -> LoadRun:
    """One table row from a run's records: rates, latency percentiles, and the token figures when reported."""
    if not records:
        raise ValueError("no request was sent: raise max_seconds or max_requests, or the rate")
    start = min(r.scheduled for r in records)
    wall = max(r.finished for r in records) - start
    ok = [r for r in records if not r.error]
    p50, p90, p99 = _percentiles([r.latency for r in ok])
    nan = float("nan")
    tokens = [r.output_tokens for r in ok if r.output_tokens is not None]
    gaps = [b - a for r in ok if r.token_times for a, b in zip(r.token_times, r.token_times[1:])]
    errors = [r.error for r in records if r.error]
    return LoadRun(mode, offered, len(ok) / wall, len(records), len(errors),
                   nan if p50 is None else p50, nan if p90 is None else p90, nan if p99 is None else p99,
                   _percentiles([r.sent - r.scheduled for r in records], (99,))[0] or 0.0,
                   sum(tokens) / wall if tokens else None,
                   *(_percentiles([r.ttft for r in ok], (50, 99)) if any(r.first_token for r in ok) else (None, None)),
                   _percentiles([r.tpot for r in ok], (50,))[0],
                   _percentiles(gaps, (50,))[0], wall, records, errors[0] if errors else "")


def _run(coroutine):
    from helpers.serving.load import _run as run_anywhere  # works inside a notebook's running event loop

    return run_anywhere(coroutine)


def open_loop_test(send: SendFn, rate: float | Sequence[float], max_requests: int | None = 200,
              max_seconds: float = 10.0, seed: int = 0, timeout: float = 60.0) -> OpenLoopReport:
    """Open-loop load at each ``rate`` (requests/s, Poisson arrivals, seeded): a table row per rate.

    ``send(i)`` is any async callable sending request ``i`` (e.g. an ``httpx.AsyncClient`` post); it may return
    a dict with ``first_token`` (a ``time.perf_counter()`` time), ``token_times`` and ``output_tokens`` for the
    language-model figures, or ``error``; if it has an ``aclose()`` coroutine (as ``HttpSender``'s does), that is
    awaited after each level, in the level's own event loop. Each level stops sending at ``max_requests`` or ``max_seconds`` and
    waits at most ``timeout`` for each answer, so a run is bounded. ``max_requests=None`` lets time alone end each level:
    every rate then runs for the same ``max_seconds``, so a faster rate sends more (what a queue needs to show).
    """
    rates = [rate] if isinstance(rate, (int, float)) else list(rate)
    if not rates or any(r <= 0 for r in rates) or (max_requests is not None and max_requests < 1) or max_seconds <= 0 or timeout <= 0:
        raise ValueError(f"rates, max_requests, max_seconds and timeout must be positive; got rate={rate}, "
                         f"max_requests={max_requests}, max_seconds={max_seconds}, timeout={timeout}")
    rows = [summarise(_run(run_open_loop(send, r, max_requests, max_seconds, seed, timeout)), f"open loop, {r:g}/s", r)
            for r in rates]
    cap = f"at most {max_requests:,} requests and {max_seconds:g} s" if max_requests else f"{max_seconds:g} s"
    return _report(rows, f"Open loop: Poisson arrivals (seed {seed}); latency from each request's scheduled send time; "
                         f"{cap} of sending per rate.")


def closed_loop_test(send: SendFn, concurrency: int | Sequence[int], max_requests: int = 200, max_seconds: float = 10.0,
                timeout: float = 60.0) -> OpenLoopReport:
    """The same request callable as a closed loop: ``concurrency`` clients that each wait for their answer."""
    levels = [concurrency] if isinstance(concurrency, int) else list(concurrency)
    if not levels or any(c < 1 for c in levels) or max_requests < 1 or max_seconds <= 0:
        raise ValueError(f"concurrency must be >= 1 and the caps positive; got {concurrency}, {max_requests}, {max_seconds}")
    rows = [summarise(_run(run_closed_loop(send, c, max_requests, max_seconds, timeout)), f"closed loop, {c} client(s)")
            for c in levels]
    return _report(rows, f"Closed loop: each client sends when its last answer came; at most {max_requests:,} requests "
                         f"and {max_seconds:g} s per level.")


def _report(rows: list[LoadRun], note: str) -> OpenLoopReport:
    notes = [note] + [f"{r.mode}: {r.errors} error(s), first: {r.first_error}" for r in rows if r.errors]
    return OpenLoopReport(rows, notes)
