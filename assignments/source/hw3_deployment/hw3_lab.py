"""Assignment 3's workbench: the served model, held-out digits, a server you can start from a notebook, load and timing.

Read it, but do not edit it: the autograder grades your notebook against its own copy of this file.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Awaitable, Callable, Iterator, Sequence

import numpy as np
import torch
import uvicorn
from torch import nn

import helpers
from helpers.core import LOOPBACK, free_port
from helpers.serving import mnist_holdout, mnist_model

KIT_ROOT = str(Path(helpers.__file__).resolve().parents[1])  # the kit, for the eager baseline's own process
PYTHON = sys.executable


def served_model() -> nn.Module:
    """The course's MNIST classifier: pixels (N, 784) in 0..1 -> logits (N, 10). Trained once, then cached."""
    return mnist_model()[0]


@functools.lru_cache(maxsize=1)
def _holdout() -> tuple[torch.Tensor, torch.Tensor]:
    return mnist_holdout()


def held_out(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` held-out digits (pixels (n, 784), labels (n,)), a different sample for each seed."""
    pixels, labels = _holdout()
    order = torch.randint(len(pixels), (n,), generator=torch.Generator().manual_seed(seed)) if n > len(pixels) else \
        torch.randperm(len(pixels), generator=torch.Generator().manual_seed(seed))[:n]
    return pixels[order], labels[order]


def held_out_images(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` held-out digits as a camera or a browser sends them: uint8 images (n, 28, 28) in 0..255, and labels (n,)."""
    pixels, labels = held_out(n, seed)
    return (pixels * 255).round().to(torch.uint8).reshape(n, 28, 28), labels


def fresh_images(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` uint8 images never seen before: held-out digits with a little random noise (new contents at every call)."""
    pixels, _ = _holdout()
    picked = pixels[torch.randint(len(pixels), (n,), generator=generator)]
    noise = torch.randint(0, 9, picked.shape, generator=generator)
    return ((picked * 255).round() + noise).clamp(0, 255).to(torch.uint8).reshape(n, 28, 28)


def digits_and_confidence(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What the end-to-end model of part 2 computes, in eager PyTorch: uint8 images (N, 28, 28) -> (digits, confidence)."""
    with torch.no_grad():
        chances = torch.softmax(model(images.reshape(len(images), 784).float() / 255.0), dim=1)
    confidence, digits = chances.max(dim=1)
    return digits, confidence


_EAGER_CHILD = """
import os, sys, time
import torch
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(sys.argv[4])})
sys.path.insert(0, sys.argv[1])
from helpers.serving import load_model
torch.set_num_threads(1)
model = load_model(sys.argv[2])
generator = torch.Generator().manual_seed(int(sys.argv[3]))
pixels = torch.rand(4096, 784, generator=generator)


def eager(images):
    with torch.no_grad():
        chances = torch.softmax(model(images.reshape(len(images), 784).float() / 255.0), dim=1)
        return chances.max(dim=1)


for line in sys.stdin:
    calls, batch = map(int, line.split())
    inputs = [(pixels[torch.randint(4096, (batch,), generator=generator)] * 255).round().to(torch.uint8).reshape(batch, 28, 28)
              for _ in range(calls + 1)]
    eager(inputs[0])  # warm, as the other side is: one untimed call on images of its own
    start = time.thread_time()
    for images in inputs[1:]:
        eager(images)
    print((time.thread_time() - start) / calls, flush=True)
