"""Measuring language-model serving as vLLM's serving benchmark does, and the engine's features one at a time.

Serving: every system gets the same requests (chat prompts from a fixed list of questions, ``max_tokens`` drawn from a
small set) at the same arrival times (Poisson, seeded; rate ``inf`` sends them all at once: saturation). The client
notes when each token arrives. From those times: TTFT (arrival to first token), TPOT ((E2E - TTFT) / (tokens - 1)),
ITL (the gaps between tokens), E2E; over the run: requests/s, output tokens/s, and goodput, the requests per second
that met a stated SLO on TTFT and TPOT.

The systems, each an object with ``async stream(prompt, max_tokens)`` yielding token ids, and ``close()``:

* ``EngineServer``: the kit's ``Engine`` stepping in its ``AsyncEngine`` thread (continuous or static scheduler).
* ``StaticBatchServer``: what a transformers user would write: when idle, take up to B waiting requests, left-pad them
  and run ``generate`` (greedy) until every one of them has finished; tokens go out after every step.
* ``LlamaCppServer``: llama-cpp-python on the GGUF file, one sequence at a time.

The engine's features, each with and without in one run: ``paging_runs``, ``prefix_runs``, ``chunked_prefill_runs``,
``speculative_runs``.
"""
from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import AsyncIterator, Callable, Sequence

import numpy as np

from helpers.core.load import keep_torch_threads
from helpers.core.report import Report, column, format_seconds
from helpers.serving.open_loop import poisson_schedule

# Questions a chat user might ask; answers vary in length, and max_tokens cuts the long ones.
QUESTIONS = [
    "What is a GPU?",
    "Write a haiku about caches.",
    "List three prime numbers.",
    "Explain the KV cache in one sentence.",
    "What is 12 times 7?",
    "Translate 'good morning' into French.",
    "Why is the sky blue?",
    "Give me a tip for writing clean Python code.",
    "What does a compiler do?",
    "Name the planets of the solar system.",
    "How do I boil an egg?",
    "What is the capital of Japan?",
    "Describe a cat in two sentences.",
    "What is machine learning?",
    "Suggest a name for a pet turtle.",
    "How does a hash table work?",
]
MAX_TOKENS = (16, 32, 64, 128)


# --- the workload ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatRequest:
    """One request of a run: its prompt's token ids, its max_tokens, and when it arrives (seconds after the start)."""

    prompt: list[int]
    max_tokens: int
    arrival: float


def arrival_times(count: int, rate: float, seed: int = 0) -> np.ndarray:
    """``count`` arrival times (seconds): a Poisson process at ``rate`` requests/s, or all at 0 for ``rate=inf``."""
    if count < 1 or not rate > 0:
        raise ValueError(f"need count >= 1 and rate > 0 (inf: all at once); got count={count}, rate={rate}")
    return np.zeros(count) if math.isinf(rate) else poisson_schedule(rate, count, seed)


def chat_workload(prompts: Sequence[list[int]], count: int, rate: float = math.inf, seed: int = 0,
                  max_tokens: Sequence[int] = MAX_TOKENS) -> list[ChatRequest]:
    """``count`` requests cycling through ``prompts``, max_tokens drawn from ``max_tokens`` (seeded), Poisson arrivals."""
    if not prompts or not max_tokens:
        raise ValueError("chat_workload needs at least one prompt and one max_tokens value")
    budgets = np.random.default_rng(seed).choice(list(max_tokens), size=count)
    return [ChatRequest(list(prompts[i % len(prompts)]), int(budgets[i]), float(t))
            for i, t in enumerate(arrival_times(count, rate, seed))]


def chat_prompts(tokenizer, questions: Sequence[str] = QUESTIONS) -> list[list[int]]:
    """Each question as a one-turn chat in the model's template, as token ids."""
    return [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in questions]


