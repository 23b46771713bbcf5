"""The kit's LLM serving engine: a paged KV cache, continuous batching, preemption, prefix caching, chunked prefill and
n-gram speculative decoding, over SmolLM2 (``helpers.serving.llama``). ``make serve-llm`` and lecture 8b run it.

* ``BlockPool``: the KV cache's blocks, shared by reference count; a full block is remembered by the hash of every
  token up to its end, so a later prompt with the same prefix reuses it (prefix caching).
* ``Engine.step()``: one forward pass over a token budget. Decoding sequences first (one token each, or one plus
  n-gram drafts to verify), then prompt chunks (chunked prefill), then new admissions, which start only when the
  pool holds the blocks of what they compute in this step. Blocks are taken as a sequence grows; when none is free
  the most recently admitted sequence is preempted (its blocks freed, its tokens recomputed later; greedy output is
  unchanged).
* ``allocation="reserved"`` instead takes blocks for prompt + max_tokens at admission, as a server with contiguous
  per-request buffers must: the comparison paging is measured against.
* ``AsyncEngine`` steps an ``Engine`` in a thread of its own for an asyncio server.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import torch

from helpers.core.load import keep_torch_threads
from helpers.serving.llama import Batch, Llama

SCHEDULERS = ("continuous", "static")
ALLOCATIONS = ("paged", "reserved")


class BlockPool:
    """``num_blocks`` KV blocks; each in use has a reference count, and a full one may be found again by its prefix hash.

    Free blocks wait in least-recently-freed order: a freed block keeps its cached content (and its hash) until it is
    taken again, so a popular prefix survives while the pool has room.
    """

    def __init__(self, num_blocks: int):
        self.num_blocks = num_blocks
        self.refs = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_of: dict[int, int] = {}
        self.by_hash: dict[int, int] = {}

    @property
    def used(self) -> int:
        return self.num_blocks - len(self.free)

    def take(self) -> int | None:
        """A free block (forgetting what it cached), or None when every block is in use."""
        if not self.free:
            return None
        block, _ = self.free.popitem(last=False)
        if block in self.hash_of:
            del self.by_hash[self.hash_of.pop(block)]
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        if self.refs[block] == 0:
            del self.free[block]
        self.refs[block] += 1

    def release(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            self.free[block] = None

    def remember(self, block: int, prefix_hash: int) -> None:
        if prefix_hash not in self.by_hash:
            self.by_hash[prefix_hash] = block
            self.hash_of[block] = prefix_hash

    def lookup(self, prefix_hash: int) -> int | None:
        return self.by_hash.get(prefix_hash)


def ngram_draft(tokens: list[int], k: int, max_n: int = 3) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the last n tokens (n = max_n..1); propose what followed it."""
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                return tokens[start + n:start + n + k]
    return []


@dataclass
class Request:
    """One generation request, its state in the engine, and its timeline (``time.perf_counter()`` seconds)."""

    id: int
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    on_token: Callable[["Request", int | None], None] | None = None  # each new token, then None when finished
    output: list[int] = field(default_factory=list)
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    finish_reason: str | None = None            # "stop" (end of sequence), "length" (max_tokens) or "abort"
    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)   # prefix hash of each full block, in order
    computed: int = 0                           # tokens whose keys and values are in the cache
    cached_tokens: int = 0                      # of the prompt, found in the prefix cache at admission
    preemptions: int = 0
    generator: torch.Generator | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


def sample(logits: torch.Tensor, request: Request) -> int:
    """Greedy at temperature 0; else a draw from softmax(logits / T) cut to the top_p nucleus, seeded per request."""
    if request.temperature <= 0:
        return int(logits.argmax())
    if request.generator is None:
        request.generator = torch.Generator(device=logits.device)
        request.generator.manual_seed(request.seed if request.seed is not None else request.id)
    probs = torch.softmax(logits.float() / request.temperature, dim=-1)
    if request.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs >= request.top_p    # tokens after the nucleus is full
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
    return int(torch.multinomial(probs, 1, generator=request.generator))


