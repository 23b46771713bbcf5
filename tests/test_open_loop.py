"""helpers.serving.open_loop: sends on schedule whatever the answers, so a slow server's queue shows in latency."""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI

from helpers.core.procs import LOOPBACK, free_port
from helpers.serving import HttpSender, closed_loop_test, open_loop_test, poisson_schedule

SERVICE_SECONDS = 0.02  # the slow server answers one request at a time, each taking this long: 50 requests/s at most


@pytest.fixture(scope="module")
def slow_server():
    app = FastAPI()
    one_at_a_time = asyncio.Lock()
    app.state.in_flight = app.state.most_in_flight = 0

    @app.post("/work")
    async def work(body: dict):
        app.state.in_flight += 1
        app.state.most_in_flight = max(app.state.most_in_flight, app.state.in_flight)
        try:
            async with one_at_a_time:
                await asyncio.sleep(SERVICE_SECONDS)
        finally:
            app.state.in_flight -= 1
        return {"ok": True}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://{LOOPBACK}:{port}/work", app.state
    server.should_exit = True
    thread.join(10)


def test_the_schedule_is_poisson_at_the_rate_and_seeded():
    times = poisson_schedule(200.0, 4000, seed=3)
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps > 0).all()
    assert abs(gaps.mean() - 1 / 200) < 0.1 / 200          # mean gap 1/rate
    assert abs(gaps.std() / gaps.mean() - 1) < 0.1          # exponential: coefficient of variation 1
    assert np.array_equal(times, poisson_schedule(200.0, 4000, seed=3))
    assert not np.array_equal(times, poisson_schedule(200.0, 4000, seed=4))


def test_open_loop_shows_the_queue_a_closed_loop_hides(slow_server):
    url, server = slow_server
    send = HttpSender(url, [{"x": 1}])
    # Twice what the server can answer: requests keep arriving on schedule, so a queue builds up.
    server.most_in_flight = 0
    over = open_loop_test(send, rate=2 / SERVICE_SECONDS, max_requests=100, max_seconds=1.0, seed=0).rows[0]
    open_queue = server.most_in_flight
    server.most_in_flight = 0
    polite = closed_loop_test(send, concurrency=1, max_requests=40, max_seconds=5.0).rows[0]
    closed_queue = server.most_in_flight
    assert over.errors == 0 and polite.errors == 0 and over.requests >= 60
    # the closed loop sees about one service time; the open loop sees the queue (hundreds of ms by the end)
    assert polite.p99 < 10 * SERVICE_SECONDS
    assert over.p99 > 5 * polite.p99 and over.p50 > 3 * polite.p50
    # sends kept to schedule although answers were late: the server held a queue of waiting requests, which a client
    # that waits for each answer never builds (the send lag itself is the client's own stalls, so it is not judged
    # here: on a loaded 2-core machine the event loop stalls for as long as the load runs)
    assert closed_queue == 1 and open_queue >= 10
    # and the achieved rate is the server's, not the offered one
    assert over.achieved < 0.8 * over.offered


def test_latency_counts_from_the_scheduled_time_and_failures_are_counted():
    async def late_sometimes(i: int):
        await asyncio.sleep(0.05 if i % 2 else 0.0)
        if i == 3:
            raise RuntimeError("refused")
        return {"first_token": time.perf_counter(), "output_tokens": 4}

    report = open_loop_test(late_sometimes, rate=[50.0], max_requests=20, max_seconds=5.0, seed=1)
    row = report.rows[0]
    assert row.requests == 20 and row.errors == 1 and "refused" in row.first_error
    assert all(r.latency >= r.sent - r.scheduled for r in row.records)
    assert row.ttft_p50 is not None and row.output_tps > 0
    assert "refused" in str(report)


def test_bad_arguments_are_refused_with_a_message():
    async def send(i):
        return None

    with pytest.raises(ValueError, match="positive"):
        open_loop_test(send, rate=0)
    with pytest.raises(ValueError, match="concurrency"):
        closed_loop_test(send, concurrency=0)


def test_a_stall_counts_against_the_requests_due_during_it():
    """Coordinated omission: requests due while the sender was stalled are late, and their latency says so."""
    async def stalls_once(i: int):
        if i == 0:
            time.sleep(0.3)  # blocks the event loop: nothing else is sent meanwhile
        return None

    row = open_loop_test(stalls_once, rate=100.0, max_requests=60, max_seconds=5.0, seed=2).rows[0]
    due_in_stall = [r for r in row.records if 0 < r.scheduled - row.records[0].scheduled < 0.2]
    assert len(due_in_stall) >= 5
    # each took ~0 s once sent, but was sent late: its latency is at least its wait
    assert all(r.latency >= 0.3 - (r.scheduled - row.records[0].scheduled) - 0.02 for r in due_in_stall)
    assert row.send_lag > 0.1


def test_without_a_request_cap_time_alone_ends_each_rate():
    async def send(i):
        return None

    report = open_loop_test(send, rate=[100.0, 400.0], max_requests=None, max_seconds=0.5, seed=4)
    slow, fast = report.rows
    for row, rate in ((slow, 100.0), (fast, 400.0)):
        due = [r.scheduled - row.records[0].scheduled for r in row.records]
        assert max(due) < 0.5 and abs(row.requests - 0.5 * rate) < 5 * (0.5 * rate) ** 0.5  # Poisson: mean rate x seconds
    assert fast.requests > 2 * slow.requests  # the faster rate sent more, in the same time
    assert "0.5 s of sending per rate" in str(report)


@pytest.fixture(scope="module")
def counting_server():
    """A server that answers after 10 ms and remembers the most requests it held at once."""
    app = FastAPI()
    held = {"now": 0, "most": 0}

    @app.post("/work")
    async def work(body: dict):
        held["now"] += 1
        held["most"] = max(held["most"], held["now"])
        await asyncio.sleep(0.01)
        held["now"] -= 1
        return {"ok": True}

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        time.sleep(0.05)
    yield f"http://{LOOPBACK}:{port}/work", held
    server.should_exit = True
    thread.join(10)


def test_the_sender_keeps_to_its_connections_and_the_rest_wait_their_turn(counting_server):
    url, held = counting_server
    row = open_loop_test(HttpSender(url, [{"x": 1}], max_connections=2), rate=1000.0, max_requests=60, max_seconds=1.0).rows[0]
    assert row.errors == 0 and row.requests == 60
    assert held["most"] <= 2  # never more than two requests at the server at once
    assert row.p99 > 0.1  # sixty requests due within ~60 ms, two at a time at 10 ms each: the last ones waited ~0.3 s
    with pytest.raises(ValueError, match="max_connections"):
        HttpSender(url, [{"x": 1}], max_connections=0)