"""


def race_against_eager(predict: Callable[[torch.Tensor], object], check: Callable[[torch.Tensor, object], float],
                       batch: int = 64, rounds: int = 150, calls: int = 1, seed: int = 0) -> dict[str, float]:
    """CPU seconds per call of eager PyTorch and of ``predict`` on batches of fresh uint8 images, in alternating rounds.

    Eager PyTorch (one thread, ``digits_and_confidence`` on a freshly loaded copy of the served model) runs in a
    child process of its own, started from a clean environment, and is timed by its thread's CPU time, so nothing
    done in this kernel can slow it. ``predict`` runs here on images it has never seen (new contents at every
    call) and is timed by the CPU time of this whole process, every thread counted, including what its threads
    spend while the answers are being checked. The two sides take turns on one CPU core (where the system allows
    pinning), and each makes one untimed call per round first, so neither is timed cold. ``predict`` must return NumPy arrays; ``check(images, answer)`` returns the share of answers that
    are right: ``agreement`` is their mean over every call, ``worst`` the lowest. Medians of the rounds are compared.
    """
    generator = torch.Generator().manual_seed(seed)
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else {0}  # macOS cannot pin
    core = max(cores)  # both sides take turns on one core: neither gains from a cache or a clock the other lacks
    child = subprocess.Popen([PYTHON, "-E", "-s", "-c", _EAGER_CHILD, KIT_ROOT, mnist_model()[1].path, str(seed), str(core)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir(),
                             env={"PATH": os.defpath, "OMP_NUM_THREADS": "1", "HOME": tempfile.gettempdir()})
    eager, ours, shares = [], [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # torch's idle pool threads would otherwise spin on this process's CPU time between rounds
    _pin(core)  # this thread only; the predictor's own threads run where they were started
    try:
        for round_ in range(rounds + 1):  # round 0 warms both sides up and is not counted
            child.stdin.write(f"{calls} {batch}\n")
            child.stdin.flush()
            seconds = child.stdout.readline()
            if not seconds:
                raise RuntimeError("the eager baseline's process ended early: this is the grader's failure, not yours")
            inputs = [fresh_images(batch, generator) for _ in range(calls + 1)]
            _numpy_answer(predict(inputs.pop()))  # warm: one untimed call on images of its own
            start = _process_cpu()
            answers = [_numpy_answer(predict(images)) for images in inputs]  # an answer is read while the clock runs
            checking = time.thread_time()  # the grader's own checking is taken out; any other thread's work is not
            shares += [check(images, answer) for images, answer in zip(inputs, answers)]
            checking = time.thread_time() - checking
            spent = (_process_cpu() - start - checking) / calls
            if round_:
                eager.append(float(seconds))
                ours.append(spent)
    finally:
        torch.set_num_threads(threads)
        _pin(*cores)
        child.stdin.close()
        child.wait(10)
    return {"eager": statistics.median(eager), "yours": statistics.median(ours),
            "speedup": statistics.median(eager) / statistics.median(ours), "agreement": statistics.mean(shares),
            "worst": min(shares)}


def _process_cpu() -> float:
    """CPU seconds this whole process has spent so far, every thread counted, the caller's running slice included.

    Under a CPU-time limit (RLIMIT_CPU, which the grading sandbox sets) Linux reads the process clock from a total
    it updates only at scheduler events, up to a tick (milliseconds) late; yielding first brings the caller's
    share up to date, so a window of a fraction of a millisecond is measured, not a stale total.
    """
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    return time.process_time()


def _pin(*cores: int) -> None:
    """Run the calling thread on ``cores`` only, where the system allows it (Linux)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)


def _numpy_answer(answer: object) -> tuple[np.ndarray, np.ndarray]:
    """``answer`` as a pair of NumPy arrays, read out now (nothing left to compute later); otherwise a clear error."""
    parts = tuple(answer) if isinstance(answer, (tuple, list)) else ()
    if len(parts) != 2 or any(type(part) is not np.ndarray for part in parts):
        raise TypeError(f"predict must return (digits, confidence) as two NumPy arrays; it returned "
                        f"{type(answer).__name__}" + (f" of {[type(part).__name__ for part in parts]}" if parts else ""))
    return parts


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