@dataclass
class EngineStats:
    """Counters since the engine started (what /metrics reports)."""

    steps: int = 0
    prompt_tokens: int = 0          # prompt tokens of admitted requests
    prefill_tokens: int = 0         # tokens run through the model to fill the cache (recomputation included)
    generated_tokens: int = 0
    prefix_queries: int = 0         # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0            # of which found there
    preemptions: int = 0
    preempted_tokens: int = 0       # cached tokens whose keys and values preemption threw away
    draft_tokens: int = 0
    accepted_tokens: int = 0
    finished: dict[str, int] = field(default_factory=dict)


def admit(engine, budget):
    """Move waiting requests into the running batch, first come first served, while the batch, the step's prompt-token
    budget and the KV pool allow. Static batching admits only into an idle engine. A request starts only when the
    pool has the blocks of what it computes in this step (paging: this step's part of its prompt; reservation: the
    whole prompt + max_tokens), and takes them at once, so the step cannot evict it before it computed anything."""
    if engine.scheduler == "static" and engine.running:
        return  # request-level batching: nobody joins a batch in flight
    while engine.waiting and len(engine.running) < engine.max_batch and budget > 0:
        request = engine.waiting[0]
        found = engine.cached_prefix(request) if engine.prefix_caching else []   # (block, hash) of a prefix computed before
        start = len(found) * engine.block_size                   # tokens whose keys the prefix cache already holds
        if engine.allocation == "reserved":
            room = len(request.prompt) + request.max_tokens       # contiguous reservation: the whole answer's room
        else:
            room = start + min(len(request.tokens) - start, budget)   # paging: what this step computes of it
        in_use = sum(engine.pool.refs[block] > 0 for block, _ in found)   # shared with a running sequence: no free block
        if len(engine.pool.free) < math.ceil(room / engine.block_size) - in_use:
            return  # wait until the pool holds this step's part
        engine.waiting.popleft()
        if engine.prefix_caching:
            engine.reuse_prefix(request, found)                   # share those blocks; nothing is copied
        engine.grow(request, room)
        if request.preemptions == 0:
            engine.stats.prompt_tokens += len(request.prompt)
        engine.running.append(request)
        budget -= len(request.tokens) - request.computed


def accept_drafts(engine, request, new, rows, now):
    """Verify drafts (greedy): keep those the model agrees with, then the model's own next token; roll back the rest.
    ``new`` is the last token and the drafts; ``rows`` the logits after each of them, one forward pass."""
    drafts, choices = new[1:], rows.argmax(-1).tolist()   # choices[i]: the model's token after new[0..i]
    accepted = 0
    while accepted < len(drafts) and drafts[accepted] == choices[accepted]:
        accepted += 1
    engine.stats.draft_tokens += len(drafts)
    engine.stats.accepted_tokens += accepted
    request.computed += 1 + accepted              # the last token and the accepted drafts have their keys cached
    engine.trim(request)                          # rejected drafts' keys and values: their blocks go back
    engine.remember_full_blocks(request)
    produced = 0
    for token in choices[:accepted + 1]:
        if request.done:
            break
        produced += engine.emit(request, token, now)
    return produced


def use_definitions(**definitions) -> None:
    """Make every engine call these definitions instead of this module's own (``admit=``, ``accept_drafts=``,
    ``ngram_draft=``, ``BlockPool=``): how a lecture's edited cells become what its engines run."""
    unknown = sorted(set(definitions) - {"admit", "accept_drafts", "ngram_draft", "BlockPool"})
    if unknown:
        raise ValueError(f"the engine has no replaceable definition named {unknown}: use admit, accept_drafts, "
                         "ngram_draft or BlockPool")
    globals().update(definitions)