# --- what one request saw, and what a run achieved ----------------------------------------------------------------
@dataclass
class Timeline:
    """One request as its client saw it (``time.perf_counter()`` seconds)."""

    arrival: float
    token_times: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    finished: float = math.nan
    error: str = ""

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival if self.token_times else None

    @property
    def e2e(self) -> float:
        return self.finished - self.arrival

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (vLLM's TPOT); None for answers of one token."""
        n = len(self.token_times)
        return (self.token_times[-1] - self.token_times[0]) / (n - 1) if n > 1 else None

    @property
    def itls(self) -> list[float]:
        return list(np.diff(self.token_times)) if len(self.token_times) > 1 else []


@dataclass(frozen=True)
class SLO:
    """A service-level objective per request: first token within ``ttft`` seconds, then ``tpot`` seconds per token."""

    ttft: float
    tpot: float

    def met(self, timeline: Timeline) -> bool:
        if timeline.error or timeline.ttft is None or timeline.ttft > self.ttft:
            return False
        return timeline.tpot is None or timeline.tpot <= self.tpot

    def __str__(self) -> str:
        return f"TTFT <= {self.ttft:g} s and TPOT <= {self.tpot * 1e3:g} ms"


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


@dataclass
class ServingRow:
    """One system under one arrival pattern: vLLM's serving-benchmark figures."""

    system: str = column("system")
    load: str = column("arrivals")
    requests: int = column("requests")
    seconds: float | None = column("duration (s)", ".1f")
    request_rate: float | None = column("req/s", ".2f")
    output_tps: float | None = column("output tok/s", ".1f")
    ttft_p50: float | None = column("TTFT p50", format_seconds)
    ttft_p99: float | None = column("TTFT p99", format_seconds)
    tpot_p50: float | None = column("TPOT p50", format_seconds)
    itl_p50: float | None = column("ITL p50", format_seconds)
    itl_p99: float | None = column("ITL p99", format_seconds)
    goodput: float | None = column("goodput (req/s)", ".2f")
    note: str = column("note")
    output_tokens: int = 0
    errors: int = 0


def summarise(system: str, load: str, timelines: Sequence[Timeline], slo: SLO, note: str = "") -> ServingRow:
    """The row for one run: throughput over the run (first arrival to last answer), latency percentiles, goodput."""
    if not timelines:
        raise ValueError("no request was run")
    ok = [t for t in timelines if not t.error]
    duration = max(t.finished for t in timelines) - min(t.arrival for t in timelines)
    tokens = sum(len(t.tokens) for t in ok)
    ttfts = [t.ttft for t in ok if t.ttft is not None]
    tpots = [t.tpot for t in ok if t.tpot is not None]
    itls = [gap for t in ok for gap in t.itls]
    errors = len(timelines) - len(ok)
    if errors:
        note = "; ".join(filter(None, [note, f"{errors} failed: {next(t.error for t in timelines if t.error)}"]))
    return ServingRow(system, load, len(timelines), duration, len(ok) / duration, tokens / duration,
                      percentile(ttfts, 50), percentile(ttfts, 99), percentile(tpots, 50), percentile(itls, 50),
                      percentile(itls, 99), sum(slo.met(t) for t in ok) / duration, note, tokens, errors)


def absent_row(system: str, load: str, why: str) -> ServingRow:
    """The row of a system that could not run here, saying why."""
    return ServingRow(system, load, 0, None, None, None, None, None, None, None, None, None, f"absent: {why}")


class ServingReport(Report):
    title = "Serving: the same requests at the same arrival times"


# --- driving a system ---------------------------------------------------------------------------------------------
def drive(server, workload: Sequence[ChatRequest], timeout: float = 600.0) -> list[Timeline]:
    """Send each request of ``workload`` to ``server`` at its arrival time, whatever the earlier answers; collect what
    each client saw. Times count from the scheduled arrival (a late client or a busy server is in the figures)."""
    from helpers.serving.load import _run  # runs from plain code and from a notebook's running event loop

    async def run() -> list[Timeline]:
        start = time.perf_counter() + 0.01
        timelines = [Timeline(start + r.arrival) for r in workload]

        async def one(request: ChatRequest, timeline: Timeline) -> None:
            try:
                async with asyncio.timeout(timeout):
                    async for token in server.stream(request.prompt, request.max_tokens):
                        timeline.token_times.append(time.perf_counter())
                        timeline.tokens.append(token)
            except Exception as error:  # a failed request is counted in its row, never stops the run
                timeline.error = f"{type(error).__name__}: {error}"[:300]
            timeline.finished = time.perf_counter()

        tasks = []
        for request, timeline in sorted(zip(workload, timelines), key=lambda pair: pair[1].arrival):
            delay = timeline.arrival - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(request, timeline)))   # requests due together go in together, in order
        await asyncio.gather(*tasks)
        return timelines

    return _run(run())


