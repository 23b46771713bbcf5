"""Assignment 3's workbench: the served model, held-out digits, a server you can start from a notebook, load and timing.

Read it, but do not edit it: the autograder grades your notebook against its own copy of this file.
"""
from __future__ import annotations

import asyncio
import contextlib
import statistics
import threading
import time
from typing import Awaitable, Callable, Iterator, Sequence

import torch
import uvicorn
from torch import nn

from helpers.core.procs import LOOPBACK, free_port
from helpers.serving import mnist_holdout, mnist_model


def served_model() -> nn.Module:
    """The course's MNIST classifier: pixels (N, 784) in 0..1 -> logits (N, 10). Trained once, then cached."""
    return mnist_model()[0]


def held_out(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` held-out digits (pixels (n, 784), labels (n,)), a different sample for each seed."""
    pixels, labels = mnist_holdout()
    order = torch.randperm(len(pixels), generator=torch.Generator().manual_seed(seed))[:n]
    return pixels[order], labels[order]


@contextlib.contextmanager
def serve_app(app, startup_timeout: float = 30.0) -> Iterator[str]:
    """Serve an ASGI ``app`` (FastAPI) with uvicorn on 127.0.0.1 and a free port, in a thread of this kernel.

    Yields the base URL; the server stops when the ``with`` block ends (and with the kernel).
    """
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host=LOOPBACK, port=port, log_level="error", lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"hw3-server-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the app did not start on port {port}: look for an exception above")
        time.sleep(0.05)
    try:
        yield f"http://{LOOPBACK}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def interleaved_medians(first: Callable[[], object], second: Callable[[], object], rounds: int = 7,
                        calls: int = 20) -> tuple[float, float]:
    """Median seconds per call of ``first`` and ``second``, timed in alternating rounds (fair on a busy machine)."""
    times: tuple[list[float], list[float]] = ([], [])
    for fn in (first, second):
        fn()  # warm-up
    for _ in range(rounds):
        for fn, out in zip((first, second), times):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - start) / calls)
    return statistics.median(times[0]), statistics.median(times[1])


def wide_model(seed: int = 0) -> nn.Module:
    """A wider MLP for part 3 (784 -> 1024 -> 1024 -> 10): one call costs enough for batching to matter."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10)).eval()


def predictor(model: nn.Module) -> Callable[[torch.Tensor], list[int]]:
    """pixels (N, 784) -> N digits, without autograd, on one thread."""
    def predict(pixels: torch.Tensor) -> list[int]:
        with torch.inference_mode():
            return model(pixels).argmax(1).tolist()
    return predict


def bounded_load(handle: Callable[[torch.Tensor], Awaitable[list[int]]], images: torch.Tensor, concurrency: int,
                 max_requests: int, max_seconds: float) -> dict[str, float]:
    """``concurrency`` asyncio clients send single images to ``handle`` (at most ``max_requests`` and ``max_seconds``).

    Returns requests, errors, throughput (requests/s), p50 and p99 (seconds), and wrong (answers for another image).
    """
    async def main():
        latencies, failures, issued, wrong = [], 0, 0, 0
        expected = predictor_cache.setdefault(id(images), None)
        deadline = time.perf_counter() + max_seconds

        async def client():
            nonlocal issued, failures, wrong
            while issued < max_requests and time.perf_counter() < deadline:
                index = issued % len(images)
                issued += 1
                start = time.perf_counter()
                try:
                    answer = await handle(images[index:index + 1])
                    if expected is not None and answer != [expected[index]]:
                        wrong += 1
                except Exception:  # noqa: BLE001 - a failed request counts as an error, the load goes on
                    failures += 1
                latencies.append(time.perf_counter() - start)

        begin = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        wall = time.perf_counter() - begin
        ordered = sorted(latencies)
        return {"requests": len(latencies), "errors": failures, "wrong": wrong, "throughput": len(latencies) / wall,
                "p50": statistics.median(ordered), "p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}

    return run_async(main())


def run_async(coroutine):
    """Run a coroutine to the end on a fresh event loop in a helper thread (a notebook's own loop is busy running the cell)."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


predictor_cache: dict[int, list[int] | None] = {}


def expect_answers(images: torch.Tensor, model: nn.Module) -> None:
    """Let ``bounded_load`` check every answer against ``model``'s own digits for ``images``."""
    predictor_cache[id(images)] = predictor(model)(images)


__all__: Sequence[str] = ["served_model", "held_out", "serve_app", "interleaved_medians", "wide_model", "predictor",
                          "bounded_load", "expect_answers", "run_async"]
