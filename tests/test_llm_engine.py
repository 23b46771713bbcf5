"""The serving engine over SmolLM2: blocks taken as sequences grow and shared by prefix, preemption, chunked prefill and
speculative decoding, each changing where and when tokens are computed and never which tokens come out."""
from __future__ import annotations

import asyncio
import math

import pytest
import torch

from helpers.serving.llama import load_llm
from helpers.serving.llm_engine import AsyncEngine, BlockPool, Engine, Request, ngram_draft, sample, use_definitions
from helpers.serving.smollm import load_tokenizer

QUESTIONS = ["What is a GPU?", "Write a haiku about caches.", "List three prime numbers.",
             "Explain the KV cache in one sentence.", "What is 12 times 7?", "Translate 'good morning' into French."]
NEW = 24


# --- the pool and the drafts, without a model ---------------------------------------------------------------------
def test_blocks_are_shared_by_count_and_a_freed_block_stays_findable_until_taken():
    pool = BlockPool(3)
    a, b = pool.take(), pool.take()
    pool.remember(a, 111)
    pool.share(a)                                     # a second sequence with the same prefix
    pool.release(a)
    assert pool.used == 2 and pool.lookup(111) == a   # still held by the first
    pool.release(a)
    assert pool.used == 1 and pool.lookup(111) == a   # free, and its content still cached
    pool.share(a)                                     # found again: back in use, off the free list
    assert pool.used == 2 and pool.take() not in (a, b) and pool.take() is None
    pool.release(a)
    assert pool.take() == a and pool.lookup(111) is None   # taken for new content: the old prefix is forgotten


def test_free_blocks_are_reused_least_recently_freed_first():
    pool = BlockPool(4)
    blocks = [pool.take() for _ in range(4)]
    for block in (blocks[2], blocks[0]):
        pool.release(block)
    assert pool.take() == blocks[2] and pool.take() == blocks[0]


def test_ngram_drafts_copy_what_followed_the_latest_match():
    assert ngram_draft([5, 6, 7, 8, 9, 5, 6, 7], 2) == [8, 9]            # "5 6 7" seen before: propose what came next
    assert ngram_draft([1, 2, 3, 1, 2, 4, 1, 2], 3) == [4, 1, 2]         # the latest of two matches
    assert ngram_draft([1, 2, 3, 4], 3) == []                            # nothing repeats
    assert ngram_draft([9, 9], 4) == [9]


def test_sampling_is_greedy_at_zero_and_seeded_otherwise():
    logits = torch.tensor([0.0, 3.0, 2.9, -1.0])
    assert sample(logits, Request(0, [1], 1)) == 1
    draws = [sample(logits, Request(0, [1], 1, temperature=1.0, seed=seed)) for seed in range(40)]
    assert set(draws) >= {1, 2}                                          # temperature 1 draws either of the close two
    assert draws == [sample(logits, Request(0, [1], 1, temperature=1.0, seed=seed)) for seed in range(40)]  # seeded
    assert {sample(logits, Request(0, [1], 1, temperature=1.0, top_p=0.3, seed=s)) for s in range(40)} == {1}


# --- the engine over the real model -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return load_llm()