class EngineServer:
    """The kit's engine, stepping in its ``AsyncEngine`` thread; requests go in through ``AsyncEngine.generate``."""

    def __init__(self, engine):
        from helpers.serving.llm_engine import AsyncEngine

        self.engine = engine
        self.runner = AsyncEngine(engine)

    async def stream(self, prompt: list[int], max_tokens: int) -> AsyncIterator[int]:
        async for token in self.runner.generate(prompt, max_tokens):
            yield token

    def close(self) -> None:
        self.runner.stop()


@dataclass
class _Job:
    """A request inside a threaded server: its tokens go to the client's queue through ``send``."""

    prompt: list[int]
    max_tokens: int
    eos_id: int
    send: Callable[[object], None]
    output: list[int] = field(default_factory=list)
    done: bool = False

    def give(self, token: int) -> None:
        if self.done:
            return
        self.output.append(token)
        self.send(token)
        if token == self.eos_id or len(self.output) >= self.max_tokens:
            self.finish()

    def finish(self, error: Exception | None = None) -> None:
        if not self.done:
            self.done = True
            self.send(error)


class _ThreadedServer:
    """Serves its queue in a thread of its own, ``batch_size`` requests at a time, each batch to its end: when idle it
    waits up to ``batch_window`` seconds after a request arrives for the batch to fill."""

    def __init__(self, batch_size: int, eos_id: int, batch_window: float = 0.01):
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        self.batch_size, self.eos_id, self.batch_window = batch_size, eos_id, batch_window
        self._queue: deque[_Job] = deque()
        self._wake = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name=type(self).__name__, daemon=True)
        self._thread.start()

    async def stream(self, prompt: list[int], max_tokens: int) -> AsyncIterator[int]:
        loop = asyncio.get_running_loop()
        answers: asyncio.Queue = asyncio.Queue()
        job = _Job(list(prompt), max_tokens, self.eos_id, lambda item: loop.call_soon_threadsafe(answers.put_nowait, item))
        with self._wake:
            self._queue.append(job)
            self._wake.notify()
        while (item := await answers.get()) is not None:
            if isinstance(item, Exception):
                raise item
            yield item

    def _loop(self) -> None:
        keep_torch_threads()  # the count the process set, not OpenMP's default for a new thread
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._queue or self._stopped)
                # requests that arrive together (within batch_window seconds) share a batch, as in a batching server
                self._wake.wait_for(lambda: len(self._queue) >= self.batch_size or self._stopped, self.batch_window)
                if self._stopped:
                    return
                jobs = [self._queue.popleft() for _ in range(min(self.batch_size, len(self._queue)))]
            try:
                self.serve(jobs)
            except Exception as error:  # the clients of this batch see the error; the server goes on
                for job in jobs:
                    job.finish(RuntimeError(f"{type(error).__name__}: {error}"))
            for job in jobs:
                job.finish()

    def serve(self, jobs: list[_Job]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(30)


def _step_clock(on_step: Callable[[list[int]], list[bool]]):
    """A transformers stopping criterion called after every generated token: hands the new column to ``on_step``,
    which says which rows are done (each request's own max_tokens and end of sequence)."""
    import torch
    from transformers import StoppingCriteria

    class StepClock(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):                 # input_ids: (batch, prompt + generated)
            done = on_step(input_ids[:, -1].tolist())
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return StepClock()


def left_padded(prompts: Sequence[list[int]], pad_id: int, device="cpu"):
    """(input_ids, attention_mask), each (batch, longest prompt): shorter prompts padded on the left, as decoder-only
    generation needs (every row's next token then sits in the last column)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt)
        mask[row, width - len(prompt):] = 1
    return ids.to(device), mask.to(device)


class StaticBatchServer(_ThreadedServer):
    """transformers' ``generate`` as a static-batch server: when idle, up to ``batch_size`` waiting requests are
    left-padded into one batch, run greedily until each has reached end of sequence or its own max_tokens, their
    tokens sent after every step. Requests that arrive meanwhile wait for the whole batch to end."""

    def __init__(self, model, batch_size: int, eos_id: int = 2):
        self.model = model.eval()
        super().__init__(batch_size, eos_id)

    def serve(self, jobs: list[_Job]) -> None:
        import torch

        def on_step(column: list[int]) -> list[bool]:
            for job, token in zip(jobs, column):
                job.give(token)
            return [job.done for job in jobs]

        ids, mask = left_padded([j.prompt for j in jobs], self.eos_id, self.model.device)
        with torch.inference_mode():
            self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(j.max_tokens for j in jobs),
                                do_sample=False, eos_token_id=self.eos_id, pad_token_id=self.eos_id,
                                stopping_criteria=[_step_clock(on_step)])


class LlamaCppServer(_ThreadedServer):
    """llama-cpp-python serving one sequence at a time, greedy (``temp=0``)."""

    def __init__(self, llm, eos_id: int = 2):
        self.llm = llm
        super().__init__(1, eos_id)

    def serve(self, jobs: list[_Job]) -> None:
        (job,) = jobs
        for token in self.llm.generate(job.prompt, temp=0.0, reset=True):
            job.give(token)
            if job.done:
                break


# llama.cpp's own CPU kernels may use extra weight layouts (AMX tiles, repacked blocks); where those crash the process
# (AMX does on some virtual machines), a child process finds out first and the bench turns them off.
_PROBE = """
import sys, llama_cpp, llama_cpp.llama_cpp as api
default = api.llama_model_default_params
def params():
    p = default(); p.use_extra_bufts = sys.argv[2] == "1"; return p
api.llama_model_default_params = params
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=256, n_threads=1, verbose=False)
next(llm.generate([1, 2, 3], temp=0.0))
"""


@contextlib.contextmanager
def _llama_cpp_params(extra_buffers: bool):
    """llama-cpp-python builds its model parameters from ``llama_model_default_params()``: set ``use_extra_bufts``."""
    import llama_cpp.llama_cpp as api

    default = api.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = extra_buffers
        return p

    api.llama_model_default_params = params
    try:
        yield
    finally:
        api.llama_model_default_params = default


def load_llama_cpp(path: Path, threads: int, context: int = 4096):
    """(``llama_cpp.Llama`` on the GGUF file with ``threads`` threads, a note) or (None, why it is absent)."""
    try:
        import llama_cpp
    except ImportError:
        missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
        where = f"this machine lacks {' and '.join(missing)}" if missing else "a C++ compiler and cmake are here"
        return None, f"llama-cpp-python is not installed ({where}; `make llama-cpp` builds it from its sdist)"
    crashes = []
    for extra in (True, False):
        probe = subprocess.run([sys.executable, "-c", _PROBE, str(path), "1" if extra else "0"], capture_output=True, timeout=300)
        if probe.returncode == 0:
            break
        crashes.append(f"exit {probe.returncode}")
    else:
        return None, f"llama.cpp {llama_cpp.__version__} crashes on this machine ({', '.join(crashes)})"
    with _llama_cpp_params(extra):
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=context, n_batch=512, n_threads=threads, n_threads_batch=threads,
                              n_gpu_layers=0, seed=0, verbose=False)
    note = "" if extra else f"extra weight layouts (AMX, repacking) off: they crashed here ({crashes[0]})"
    return llm, note


# --- batch-1 decode speed -----------------------------------------------------------------------------------------
def decode_rate(token_times: Sequence[float]) -> float:
    """Tokens per second after the first (which prefill produced): (n - 1) / (last - first)."""
    if len(token_times) < 2 or token_times[-1] <= token_times[0]:
        raise ValueError(f"need at least two tokens at distinct times to time decoding, got {len(token_times)}")
    return (len(token_times) - 1) / (token_times[-1] - token_times[0])


def engine_decode_times(model, prompt: list[int], tokens: int) -> list[float]:
    """Token times of the kit's engine generating exactly ``tokens`` tokens for one prompt (end of sequence ignored)."""
    from helpers.serving.llm_engine import Engine

    engine = Engine(model, max_batch=1, eos_ids=())
    request = engine.add(prompt, tokens)
    while engine.has_work():
        engine.step()
    return request.token_times


