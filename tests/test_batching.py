"""helpers.serving.batching: batches form under concurrency, answers keep their order and owners, waiting is bounded."""
from __future__ import annotations

import asyncio
import time

import pytest
import torch

from helpers.serving.batching import DynamicBatcher


def rows_as_digits(pixels: torch.Tensor) -> list[int]:
    """A stand-in model whose answer names its input: pixel 0 of each row."""
    return pixels[:, 0].long().tolist()


def requests(n: int, size: int = 1) -> list[torch.Tensor]:
    return [torch.full((size, 784), float(i)) for i in range(n)]


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_requests_share_batches_and_each_gets_its_own_answers():
    async def main():
        batcher = DynamicBatcher(rows_as_digits, max_batch_size=8, max_wait_ms=50)
        answers = await asyncio.gather(*(batcher.submit(x) for x in requests(20, size=2)))
        await batcher.stop()
        return batcher, answers
    batcher, answers = run(main())
    assert answers == [[i, i] for i in range(20)]
    assert sum(batcher.batch_sizes) == 40 and max(batcher.batch_sizes) <= 8
    assert max(batcher.batch_sizes) > 2 and len(batcher.batch_sizes) < 20  # requests shared batches (how many: the machine's load)


def test_a_lone_request_waits_for_max_wait_and_no_longer():
    async def lone(max_wait_ms):
        batcher = DynamicBatcher(rows_as_digits, max_batch_size=64, max_wait_ms=max_wait_ms)
        start = time.perf_counter()
        answer = await batcher.submit(requests(1)[0])
        elapsed = time.perf_counter() - start
        await batcher.stop()
        return batcher, answer, elapsed

    async def main():
        return await lone(30), await lone(300)
    (short, answer, elapsed), (long, _, _) = run(main())
    assert answer == [0] and short.batch_sizes == long.batch_sizes == [1]
    assert short.waits[0] >= 0.025 and elapsed >= 0.025 and long.waits[0] >= 0.29  # waited for company, then went alone
    # and no longer: a window ten times as long makes the lone request wait several times as long (a ratio within one run)
    assert long.waits[0] > 3 * short.waits[0]


def test_a_full_batch_goes_at_once_without_waiting_out_the_window():
    async def main():
        batcher = DynamicBatcher(rows_as_digits, max_batch_size=4, max_wait_ms=5000)
        start = time.perf_counter()
        await asyncio.gather(*(batcher.submit(x) for x in requests(4)))
        elapsed = time.perf_counter() - start
        await batcher.stop()
        return elapsed
    assert run(main()) < 2.0  # far below the 5 s window


def test_a_failing_batch_fails_its_own_callers_and_the_batcher_goes_on():
    calls = []

    def flaky(pixels):
        calls.append(len(pixels))
        if len(calls) == 1:
            raise RuntimeError("model exploded")
        return rows_as_digits(pixels)

    async def main():
        batcher = DynamicBatcher(flaky, max_batch_size=2, max_wait_ms=20)
        first = await asyncio.gather(*(batcher.submit(x) for x in requests(2)), return_exceptions=True)
        second = await batcher.submit(requests(1)[0])
        await batcher.stop()
        return first, second
    first, second = run(main())
    assert all(isinstance(e, RuntimeError) and "exploded" in str(e) for e in first) and second == [0]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_batch_size"):
        DynamicBatcher(rows_as_digits, max_batch_size=0)


def test_batches_never_exceed_max_batch_size_with_uneven_requests():
    async def main():
        batcher = DynamicBatcher(rows_as_digits, max_batch_size=5, max_wait_ms=40)
        sizes = [1, 3, 2, 1, 4, 1, 2, 5, 3, 3]
        answers = await asyncio.gather(*(batcher.submit(torch.full((n, 784), float(i))) for i, n in enumerate(sizes)))
        await batcher.stop()
        return batcher, answers, sizes
    batcher, answers, sizes = run(main())
    assert answers == [[i] * n for i, n in enumerate(sizes)]
    assert max(batcher.batch_sizes) <= 5 and sum(batcher.batch_sizes) == sum(sizes), batcher.batch_sizes


def test_a_request_larger_than_a_batch_is_refused():
    async def main():
        batcher = DynamicBatcher(rows_as_digits, max_batch_size=4)
        with pytest.raises(ValueError, match="at most 4"):
            await batcher.submit(torch.zeros(5, 784))
    run(main())
