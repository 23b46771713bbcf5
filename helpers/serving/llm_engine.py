"""A small LLM serving engine: a paged KV cache, prefill and batched decode over it, and a scheduler.

The lecture on serving language models shows and runs these very objects, and ``make serve-llm`` serves
through them, so what is taught is what answers requests:

* ``PagedKVCache``: keys and values of every running sequence live in fixed-size blocks of one pool; each
  sequence has a *block table* (its blocks in order), so memory is taken a block at a time as it grows.
* ``prefill`` runs a whole prompt once, writing its keys and values; ``decode_step`` advances a batch of
  sequences by one token each, reading their keys and values back through their block tables.
* ``Engine`` schedules: ``"continuous"`` (iteration-level, as Orca and vLLM do: a request joins the running
  batch at the next step and leaves it when done) or ``"static"`` (request-level: a batch is formed when the
  engine is idle and runs until its last member is done).
* ``AsyncEngine`` runs an ``Engine`` in a thread for an asyncio server: ``async for token in generate(...)``.
"""
from __future__ import annotations

import asyncio
import itertools
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

import torch
import torch.nn.functional as F

from helpers.core.models import TransformerLM

SCHEDULERS = ("continuous", "static")


class PagedKVCache:
    """Keys and values in ``num_blocks`` blocks of ``block_size`` token slots, per layer; a block table per sequence."""

    def __init__(self, layers: int, heads: int, head_dim: int, num_blocks: int, block_size: int = 16,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        self.layers, self.heads, self.head_dim, self.block_size = layers, heads, head_dim, block_size
        self.num_blocks = num_blocks
        # one pool per layer for K and one for V: (slots, heads, head_dim); slot = block * block_size + offset
        self.k = torch.zeros(layers, num_blocks * block_size, heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.free_blocks: list[int] = list(range(num_blocks - 1, -1, -1))
        self.tables: dict[int, list[int]] = {}

    @classmethod
    def for_model(cls, model: TransformerLM, num_blocks: int, block_size: int = 16) -> "PagedKVCache":
        block = model.blocks[0]
        width = model.tok.embedding_dim
        weight = model.tok.weight
        return cls(len(model.blocks), block.n_heads, width // block.n_heads, num_blocks, block_size, weight.dtype, weight.device)

    @property
    def bytes_per_token(self) -> int:
        """2 (K and V) x layers x heads x head_dim x bytes per element."""
        return 2 * self.layers * self.heads * self.head_dim * self.k.element_size()

    @property
    def allocated_bytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def grow(self, seq: int, tokens: int) -> None:
        """Make room for ``tokens`` positions of ``seq``, taking free blocks as needed."""
        table = self.tables.setdefault(seq, [])
        while len(table) * self.block_size < tokens:
            if not self.free_blocks:
                raise MemoryError(f"KV cache full: {self.num_blocks} blocks of {self.block_size} tokens all in use")
            table.append(self.free_blocks.pop())

    def release(self, seq: int) -> None:
        self.free_blocks.extend(reversed(self.tables.pop(seq, [])))

    def slots(self, seq: int, positions: torch.Tensor) -> torch.Tensor:
        """Pool slots of ``positions`` of ``seq``: block_table[position // block_size] * block_size + position % block_size."""
        table = torch.tensor(self.tables[seq], device=positions.device)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(batch, length, width) -> (batch, length, heads, head_dim)."""
    return x.view(*x.shape[:2], n_heads, x.shape[-1] // n_heads)


@torch.no_grad()
def prefill(model: TransformerLM, cache: PagedKVCache, seq: int, tokens: torch.Tensor) -> torch.Tensor:
    """Run a whole prompt (1-D tokens) once, writing its keys and values to ``seq``'s blocks; the last position's logits."""
    length = len(tokens)
    cache.grow(seq, length)
    positions = torch.arange(length, device=tokens.device)
    slots = cache.slots(seq, positions)
    x = model.tok(tokens[None]) + model.pos(positions)
    for layer, block in enumerate(model.blocks):
        q, k, v = (_heads(z, block.n_heads) for z in block.qkv(block.ln1(x)).split(x.shape[-1], dim=2))
        cache.k[layer, slots], cache.v[layer, slots] = k[0], v[0]
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + block.proj(attended.transpose(1, 2).reshape(x.shape))
        x = x + block.out(block.act(block.fc(block.ln2(x))))
    return model.head(model.ln(x[:, -1]))[0]


@torch.no_grad()
def decode_step(model: TransformerLM, cache: PagedKVCache, seqs: list[int], tokens: torch.Tensor,
           positions: torch.Tensor) -> torch.Tensor:
    """One token for each of ``seqs`` (``tokens`` at ``positions``, 1-D): (batch, vocab) logits of the next one."""
    for seq, position in zip(seqs, positions.tolist()):
        cache.grow(seq, position + 1)
    longest = int(positions.max()) + 1
    # Each row reads its own positions 0..position through its block table; the rest is padding, masked out.
    span = torch.arange(longest, device=tokens.device)
    gather = torch.stack([cache.slots(seq, span.clamp(max=position)) for seq, position in zip(seqs, positions.tolist())])
    valid = (span[None, :] <= positions[:, None])[:, None, None, :]          # (batch, 1, 1, longest)
    new_slots = gather[torch.arange(len(seqs)), positions]
    x = model.tok(tokens[:, None]) + model.pos(positions[:, None])           # (batch, 1, width)
    for layer, block in enumerate(model.blocks):
        q, k, v = (_heads(z, block.n_heads) for z in block.qkv(block.ln1(x)).split(x.shape[-1], dim=2))
        cache.k[layer, new_slots], cache.v[layer, new_slots] = k[:, 0], v[:, 0]
        keys, values = cache.k[layer][gather], cache.v[layer][gather]           # (batch, longest, heads, head_dim)
        attended = F.scaled_dot_product_attention(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
                                                  attn_mask=valid)
        x = x + block.proj(attended.transpose(1, 2).reshape(x.shape))
        x = x + block.out(block.act(block.fc(block.ln2(x))))
    return model.head(model.ln(x[:, 0]))


@dataclass
class Request:
    """One generation request and what has become of it (times are ``time.perf_counter()``)."""

    id: int
    prompt: list[int]
    max_tokens: int
    temperature: float = 0.0
    seed: int | None = None
    on_token: Callable[["Request", int | None], None] | None = None  # called with each token, then None when done
    output: list[int] = field(default_factory=list)
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_at: float | None = None
    generator: torch.Generator | None = None

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens


def sample(logits: torch.Tensor, request: Request) -> int:
    """Greedy at temperature 0, else a draw from softmax(logits / temperature) with the request's own generator."""
    if request.temperature <= 0:
        return int(logits.argmax())
    if request.generator is None:
        request.generator = torch.Generator(device=logits.device)
        request.generator.manual_seed(request.seed if request.seed is not None else request.id)
    probs = torch.softmax(logits.float() / request.temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=request.generator))


class Engine:
    """Requests in, tokens out, one ``step()`` at a time: admit (by scheduler and free KV blocks), prefill, decode."""

    def __init__(self, model: TransformerLM, scheduler: str = "continuous", max_batch: int = 16,
                 num_blocks: int | None = None, block_size: int = 16):
        if scheduler not in SCHEDULERS:
            raise ValueError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
        self.model, self.scheduler, self.max_batch = model.eval(), scheduler, max_batch
        self.max_len = model.max_len
        blocks_per_seq = math.ceil(self.max_len / block_size)
        self.cache = PagedKVCache.for_model(model, num_blocks or max_batch * blocks_per_seq, block_size)
        self.device = model.tok.weight.device
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.reserved = 0  # blocks promised to running requests (prompt + max_tokens each)
        self._ids = itertools.count()
        self.steps = 0

    def check(self, prompt: list[int], max_tokens: int) -> None:
        """Raise ValueError saying what is wrong with a request this engine cannot serve."""
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token (one character)")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        if len(prompt) + max_tokens > self.max_len:
            raise ValueError(f"the prompt ({len(prompt)} tokens) plus max_tokens ({max_tokens}) is longer than the "
                             f"model's context of {self.max_len} tokens: shorten the prompt or lower max_tokens")
        if any(not 0 <= t < self.model.vocab_size for t in prompt):
            raise ValueError(f"prompt tokens must be in 0..{self.model.vocab_size - 1}")

    def add(self, prompt: list[int], max_tokens: int, temperature: float = 0.0, seed: int | None = None,
            on_token: Callable[[Request, int | None], None] | None = None) -> Request:
        self.check(prompt, max_tokens)
        request = Request(next(self._ids), list(prompt), max_tokens, temperature, seed, on_token)
        self.waiting.append(request)
        return request

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _admit(self) -> list[Request]:
        if self.scheduler == "static" and self.running:
            return []  # request-level batching: nobody joins a batch in flight
        admitted = []
        while self.waiting and len(self.running) < self.max_batch:
            need = self.cache.blocks_for(len(self.waiting[0].prompt) + self.waiting[0].max_tokens)
            if self.reserved + need > self.cache.num_blocks:
                break  # not enough KV memory promised-free: it waits
            request = self.waiting.popleft()
            self.reserved += need
            self.running.append(request)
            admitted.append(request)
        return admitted

    def _emit(self, request: Request, token: int, now: float) -> None:
        request.output.append(token)
        request.token_times.append(now)
        if request.first_token_at is None:
            request.first_token_at = now
        if request.on_token:
            request.on_token(request, token)

    def _finish(self, request: Request, now: float) -> None:
        request.finished_at = now
        self.cache.release(request.id)
        self.reserved -= self.cache.blocks_for(len(request.prompt) + request.max_tokens)
        if request.on_token:
            request.on_token(request, None)

    def step(self) -> int:
        """One iteration: admit, prefill the admitted, decode the rest by one token; returns tokens produced."""
        admitted = self._admit()
        produced = 0
        for request in admitted:
            logits = prefill(self.model, self.cache, request.id, torch.tensor(request.prompt, device=self.device))
            self._emit(request, sample(logits, request), time.perf_counter())
            produced += 1
        decoding = [r for r in self.running if r not in admitted and not r.done]
        if decoding:
            tokens = torch.tensor([r.output[-1] for r in decoding], device=self.device)
            positions = torch.tensor([len(r.prompt) + len(r.output) - 1 for r in decoding], device=self.device)
            logits = decode_step(self.model, self.cache, [r.id for r in decoding], tokens, positions)
            now = time.perf_counter()
            for request, row in zip(decoding, logits):
                self._emit(request, sample(row, request), now)
            produced += len(decoding)
        now = time.perf_counter()
        for request in [r for r in self.running if r.done]:
            self.running.remove(request)
            self._finish(request, now)
        self.steps += 1
        return produced

    def generate(self, prompts: list[list[int]], max_tokens: int | list[int], temperature: float = 0.0) -> list[list[int]]:
        """Offline use: run ``prompts`` to completion together; their outputs in order."""
        budgets = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        requests = [self.add(p, m, temperature) for p, m in zip(prompts, budgets)]
        while self.has_work():
            self.step()
        return [r.output for r in requests]


class AsyncEngine:
    """An ``Engine`` stepping in its own thread while there is work; asyncio code awaits tokens from it."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._wake = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="llm-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopped:
            busy = self.engine.has_work()
            if busy:
                self.engine.step()
            if not busy:
                self._wake.wait(0.5)
                self._wake.clear()

    async def generate(self, prompt: list[int], max_tokens: int, temperature: float = 0.0,
                       seed: int | None = None) -> AsyncIterator[int]:
        """The request's tokens as they are produced (ValueError at once for a request the engine cannot serve)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def on_token(request: Request, token: int | None) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, token)

        self.engine.add(prompt, max_tokens, temperature, seed, on_token)  # a deque append: safe beside the stepping thread
        self._wake.set()
        while (token := await queue.get()) is not None:
            yield token

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(10)