def transformers_decode_times(model, prompt: list[int], tokens: int) -> list[float]:
    """Token times of transformers' ``generate`` (greedy, batch 1, its default dynamic KV cache), exactly ``tokens``."""
    import torch

    times: list[float] = []

    def on_step(column: list[int]) -> list[bool]:
        times.append(time.perf_counter())
        return [False]

    ids = torch.tensor([prompt], device=model.device)
    with torch.inference_mode():
        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, min_new_tokens=tokens,
                       do_sample=False, pad_token_id=2, stopping_criteria=[_step_clock(on_step)])
    return times


def llama_cpp_decode_times(llm, prompt: list[int], tokens: int) -> list[float]:
    """Token times of llama.cpp generating ``tokens`` tokens greedily for one prompt (end of sequence ignored)."""
    llm.reset()
    times: list[float] = []
    for _ in llm.generate(prompt, temp=0.0, reset=True):
        times.append(time.perf_counter())
        if len(times) >= tokens:
            break
    return times


@dataclass
class DecodeRow:
    system: str = column("system")
    tokens: int = column("tokens")
    rate: float | None = column("decode tok/s", ".1f")
    ms_per_token: float | None = column("ms/token", ".1f")
    vs_transformers: float | None = column("vs transformers", ".2f")
    note: str = column("note")
    runs: list[float] = field(default_factory=list)


