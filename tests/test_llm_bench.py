"""The LLM serving benchmark's measurement code (helpers/serving/llm_bench.py): arrivals, per-request figures, goodput,
the static-batch server's queue; one slow test serves a few real requests through each system."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from helpers.serving.llm_bench import (
    SLO,
    ChatRequest,
    Timeline,
    _shared_prefix,
    _ThreadedServer,
    arrival_gaps,
    arrival_times,
    chat_workload,
    decode_rate,
    drive,
    left_padded,
    summarise,
)


def test_saturation_sends_everything_at_once_and_poisson_gaps_have_the_rate_s_mean():
    assert np.array_equal(arrival_times(5, math.inf), np.zeros(5))
    times = arrival_times(4000, rate=8.0, seed=3)
    gaps = np.diff(times)
    assert times[0] == 0 and (gaps >= 0).all()
    assert np.mean(gaps) == pytest.approx(1 / 8.0, rel=0.08)
    assert np.std(gaps) == pytest.approx(1 / 8.0, rel=0.1)       # exponential: the spread equals the mean
    assert np.array_equal(arrival_times(50, 8.0, seed=3), arrival_times(50, 8.0, seed=3))
    assert not np.array_equal(arrival_times(50, 8.0, seed=3), arrival_times(50, 8.0, seed=4))


@pytest.mark.parametrize("count, rate", [(0, 1.0), (3, 0.0), (3, -2.0), (3, math.nan)])
def test_a_bad_schedule_is_refused_saying_what_is_needed(count, rate):
    with pytest.raises(ValueError, match="count >= 1 and rate > 0"):
        arrival_times(count, rate)


def test_the_workload_cycles_prompts_and_draws_max_tokens_from_the_set_reproducibly():
    prompts = [[1, 2], [3], [4, 5, 6]]
    work = chat_workload(prompts, 7, rate=2.0, seed=1, max_tokens=(8, 64))
    assert [r.prompt for r in work] == [prompts[i % 3] for i in range(7)]
    assert {r.max_tokens for r in work} <= {8, 64} and len({r.max_tokens for r in work}) == 2
    assert [r.arrival for r in work] == list(arrival_times(7, 2.0, seed=1))
    assert work == chat_workload(prompts, 7, rate=2.0, seed=1, max_tokens=(8, 64))
    with pytest.raises(ValueError, match="at least one prompt"):
        chat_workload([], 3)


def test_a_timeline_gives_vllm_s_ttft_tpot_and_itl():
    t = Timeline(arrival=10.0, token_times=[10.5, 10.6, 10.8, 11.1], tokens=[7, 8, 9, 2], finished=11.1)
    assert t.ttft == pytest.approx(0.5)
    assert t.tpot == pytest.approx(0.6 / 3)                     # (last - first) / (tokens - 1)
    assert t.itls == pytest.approx([0.1, 0.2, 0.3])
    assert t.e2e == pytest.approx(1.1)
    one = Timeline(arrival=0.0, token_times=[0.2], tokens=[5], finished=0.2)
    assert one.tpot is None and one.itls == []
    assert Timeline(arrival=0.0).ttft is None


def test_goodput_counts_the_requests_that_met_both_objectives():
    slo = SLO(ttft=1.0, tpot=0.1)
    fast = Timeline(0.0, [0.5, 0.55, 0.6], [1, 2, 3], 0.6)                   # met
    slow_start = Timeline(0.0, [1.5, 1.55], [1, 2], 1.55)                    # TTFT too long
    slow_tokens = Timeline(1.0, [1.2, 1.5, 1.8, 2.1], [1, 2, 3, 4], 2.1)     # TPOT 0.3 s
    single = Timeline(3.0, [3.9], [1], 4.0)                                  # one token: TTFT alone decides
    failed = Timeline(2.0, [2.1], [1], 2.2, error="RuntimeError: boom")
    assert [slo.met(t) for t in (fast, slow_start, slow_tokens, single, failed)] == [True, False, False, True, False]
    row = summarise("x", "all at once", [fast, slow_start, slow_tokens, single, failed], slo)
    assert row.seconds == pytest.approx(4.0)                                 # first arrival to last answer
    assert row.goodput == pytest.approx(2 / 4.0)
    assert row.request_rate == pytest.approx(4 / 4.0)                        # the failed one is not an answer
    assert row.output_tps == pytest.approx(10 / 4.0)
    assert row.ttft_p50 == pytest.approx(np.median([0.5, 1.5, 0.2, 0.9]))
    assert row.errors == 1 and "boom" in row.note
    assert "TTFT <= 1 s" in str(slo) and "TPOT <= 100 ms" in str(slo)


def test_decode_rate_counts_the_tokens_after_the_first():
    assert decode_rate([1.0, 1.5, 2.0, 2.5]) == pytest.approx(3 / 1.5)
    with pytest.raises(ValueError, match="at least two tokens"):
        decode_rate([1.0])


def test_the_gaps_that_overlap_a_window_are_the_ones_a_long_prefill_caused():
    streams = [[0.0, 0.1, 0.2, 1.2, 1.3], [0.05, 0.15, 1.25]]
    # window [0.25, 1.2]: the stalls 0.2 -> 1.2 and 0.15 -> 1.25 overlap it, the others do not
    assert sorted(arrival_gaps(streams, 0.25, 1.2)) == pytest.approx([1.0, 1.1])


def test_left_padding_puts_every_prompt_s_last_token_in_the_last_column():
    ids, mask = left_padded([[5, 6, 7], [8]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def test_the_shared_prefix_of_prompts():
    assert _shared_prefix([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3]]) == 2
    assert _shared_prefix([[1, 2]]) == 2


class CountingServer(_ThreadedServer):
    """A static-batch server whose "model" counts: each step gives every request of the batch its next number."""

    def __init__(self, batch_size: int, step_seconds: float = 0.02, fail: bool = False):
        self.step_seconds, self.fail, self.batches = step_seconds, fail, []
        super().__init__(batch_size, eos_id=-1)

    def serve(self, jobs):
        self.batches.append(len(jobs))
        if self.fail:
            raise RuntimeError("the model broke")
        step = 0
        while not all(job.done for job in jobs):
            time.sleep(self.step_seconds)
            step += 1
            for job in jobs:
                job.give(step)


def test_a_static_batch_runs_to_its_longest_member_while_later_requests_wait():
    server = CountingServer(batch_size=2)
    work = [ChatRequest([1], 2, 0.0), ChatRequest([1], 6, 0.0), ChatRequest([1], 2, 0.0)]
    try:
        short, long, late = drive(server, work)
    finally:
        server.close()
    assert server.batches == [2, 1]
    assert short.tokens == [1, 2] and long.tokens == [1, 2, 3, 4, 5, 6] and late.tokens == [1, 2]
    assert short.finished < long.finished <= late.token_times[0]     # the third waited for the whole first batch
    assert late.ttft > 5 * server.step_seconds


def test_a_server_error_reaches_its_clients_and_the_run_goes_on():
    server = CountingServer(batch_size=1, fail=True)
    try:
        timelines = drive(server, [ChatRequest([1], 3, 0.0), ChatRequest([1], 3, 0.01)])
    finally:
        server.close()
    assert all("the model broke" in t.error for t in timelines)
    row = summarise("broken", "", timelines, SLO(1, 1))
    assert row.errors == 2 and row.goodput == 0


@pytest.mark.slow
def test_every_system_gives_the_same_greedy_answers_under_the_same_arrivals(smollm_reference):
    """A tiny bench: the kit's engine (continuous, static) and transformers' static batches serve the same requests."""
    from helpers.serving.llama import load_llm
    from helpers.serving.llm_bench import EngineServer, StaticBatchServer, chat_prompts
    from helpers.serving.llm_engine import Engine
    from helpers.serving.smollm import load_tokenizer

    model, tokenizer = load_llm(), load_tokenizer()
    work = chat_workload(chat_prompts(tokenizer)[:4], 5, rate=20.0, max_tokens=(4, 12))
    servers = {"continuous": EngineServer(Engine(model, max_batch=4)),
               "static": EngineServer(Engine(model, scheduler="static", max_batch=4)),
               "transformers B=2": StaticBatchServer(smollm_reference[0], 2)}
    answers = {}
    for name, server in servers.items():
        try:
            timelines = drive(server, work)
        finally:
            server.close()
        row = summarise(name, "", timelines, SLO(math.inf, math.inf))
        assert row.errors == 0 and row.goodput == pytest.approx(row.request_rate)
        assert all(0 < len(t.tokens) <= r.max_tokens and t.ttft > 0 for t, r in zip(timelines, work))
        answers[name] = [t.tokens for t in timelines]
    assert answers["continuous"] == answers["static"] == answers["transformers B=2"]


def test_every_timed_section_of_the_llm_bench_runs_off_the_main_thread():
    """A section that computed on the main thread would leave an OpenMP team there for good, and every serving thread
    after it would run slower (helpers.core.load.in_fresh_thread)."""
    import threading

    from helpers.core.report import Report
    from tests.bench.bench_llm import timed

    where = []

    def section():
        where.append(threading.current_thread() is threading.main_thread())
        return Report([], [])

    report = timed(section)
    assert where == [False]
    assert report.notes[0].startswith("Measured in")
