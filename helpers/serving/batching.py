"""Dynamic batching in a server: requests that arrive close together share one model call.

Each request waits at most ``max_wait_ms`` for company (from the moment the first of a batch arrived);
a batch closes earlier when it holds ``max_batch_size`` inputs. Answers go back to their own callers in
order. This is the mechanism of Triton's dynamic batcher and Ray Serve's ``@serve.batch``, small enough
to read in one sitting.

Written once: lecture 7's cell (section 4 of 07-formats-runtimes-batching.ipynb) is the source; this module holds
the same text for the kit's service and the tests, and tests/test_hardware_lecture_code.py fails when they differ.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable

import anyio
import torch


@dataclass
class Pending:
    """One request in the queue: its images, the future its caller awaits, and when it arrived."""

    pixels: torch.Tensor
    answer: asyncio.Future
    arrived: float = field(default_factory=time.perf_counter)


class DynamicBatcher:
    """Collect concurrent requests into batches for ``predict`` (pixels (N, 784) -> N digits), run in a worker thread."""

    def __init__(self, predict: Callable[[torch.Tensor], list[int]], max_batch_size: int = 32, max_wait_ms: float = 2.0,
                 on_batch: Callable[[int, float], None] | None = None):
        if max_batch_size < 1 or max_wait_ms < 0:
            raise ValueError(f"max_batch_size must be >= 1 and max_wait_ms >= 0, got {max_batch_size}, {max_wait_ms}")
        self.predict, self.max_batch_size, self.max_wait = predict, max_batch_size, max_wait_ms / 1e3
        self.on_batch = on_batch  # called with (inputs in the batch, longest wait in it)
        self.queue: asyncio.Queue[Pending] = asyncio.Queue()
        self.batch_sizes: list[int] = []  # inputs per model call, in order
        self.waits: list[float] = []  # the longest wait in each batch, seconds
        self.task: asyncio.Task | None = None
        self.held: Pending | None = None  # a request that did not fit the last batch: first in the next one

    def start(self) -> None:
        """Start the batching loop on the running event loop (an app's startup)."""
        self.task = asyncio.get_running_loop().create_task(self.loop())

    async def stop(self) -> None:
        if self.task:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task

    async def submit(self, pixels: torch.Tensor) -> list[int]:
        """The digits for ``pixels``, computed in whatever batch it joins."""
        if len(pixels) > self.max_batch_size:
            raise ValueError(f"{len(pixels)} inputs in one request; this batcher takes at most {self.max_batch_size}")
        if self.task is None:
            self.start()
        pending = Pending(pixels, asyncio.get_running_loop().create_future())
        await self.queue.put(pending)
        return await pending.answer

    async def next_batch(self) -> list[Pending]:
        """The next batch: the first request, then whatever arrives before its deadline, up to ``max_batch_size`` inputs."""
        first = self.held or await self.queue.get()
        self.held = None
        batch, size = [first], len(first.pixels)
        deadline = first.arrived + self.max_wait
        while size < self.max_batch_size:
            remaining = deadline - time.perf_counter()
            try:  # past the deadline, take only what is already waiting
                item = self.queue.get_nowait() if remaining <= 0 else await asyncio.wait_for(self.queue.get(), remaining)
            except (asyncio.TimeoutError, asyncio.QueueEmpty):
                break
            if size + len(item.pixels) > self.max_batch_size:
                self.held = item  # it would not fit: it opens the next batch
                break
            batch.append(item)
            size += len(item.pixels)
        return batch

    async def loop(self) -> None:
        """Forever: form a batch, run the model once on it in a worker thread, hand each caller its own slice."""
        while True:
            batch = await self.next_batch()
            started = time.perf_counter()
            pixels = torch.cat([p.pixels for p in batch])
            try:
                digits = await anyio.to_thread.run_sync(self.predict, pixels)
            except Exception as err:  # noqa: BLE001 - every caller of this batch gets the error, the loop goes on
                for p in batch:
                    if not p.answer.done():
                        p.answer.set_exception(err)
                continue
            longest_wait = started - min(p.arrived for p in batch)
            self.batch_sizes.append(len(pixels))
            self.waits.append(longest_wait)
            if self.on_batch:
                self.on_batch(len(pixels), longest_wait)
            start = 0
            for p in batch:  # answers in the order the requests joined
                if not p.answer.done():
                    p.answer.set_result(digits[start:start + len(p.pixels)])
                start += len(p.pixels)