class DecodeReport(Report):
    title = "Batch-1 decode: one prompt, greedy, tokens after the first"


# --- engine features, each with and without ------------------------------------------------------------------------
def run_offline(engine, watch: Callable[[], None] | None = None) -> None:
    """Step ``engine`` until it has no work, calling ``watch()`` after every step."""
    while engine.has_work():
        engine.step()
        if watch:
            watch()


@dataclass
class PagingRow:
    setup: str = column("allocation")
    blocks: int = column("KV blocks")
    max_running: int = column("max running")
    mean_running: float = column("mean running", ".1f")
    preemptions: int = column("preemptions")
    steps: int = column("steps")
    output_tps: float = column("output tok/s", ".1f")
    identical: str = column("greedy output = unconstrained engine")
    outputs: list[list[int]] = field(default_factory=list, repr=False)


class PagingReport(Report):
    title = "Paging: sequences running at one KV budget"


def paging_runs(model, prompts: Sequence[list[int]], max_tokens: int, num_blocks: int = 64, block_size: int = 16,
                max_batch: int = 16, small_pool: int | None = None) -> PagingReport:
    """The same requests under one KV budget with ``allocation="paged"`` and ``"reserved"`` (blocks for prompt +
    max_tokens at admission): how many run at once. With ``small_pool`` also a pool too small for them all at once
    (it must preempt) checked against an engine with room to spare."""
    from helpers.serving.llm_engine import Engine

    reference = Engine(model, max_batch=max_batch, num_blocks=4096 // block_size + 1, block_size=block_size)
    expected = reference.generate([list(p) for p in prompts], max_tokens)
    setups = [("paged", num_blocks), ("reserved", num_blocks)] + ([("paged", small_pool)] if small_pool else [])
    rows = []
    for allocation, blocks in setups:
        engine = Engine(model, max_batch=max_batch, num_blocks=blocks, block_size=block_size, allocation=allocation)
        requests = [engine.add(list(p), max_tokens) for p in prompts]
        running: list[int] = []
        start = time.perf_counter()
        run_offline(engine, lambda: running.append(len(engine.running)))
        seconds = time.perf_counter() - start
        outputs = [r.output for r in requests]
        label = allocation if blocks == num_blocks else f"{allocation}, pool too small"
        rows.append(PagingRow(label, blocks, max(running), float(np.mean(running)), engine.stats.preemptions, engine.stats.steps,
                              sum(map(len, outputs)) / seconds, "yes" if outputs == expected else "NO", outputs))
    notes = [f"{len(prompts)} requests at once, max_tokens {max_tokens}, blocks of {block_size} tokens, max_batch {max_batch}; "
             f"answers end at end of sequence or max_tokens. 'running': len(engine.running) after each step. Reserved "
             "allocation takes blocks for prompt + max_tokens at admission, as contiguous per-request buffers must."]
    return PagingReport(rows, notes)


@dataclass
class PrefixRow:
    setup: str = column("prefix caching")
    prompt_tokens: int = column("prompt tokens")
    prefill_tokens: int = column("prefill tokens computed")
    hit_rate: float = column("hit rate", ".0%")
    ttft_p50: float | None = column("TTFT p50", format_seconds)
    output_tps: float | None = column("output tok/s", ".1f")
    identical: str = column("output = without caching")
    outputs: list[list[int]] = field(default_factory=list, repr=False)


class PrefixReport(Report):
    title = "Prefix caching: requests sharing a long system prompt"


def prefix_runs(model, prompts: Sequence[list[int]], max_tokens: int, rate: float, seed: int = 0,
                **engine_options) -> PrefixReport:
    """The same Poisson arrivals of ``prompts`` (one shared system prompt, different questions) served with prefix
    caching off and on: prompt tokens computed, hit rate (cached / looked-up prompt tokens), median TTFT."""
    from helpers.serving.llm_engine import Engine

    workload = [ChatRequest(list(p), max_tokens, float(t)) for p, t in zip(prompts, arrival_times(len(prompts), rate, seed))]
    rows = []
    for caching in (False, True):
        server = EngineServer(Engine(model, prefix_caching=caching, **engine_options))
        try:
            timelines = drive(server, workload)
        finally:
            server.close()
        stats, outputs = server.engine.stats, [t.tokens for t in timelines]
        row = summarise("", "", timelines, SLO(math.inf, math.inf))
        rows.append(PrefixRow("on" if caching else "off", stats.prompt_tokens, stats.prefill_tokens,
                              stats.prefix_hits / stats.prefix_queries if stats.prefix_queries else 0.0,
                              row.ttft_p50, row.output_tps, "", outputs))
    for row in rows:
        row.identical = "yes" if row.outputs == rows[0].outputs else "NO"
    shared = _shared_prefix(prompts)
    notes = [f"{len(prompts)} requests, Poisson arrivals at {rate:g}/s (seed {seed}), max_tokens {max_tokens}; the prompts "
             f"share their first {shared} tokens (system prompt); prompts average {np.mean([len(p) for p in prompts]):.0f} tokens."]
    return PrefixReport(rows, notes)


def _shared_prefix(prompts: Sequence[list[int]]) -> int:
    first = prompts[0]
    return min(next((i for i, (a, b) in enumerate(zip(first, p)) if a != b), min(len(first), len(p))) for p in prompts[1:]) \
        if len(prompts) > 1 else len(first)


@dataclass
class ChunkRow:
    setup: str = column("chunk_size")
    itl_before: float | None = column("streams' ITL p50 before", format_seconds)
    itl_p50: float | None = column("ITL p50 during", format_seconds)
    itl_p99: float | None = column("ITL p99 during", format_seconds)
    itl_max: float | None = column("ITL max during", format_seconds)
    long_ttft: float | None = column("long prompt's TTFT", format_seconds)
    steps: int = column("steps during")


class ChunkReport(Report):
    title = "Chunked prefill: a long prompt arrives while streams decode"


def arrival_gaps(streams: Sequence[Sequence[float]], start: float, end: float) -> list[float]:
    """Inter-token gaps of ``streams`` (each a list of token times) that overlap the window from ``start`` to ``end``
    (a gap that begins at ``end`` or later is after it)."""
    return [b - a for times in streams for a, b in zip(times, times[1:]) if b > start and a < end]


def chunked_prefill_runs(model, stream_prompts: Sequence[list[int]], long_prompt: list[int], chunk_sizes: Sequence[int | None],
                         stream_tokens: int, arrive_after: int) -> ChunkReport:
    """Streams decode ``stream_tokens`` tokens each; after ``arrive_after`` of them ``long_prompt`` arrives. For each
    chunk size, the streams' inter-token latency while the long prompt is prefilled (arrival to its first token)."""
    from helpers.serving.llm_engine import Engine

    rows = []
    for chunk in chunk_sizes:
        engine = Engine(model, chunk_size=chunk, eos_ids=())
        streams = [engine.add(list(p), stream_tokens) for p in stream_prompts]
        while min(len(s.output) for s in streams) < arrive_after:
            engine.step()
        steps_before = engine.stats.steps
        long = engine.add(list(long_prompt), 1)
        while long.first_token_at is None:
            engine.step()
        steps = engine.stats.steps - steps_before
        run_offline(engine)
        times = [s.token_times for s in streams]
        during = arrival_gaps(times, long.arrived, long.first_token_at)
        before = [b - a for t in times for a, b in zip(t, t[1:]) if b <= long.arrived]
        rows.append(ChunkRow("None (whole prompt)" if chunk is None else str(chunk), percentile(before, 50),
                             percentile(during, 50), percentile(during, 99), max(during, default=None),
                             long.first_token_at - long.arrived, steps))
    notes = [f"{len(stream_prompts)} streams decode {stream_tokens} tokens each; after {arrive_after} a {len(long_prompt)}-token "
             "prompt arrives. 'during': gaps between the streams' tokens from its arrival to its first token."]
    return ChunkReport(rows, notes)


@dataclass
class SpeculativeRow:
    task: str = column("prompt")
    tokens: int = column("tokens")
    baseline_tps: float = column("greedy tok/s", ".1f")
    speculative_tps: float = column("speculative tok/s", ".1f")
    speedup: float = column("speed-up", ".2f")
    acceptance: float | None = column("acceptance", ".0%")
    per_step: float = column("tokens/step", ".2f")
    identical: str = column("output identical")


class SpeculativeReport(Report):
    title = "Speculative decoding: n-gram prompt lookup against the cached greedy loop (batch 1)"


def speculative_runs(model, prompts: dict[str, list[int]], max_tokens: int, k: int = 4, rounds: int = 2) -> SpeculativeReport:
    """Each prompt alone, greedy, through the same engine with ``speculate=0`` and ``speculate=k``, taking turns for
    ``rounds``: the best decode tokens/s of each, the acceptance rate (accepted / drafted), tokens per step."""
    from helpers.serving.llm_engine import Engine

    rows = []
    for task, prompt in prompts.items():
        best = {0: 0.0, k: 0.0}
        outputs, stats = {}, {}
        for _ in range(rounds):
            for speculate in (0, k):
                engine = Engine(model, max_batch=1, speculate=speculate)
                request = engine.add(list(prompt), max_tokens)
                run_offline(engine)
                seconds = request.finished_at - request.first_token_at
                best[speculate] = max(best[speculate], (len(request.output) - 1) / seconds if seconds > 0 else 0.0)
                outputs[speculate], stats[speculate] = request.output, engine.stats
        drafted = stats[k].draft_tokens
        rows.append(SpeculativeRow(task, len(outputs[k]), best[0], best[k], best[k] / best[0] if best[0] else math.nan,
                                   stats[k].accepted_tokens / drafted if drafted else None,
                                   stats[k].generated_tokens / stats[k].steps, "yes" if outputs[0] == outputs[k] else "NO"))
    notes = [f"Engine(speculate={k}) against the same engine with speculate=0 (the cached greedy loop), batch 1, "
             f"max_tokens {max_tokens}; best of {rounds} alternating runs; tok/s over the tokens after the first."]
    return SpeculativeReport(rows, notes)