class MeteredPredictor:
    """``predictor(model)`` that records each call's batch size and the CPU seconds its thread spent in the model.

    Thread CPU time counts only the model's own work: threads that hold the GIL elsewhere make a call wait,
    not spend, so they change neither side of a comparison made with it.
    """

    def __init__(self, model: nn.Module):
        self.predict = predictor(model)
        self.sizes: list[int] = []
        self.cpu_seconds = 0.0
        self.lock = threading.Lock()

    def __call__(self, pixels: torch.Tensor) -> list[int]:
        start = time.thread_time()
        digits = self.predict(pixels)
        spent = time.thread_time() - start
        with self.lock:
            self.sizes.append(len(pixels))
            self.cpu_seconds += spent
        return digits


class Overloaded(Exception):
    """Raised by a batcher's submit when its queue is full: the server answers 503 and the client retries later."""


class Gate:
    """A predict function that blocks its first call until ``open()``; ``entered`` is set when that call began.

    The tests use it to fill a batcher's queue while the model is busy, with no timing involved.
    """

    def __init__(self, answer: Callable[[torch.Tensor], list[int]]):
        self.answer, self.calls = answer, []
        self.entered, self.released = threading.Event(), threading.Event()

    def __call__(self, pixels: torch.Tensor) -> list[int]:
        self.calls.append(len(pixels))
        if len(self.calls) == 1:
            self.entered.set()
            if not self.released.wait(30):
                raise TimeoutError("the gate was never opened")
        return self.answer(pixels)

    def open(self) -> None:
        self.released.set()

    async def wait_entered(self) -> None:
        if not await asyncio.to_thread(self.entered.wait, 30):
            raise AssertionError("predict was never called: does submit start the batcher, and run predict in a thread?")


class GatedModel(nn.Module):
    """``model``, whose first call waits until ``open()`` (``entered`` is set when it began): a model busy for as long
    as a test needs, to check that a server stays responsive meanwhile, with no timing involved."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.entered, self.released, self.calls = threading.Event(), threading.Event(), 0

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            self.released.wait(30)
        return self.model(pixels)

    def open(self) -> None:
        self.released.set()


def image_context(folder: str | Path, create_service: Callable) -> Path:
    """A build context for part 1's image: ``service.py`` (your ``create_service`` and ``app``) and ``model.pt``.

    ``model.pt`` is the served model as TorchScript, which ``torch.jit.load`` reads with torch alone.
    ``service.py`` starts with ``import json``, ``import math`` and ``import torch``, then holds the source of
    your ``create_service``, then ``app = create_service(torch.jit.load("model.pt"))``.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    model = served_model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit is in maintenance, and says so; it is still what loads with torch alone
        torch.jit.trace(model, torch.rand(2, 784)).save(str(folder / "model.pt"))
    source = inspect.getsource(create_service)
    (folder / "service.py").write_text("import json\nimport math\n\nimport torch\n\n\n" + source +
                                       '\n\napp = create_service(torch.jit.load("model.pt").eval())\n')
    return folder


@contextlib.contextmanager
def run_image(dockerfile_text: str, context: str | Path) -> Iterator[str]:
    """Run the image ``dockerfile_text`` describes (build context ``context``) as ``docker run`` would, without a container
    engine: its pip lines installed into an empty virtual environment, its files copied, its CMD started on 127.0.0.1
    in place of 0.0.0.0 and a free port in place of the one it EXPOSEs. Yields the base URL once /health answers 200.
    """
    from helpers.serving import start_image_command

    with tempfile.TemporaryDirectory(prefix="hw3-image-") as folder:
        (Path(folder) / "Dockerfile").write_text(dockerfile_text)
        with start_image_command(Path(folder) / "Dockerfile", context, Path(folder) / "run") as served:
            yield served.url


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


__all__: Sequence[str] = ["served_model", "held_out", "held_out_images", "fresh_images", "digits_and_confidence",
                          "race_against_eager", "serve_app", "wide_model", "predictor", "MeteredPredictor", "Overloaded",
                          "Gate", "GatedModel", "image_context", "run_image", "bounded_load", "expect_answers", "run_async"]