class Engine:
    """Requests in, tokens out, one ``step()`` at a time."""

    def __init__(self, model: Llama, scheduler: str = "continuous", max_batch: int = 16, num_blocks: int = 512,
                 block_size: int = 16, chunk_size: int | None = 256, prefix_caching: bool = True,
                 allocation: str = "paged", speculate: int = 0, eos_ids: tuple[int, ...] = (2,)):
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        if allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {allocation!r}")
        self.model, self.scheduler, self.max_batch, self.allocation = model.eval(), scheduler, max_batch, allocation
        self.block_size, self.chunk_size, self.prefix_caching = block_size, chunk_size, prefix_caching
        self.speculate, self.eos_ids = speculate, tuple(eos_ids)
        config, weight = model.config, model.embed.weight
        self.context = config.context
        self.pool = BlockPool(num_blocks)
        # keys and values of every layer: (layers, slots, kv_heads, head_dim); slot = block * block_size + offset
        self._kv_shape = (config.layers, num_blocks * block_size, config.kv_heads, config.head_dim)
        self._kv: tuple[torch.Tensor, torch.Tensor] | None = None   # made at first use: see k_cache
        self.device = weight.device
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.inbox: deque[tuple[str, Request]] = deque()    # adds and aborts from other threads, applied at each step
        self.stats = EngineStats()
        self._ids = itertools.count()

    @property
    def k_cache(self) -> torch.Tensor:
        """Every layer's keys, (layers, slots, kv_heads, head_dim), zeroed at first use, which is normally the first step.

        Zeroing is a parallel region, and a thread that runs one keeps an OpenMP team as long as it lives; the engine's
        stepping thread then ran at half speed on 2 cores (helpers.core.load.in_fresh_thread). Made here, the cache is
        zeroed by the thread that steps, whichever thread built the engine."""
        return self._caches()[0]

    @property
    def v_cache(self) -> torch.Tensor:
        """Every layer's values, shaped as ``k_cache``."""
        return self._caches()[1]

    def _caches(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._kv is None:
            weight = self.model.embed.weight
            keys = torch.zeros(self._kv_shape, dtype=weight.dtype, device=weight.device)
            self._kv = keys, torch.zeros_like(keys)
        return self._kv

    # --- requests in -------------------------------------------------------------------------------------------
    @property
    def capacity_tokens(self) -> int:
        return self.pool.num_blocks * self.block_size

    def check(self, prompt: list[int], max_tokens: int) -> None:
        """Raise ValueError saying what is wrong with a request this engine cannot serve."""
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > self.context:
            raise ValueError(f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) is longer than the model's "
                             f"context of {self.context} tokens: shorten the prompt or lower max_tokens")
        if len(prompt) + max_tokens > self.capacity_tokens:
            raise ValueError(f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) is more than this server's "
                             f"KV cache holds ({self.capacity_tokens} tokens): shorten the prompt or lower max_tokens")
        vocab = self.model.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt tokens must be in 0..{vocab - 1}")

    def add(self, prompt: list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
            seed: int | None = None, on_token: Callable[[Request, int | None], None] | None = None) -> Request:
        """Queue a request (safe from any thread: it joins at the next step)."""
        self.check(prompt, max_tokens)
        request = Request(next(self._ids), list(prompt), max_tokens, temperature, top_p, seed, on_token)
        self.inbox.append(("add", request))
        return request

    def abort(self, request: Request) -> None:
        """Stop a request and free its blocks at the next step (a client that went away)."""
        self.inbox.append(("abort", request))

    def abort_all(self) -> None:
        """End every request, queued or running, as aborted and free every block (after a failed step)."""
        now = time.perf_counter()
        pending = [r for kind, r in self.inbox if kind == "add"] + list(self.waiting) + list(self.running)
        self.inbox.clear()
        self.waiting.clear()
        self.running.clear()
        for request in pending:
            if request.done:  # finished in the step that failed: freed and told now
                self._free(request)
                self._tell_end(request)
            else:
                self._finish(request, "abort", now)  # no longer running: freed and told at once

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.inbox)

    @property
    def kv_usage(self) -> float:
        return self.pool.used / self.pool.num_blocks

    # --- blocks ------------------------------------------------------------------------------------------------
    def _block_hash(self, tokens: list[int], index: int, parent: int) -> int:
        start = index * self.block_size
        return hash((parent, tuple(tokens[start:start + self.block_size])))

    def _prefix_hash(self, request: Request, index: int) -> int:
        return self._block_hash(request.tokens, index, request.hashes[index - 1] if index else 0)

    def cached_prefix(self, request: Request) -> list[tuple[int, int]]:
        """(block, prefix hash) of each block of the longest cached prefix of a waiting request's tokens (whole blocks,
        leaving a token to compute); nothing is taken."""
        found: list[tuple[int, int]] = []
        for index in range((len(request.tokens) - 1) // self.block_size):
            prefix_hash = self._block_hash(request.tokens, index, found[-1][1] if found else 0)
            block = self.pool.lookup(prefix_hash)
            if block is None:
                break
            found.append((block, prefix_hash))
        return found

    def reuse_prefix(self, request: Request, found: list[tuple[int, int]] | None = None) -> None:
        """Share the blocks of the request's longest cached prefix (``found``: ``cached_prefix(request)``)."""
        self.stats.prefix_queries += len(request.prompt)
        for block, prefix_hash in self.cached_prefix(request) if found is None else found:
            self.pool.share(block)
            request.blocks.append(block)
            request.hashes.append(prefix_hash)
        request.computed = request.cached_tokens = len(request.blocks) * self.block_size
        self.stats.prefix_hits += request.cached_tokens

    def grow(self, request: Request, tokens: int) -> bool:
        """Blocks for the first ``tokens`` positions of ``request``, taking free ones; False if the pool ran out."""
        while len(request.blocks) * self.block_size < tokens:
            block = self.pool.take()
            if block is None:
                return False
            request.blocks.append(block)
        return True

    def _free(self, request: Request) -> None:
        for block in reversed(request.blocks):
            self.pool.release(block)
        request.blocks, request.hashes = [], []

    def trim(self, request: Request) -> None:
        """Give back blocks past the computed tokens (speculated tokens that were rejected)."""
        keep = math.ceil(request.computed / self.block_size)
        while len(request.blocks) > keep:
            self.pool.release(request.blocks.pop())

    def remember_full_blocks(self, request: Request) -> None:
        if not self.prefix_caching:
            return
        while len(request.hashes) < request.computed // self.block_size:
            index = len(request.hashes)
            request.hashes.append(self._prefix_hash(request, index))
            self.pool.remember(request.blocks[index], request.hashes[-1])

    def _preempt(self, request: Request) -> None:
        """Recompute-style preemption: free every block; the request waits at the front and is prefilled again."""
        self.running.remove(request)
        self._free(request)
        self.stats.preempted_tokens += request.computed
        request.computed = 0
        request.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(request)

    # --- scheduling ----------------------------------------------------------------------------------------------
    def _apply_inbox(self) -> None:
        while self.inbox:
            kind, request = self.inbox.popleft()
            if kind == "add":
                self.waiting.append(request)
            elif not request.done:
                if request in self.running:
                    self.running.remove(request)
                elif request in self.waiting:
                    self.waiting.remove(request)
                self._finish(request, "abort", time.perf_counter())

    def _plan(self) -> list[tuple[Request, list[int], bool]]:
        """What this step computes: (request, its new tokens, whether they are drafts to verify). The running sequences
        first (one short of a block preempts the most recently admitted), then admissions, which get only the token
        budget and the blocks left."""
        budget = self.chunk_size if self.chunk_size else math.inf
        plan: list[tuple[Request, list[int], bool]] = []
        for request in list(self.running):
            if request in self.running:  # (not preempted to make room for an earlier one)
                budget = self._schedule(request, budget, plan)
        admitted = len(self.running)
        admit(self, int(min(budget, 1 << 30)))
        for request in self.running[admitted:]:
            budget = self._schedule(request, budget, plan)
        return plan

    def _schedule(self, request: Request, budget: float, plan: list[tuple[Request, list[int], bool]]) -> float:
        """Append ``request``'s part of this step to ``plan``, taking its blocks; the prompt-token budget left."""
        pending = request.tokens[request.computed:]
        decoding = len(pending) == 1 and request.output
        if not decoding:  # a prompt (or a preempted sequence) still filling the cache: a chunk of it
            take = len(pending) if not self.chunk_size else max(0, min(len(pending), int(budget)))
            if take == 0:
                return budget
            pending = pending[:take]
        drafts = []
        if decoding and self.speculate and request.temperature <= 0:
            room = request.max_tokens - len(request.output) - 1
            drafts = ngram_draft(request.tokens, min(self.speculate, room)) if room > 0 else []
        new = pending + drafts
        while not self.grow(request, request.computed + len(new)):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is request:
                return budget
        plan.append((request, new, bool(drafts)))
        return budget if decoding else budget - len(new)

    # --- one step ------------------------------------------------------------------------------------------------
    def step(self) -> int:
        """Admit, plan, run one forward pass, hand out tokens; returns how many tokens requests received."""
        self._apply_inbox()
        plan = self._plan()
        if not plan:
            return 0
        sequences = [(r.blocks, r.computed, new) for r, new, _ in plan]
        verify = {i for i, (_, _, drafted) in enumerate(plan) if drafted}
        batch = Batch.build(sequences, self.block_size, all_logits=verify, device=self.device)
        logits = self.model(batch, self.k_cache, self.v_cache)
        now = time.perf_counter()
        produced, row = 0, 0
        for i, (request, new, drafted) in enumerate(plan):
            rows = logits[row:row + (len(new) if i in verify else 1)]
            row += len(rows)
            decoding = bool(request.output) and request.computed == len(request.tokens) - 1
            if not decoding:                        # a prompt, or a preempted sequence, filling the cache
                self.stats.prefill_tokens += len(new)
            filled = request.computed + len(new)
            if filled < len(request.tokens):        # a prompt chunk: nothing to say yet
                request.computed = filled
                self.remember_full_blocks(request)
                continue
            if drafted:
                produced += accept_drafts(self, request, new, rows, now)
            else:
                request.computed = filled
                self.remember_full_blocks(request)
                produced += self.emit(request, sample(rows[-1], request), now)
        for request in [r for r in self.running if r.done]:
            self.running.remove(request)
            self._free(request)
            self._tell_end(request)
        self.stats.steps += 1
        return produced

    def emit(self, request: Request, token: int, now: float) -> int:
        request.output.append(token)
        request.token_times.append(now)
        request.first_token_at = request.first_token_at or now
        self.stats.generated_tokens += 1
        if request.on_token:
            request.on_token(request, token)
        if token in self.eos_ids:
            self._finish(request, "stop", now)
        elif len(request.output) >= request.max_tokens:
            self._finish(request, "length", now)
        return 1

    def _finish(self, request: Request, reason: str, now: float) -> None:
        request.finish_reason, request.finished_at = reason, now
        self.stats.finished[reason] = self.stats.finished.get(reason, 0) + 1
        if request not in self.running:
            self._free(request)
            self._tell_end(request)
        # a running request is freed at the end of this step, and only then told it ended (step())

    @staticmethod
    def _tell_end(request: Request) -> None:
        """The request's consumer learns it ended once its blocks are back in the pool."""
        if request.on_token:
            request.on_token(request, None)

    def generate(self, prompts: list[list[int]], max_tokens: int | list[int], temperature: float = 0.0) -> list[list[int]]:
        """Offline use: run ``prompts`` to completion together; their outputs in order."""
        budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        requests = [self.add(p, m, temperature) for p, m in zip(prompts, budgets)]
        while self.has_work():
            self.step()
        return [r.output for r in requests]


class AsyncEngine:
    """An ``Engine`` stepping in its own thread while there is work; asyncio code awaits its tokens."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the stepping thread runs (what a health check reports)."""
        return self._thread.is_alive() and not self._stopped

    def _loop(self) -> None:
        keep_torch_threads()  # the count the process set, not OpenMP's default for a new thread
        while not self._stopped:
            if self.engine.has_work():
                try:
                    self.engine.step()
                except Exception:  # one failed step must not hang every client: end what is in flight, keep serving
                    logging.getLogger(__name__).exception("engine step failed: aborting the requests in flight")
                    self.engine.abort_all()
            else:
                self._wake.wait(0.5)
                self._wake.clear()

    async def generate(self, prompt: list[int], max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                       seed: int | None = None, on_request: Callable[[Request], None] | None = None
                       ) -> AsyncIterator[int]:
        """The request's tokens as they come (ValueError at once for a request the engine cannot serve). Closing the
        iterator early (a client that disconnected, a stop string) aborts the request and frees its blocks."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_token(request: Request, token: int | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, token)

        request = self.engine.add(prompt, max_tokens, temperature, top_p, seed, on_token)
        if on_request:
            on_request(request)
        self._wake.set()
        try:
            while (token := await queue.get()) is not None:
                yield token
        finally:
            if not request.done:
                self.engine.abort(request)
                self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(10)