@pytest.fixture(scope="module")
def prompts():
    tokenizer = load_tokenizer()
    return [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


@pytest.fixture(scope="module")
def alone(model, prompts):
    """Each prompt's greedy answer, computed with nothing else in the engine."""
    return [Engine(model).generate([p], NEW)[0] for p in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("options", [
    {"max_batch": 6},
    {"max_batch": 4, "scheduler": "static"},
    {"max_batch": 6, "chunk_size": 8},
    {"max_batch": 6, "speculate": 4},
    {"max_batch": 6, "allocation": "reserved", "num_blocks": 24},
    {"max_batch": 6, "prefix_caching": False, "block_size": 4},
], ids=["continuous", "static", "chunked", "speculative", "reserved", "small-blocks"])
def test_batching_scheduling_and_memory_never_change_a_greedy_answer(model, prompts, alone, options):
    assert Engine(model, **options).generate(prompts, NEW) == alone


@pytest.mark.slow
def test_blocks_are_taken_as_a_sequence_grows(model, prompts):
    engine = Engine(model, block_size=8)
    request = engine.add(prompts[0], 40)
    held = []
    while engine.has_work():
        engine.step()
        if not request.done:
            held.append((len(request.blocks), request.computed))
    assert all(blocks == math.ceil(computed / 8) or blocks == math.ceil((computed + 1) / 8) for blocks, computed in held)
    assert held[0][0] < held[-1][0]                     # more blocks at the end than after the prompt
    assert engine.pool.used == 0                         # all given back when it finished


@pytest.mark.slow
def test_a_pool_too_small_for_the_batch_preempts_and_resumes_with_the_same_output(model, prompts, alone):
    longest = max(len(p) for p in prompts) + NEW
    engine = Engine(model, max_batch=6, num_blocks=math.ceil(longest / 16) + 6, block_size=16)
    dropped, preempt = [], engine._preempt
    engine._preempt = lambda request: (dropped.append(request.computed), preempt(request))
    assert engine.generate(prompts, NEW) == alone
    assert engine.stats.preemptions == len(dropped) > 0
    assert min(dropped) > 0, "a request was admitted only to be evicted in the same step, before it computed anything"
    assert engine.stats.preempted_tokens == sum(dropped)
    assert engine.pool.used == 0 or not engine.running


@pytest.mark.slow
def test_paging_runs_more_sequences_than_reserving_at_one_budget(model, prompts):
    """64-token answers promised, short ones given (end of sequence): reservation holds room that is never used."""
    def most_running(allocation, steps=4):
        engine = Engine(model, max_batch=6, num_blocks=40, block_size=8, allocation=allocation)
        for p in prompts:
            engine.add(p, 200)
        peak = 0
        for _ in range(steps):  # the first steps show it: who was admitted
            engine.step()
            peak = max(peak, len(engine.running))
        return peak
    paged, reserved = most_running("paged"), most_running("reserved")
    assert paged == len(prompts) and reserved == 40 // math.ceil((max(map(len, prompts)) + 200) / 8)


@pytest.mark.slow
def test_a_shared_system_prompt_is_computed_once(model, alone):
    tokenizer = load_tokenizer()
    system = {"role": "system", "content": "You are a careful assistant for a course on efficient deep learning. " * 6}
    shared = [tokenizer.encode_chat([system, {"role": "user", "content": q}]) for q in QUESTIONS[:3]]
    results = {}
    for caching in (True, False):
        engine = Engine(model, prefix_caching=caching)
        first = engine.generate(shared[:1], 4)
        rest = engine.generate(shared[1:], 4)
        results[caching] = (first + rest, engine.stats.prefill_tokens, engine.stats.prefix_hits)
    assert results[True][0] == results[False][0]
    assert results[True][2] >= 2 * 16 * (len(tokenizer.encode_chat([system])) // 16 - 1)   # both later prompts hit
    assert results[True][1] < results[False][1] and results[False][2] == 0


@pytest.mark.slow
def test_a_long_prompt_is_prefilled_in_chunks_while_a_stream_keeps_its_token_every_step(model, prompts):
    engine = Engine(model, chunk_size=32)
    stream = engine.add(prompts[0], 30)
    while not stream.output:
        engine.step()
    long_prompt = prompts[1] * 4
    late = engine.add(long_prompt, 2)
    chunks = math.ceil(len(long_prompt) / 32)
    steps_with_token = 0
    for step in range(chunks):
        before = len(stream.output)
        engine.step()
        steps_with_token += len(stream.output) == before + 1
        assert bool(late.output) == (step == chunks - 1)            # its first token only after its last chunk
    assert steps_with_token == chunks                               # the stream got a token at every chunk's step


@pytest.mark.slow
def test_speculation_accepts_copied_text_and_rolls_back_what_it_rejects(model):
    tokenizer = load_tokenizer()
    code = "def area(width, height):\n    return width * height\n\n\ndef perimeter(width, height):\n    return 2 * (width + height)\n"
    prompt = tokenizer.encode_chat([{"role": "user", "content": f"Repeat this code exactly:\n{code}"}])
    plain = Engine(model).generate([prompt], 40)[0]
    engine = Engine(model, speculate=4, block_size=4)
    request = engine.add(prompt, 40)
    while engine.has_work():
        engine.step()
        if not request.done:      # rejected drafts' blocks went back: only what holds computed keys stays taken
            assert len(request.blocks) == math.ceil(request.computed / 4)
    assert request.output == plain
    assert engine.stats.accepted_tokens > 0 and engine.stats.steps < len(plain)


@pytest.mark.slow
def test_an_abort_frees_the_blocks_and_bad_requests_say_what_is_wrong(model, prompts):
    engine = Engine(model, num_blocks=64)
    request = engine.add(prompts[0], 50)
    engine.step()
    assert engine.pool.used > 0
    engine.abort(request)
    engine.step()
    assert request.finish_reason == "abort" and engine.pool.used == 0 and not engine.has_work()
    for prompt, max_tokens, words in (([], 4, "empty"), ([1], 0, "at least 1"), ([1] * 9000, 4, "context"),
                                      ([1] * 1000, 100, "KV cache"), ([49152], 4, "0..49151")):
        with pytest.raises(ValueError, match=words):
            engine.add(prompt, max_tokens)


@pytest.mark.slow
def test_the_async_engine_streams_and_a_closed_stream_frees_its_blocks(model, prompts, alone):
    runner = AsyncEngine(Engine(model))

    async def first_tokens():
        streamed = [t async for t in runner.generate(prompts[0], NEW)]
        stream = runner.generate(prompts[1], 200)
        async for _ in stream:
            break
        await stream.aclose()                            # the client went away after one token
        for _ in range(100):
            if runner.engine.pool.used == 0 and not runner.engine.has_work():
                break
            await asyncio.sleep(0.05)
        return streamed

    try:
        assert asyncio.run(first_tokens()) == alone[0]
        assert runner.engine.pool.used == 0 and runner.engine.stats.finished.get("abort") == 1
    finally:
        runner.stop()


@pytest.mark.slow
def test_a_failed_step_ends_the_requests_in_flight_and_the_engine_serves_on(model, prompts, alone):
    engine = Engine(model)
    runner = AsyncEngine(engine)
    forward = engine.model.forward

    def broken(*args):
        engine.model.forward = forward                   # fails once
        raise RuntimeError("a kernel failed")

    async def two_requests():
        engine.model.forward = broken
        first = [t async for t in runner.generate(prompts[0], NEW)]
        second = [t async for t in runner.generate(prompts[0], NEW)]
        return first, second

    try:
        first, second = asyncio.run(two_requests())
        assert first == [] and second == alone[0] and runner.alive
        assert engine.stats.finished.get("abort") == 1 and engine.pool.used == 0
    finally:
        runner.stop()


def test_a_lectures_cells_replace_the_engines_definitions_by_name_only():
    from helpers.serving import llm_engine

    def lecture_draft(tokens, k, max_n=3):
        return []

    original = llm_engine.ngram_draft
    try:
        use_definitions(ngram_draft=lecture_draft)
        assert llm_engine.ngram_draft is lecture_draft           # what Engine._plan calls from now on
    finally:
        use_definitions(ngram_draft=original)
    with pytest.raises(ValueError, match="no replaceable definition named \\['schedule'\\]"):
        use_definitions(schedule=len)


# Building an engine computes nothing: the thread that builds it (here the main one) starts no OpenMP team, and the KV
# cache is zeroed by the thread that steps (helpers.core.load.in_fresh_thread says why that matters).
BUILT_ELSEWHERE = """
import threading, torch
from helpers.serving.llama import load_llm
from helpers.serving.llm_engine import Engine
from tests.openmp_probe import settle, threads
torch.set_num_threads(2)
engine = Engine(load_llm(), num_blocks=256)
before = threads()
built = engine._kv is None
request = engine.add([1, 2, 3], 2)
stepper = threading.Thread(target=lambda: [engine.step() for _ in range(3)])
stepper.start()
stepper.join()
print(built, settle(before) == before, len(request.output), engine.k_cache.shape[1])
"""


def test_building_an_engine_starts_no_openmp_team_and_the_stepping_thread_zeroes_the_cache():
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", BUILT_ELSEWHERE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True", "2", str(256 * 16)]
