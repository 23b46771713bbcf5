"""SmolLM2 behind an OpenAI-compatible API: ``python -m helpers.serving.llm_server`` (``make serve-llm``).

The API vLLM, SGLang and TGI all speak, so the official ``openai`` client (and any tool built on it) talks to it:

* ``POST /v1/chat/completions`` (``messages``) and ``POST /v1/completions`` (``prompt``), streamed as server-sent
  events ending ``data: [DONE]`` or not; ``max_tokens`` (default ``DEFAULT_MAX_TOKENS``: a CPU is slow),
  ``temperature``, ``top_p``, ``seed``, ``stop`` and ``stream_options.include_usage``; ``usage`` in every answer.
* ``GET /v1/models`` (the one model served), ``GET /health``, ``GET /metrics`` (Prometheus, vLLM's metric names).
* Errors in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a request that cannot be
  served (the message says what to change), 404 for an unknown model, 429 with ``Retry-After`` when more than
  ``--max-waiting`` requests already wait, 503 while draining.
* Requests run on ``helpers.serving.llm_engine``'s engine (paged KV cache, continuous batching) in a thread of its own;
  a client that goes away aborts its request, which frees its KV blocks.
* Listens on 127.0.0.1 only. SIGTERM drains: new requests get 503, the ones in flight finish, then it exits 0.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
import uuid
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from helpers.core.load import in_fresh_thread
from helpers.core.procs import LOOPBACK, ServedProcess, free_port
from helpers.serving.llm_api import (
    ApiError,
    ChatRequest,
    CompletionRequest,
    Job,
    Metrics,
    Outcome,
    Sampling,
    TextStream,
    bad_request,
    text_of,
    validation_problems,
)
from helpers.serving.llm_engine import SCHEDULERS, AsyncEngine, Engine
from helpers.serving.llm_engine import Request as EngineRequest
from helpers.serving.smollm import MODEL_ID

DEFAULT_MAX_TOKENS = 256      # when a request names none: about 10 s of decoding on a 2-core CPU
DEFAULT_MAX_WAITING = 128     # requests queued behind the running batch before new ones get 429
MAX_STOP_STRINGS = 4          # as OpenAI
GREEDY_BELOW = 1e-5           # a temperature this low is greedy decoding (vLLM's sampling epsilon)
ALIASES = {MODEL_ID: (f"HuggingFaceTB/{MODEL_ID}",)}   # other names the served model answers to (vLLM's default name)



# --- the service -----------------------------------------------------------------------------------------------------
@dataclass
class LLMService:
    """What the routes share: the engine and its runner, the tokenizer, metrics, and the drain state."""

    engine: Engine
    tokenizer: Any
    model_name: str
    max_waiting: int
    metrics: Metrics
    runner: AsyncEngine | None = None
    live: dict = field(default_factory=dict)  # engine requests of answers in progress, by id
    in_flight: int = 0                        # generation requests being answered (the drain waits for 0)
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    # -- validation --
    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name and name not in ALIASES.get(self.model_name, ()):
            raise ApiError(404, f"The model `{name}` does not exist. This server serves `{self.model_name}` "
                                f"(see GET /v1/models).", "model", "NotFoundError", "model_not_found")

    def job(self, body: Sampling, prompt: list[int], max_tokens: int | None, prompt_param: str) -> Job:
        """Check every sampling field and the prompt's length; a Job the engine will take, else ApiError(400)."""
        if body.n != 1:
            raise bad_request(f"n must be 1 (this server returns one choice per request), got {body.n}: send separate "
                       "requests for several answers", "n")
        context, room = self.engine.context, self.engine.capacity_tokens
        if not prompt:
            raise bad_request("the prompt is empty: give at least one token of text", prompt_param)
        if len(prompt) >= context:
            raise bad_request(f"the prompt is {len(prompt)} tokens, longer than the model's context of {context} tokens "
                       "(which must also hold the answer): shorten it", prompt_param)
        if max_tokens is not None and not 1 <= max_tokens <= context:
            raise bad_request(f"max_tokens must be between 1 and the context length {context}, got {max_tokens}",
                       "max_tokens")
        if max_tokens is None:
            max_tokens = min(DEFAULT_MAX_TOKENS, context - len(prompt), room - len(prompt))
            if max_tokens < 1:
                raise bad_request(f"the prompt is {len(prompt)} tokens and this server's KV cache holds {room}: "
                           "shorten the prompt", prompt_param)
        temperature = 1.0 if body.temperature is None else body.temperature
        if not 0.0 <= temperature <= 2.0:   # NaN fails this too
            raise bad_request(f"temperature must be between 0 and 2, got {temperature}: 0 for greedy decoding, 1 to sample "
                       "from the model's distribution", "temperature")
        top_p = 1.0 if body.top_p is None else body.top_p
        if not 0.0 < top_p <= 1.0:
            raise bad_request(f"top_p must be in (0, 1], got {top_p}: 1 keeps every token, 0.9 the smallest set holding "
                       "90% of the probability", "top_p")
        if body.seed is not None and not -(2 ** 63) <= body.seed < 2 ** 64:
            raise bad_request(f"seed must fit in 64 bits, got {body.seed}", "seed")
        stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        if len(stops) > MAX_STOP_STRINGS or "" in stops:
            raise bad_request(f"stop takes a string or a list of up to {MAX_STOP_STRINGS} non-empty strings, got {body.stop!r}",
                       "stop")
        try:
            self.engine.check(prompt, max_tokens)
        except ValueError as error:
            raise bad_request(str(error)) from error
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return Job(prompt, max_tokens, 0.0 if temperature < GREEDY_BELOW else temperature, top_p, body.seed,
                   stops, body.stream, include_usage)

    def check_capacity(self) -> None:
        """429 when the queue behind the running batch is full."""
        waiting = sum(not r.done for r in self.live.values()) - len(self.engine.running)
        if waiting >= self.max_waiting:
            retry = max(1, min(60, round(self.metrics.mean_latency)))
            raise ApiError(429, f"the server is busy: {waiting} requests already wait for a slot (--max-waiting "
                                f"{self.max_waiting}); retry after {retry} s", None, "rate_limit_exceeded",
                           "rate_limit_exceeded", {"Retry-After": str(retry)})

    # -- generation --
    async def generate(self, job: Job, outcome: Outcome) -> AsyncIterator[str]:
        """The answer's text in pieces as it is produced; ``outcome`` says how it ended once the iterator is done.

        Stopping early (a stop string) closes the engine's iterator, which aborts the request and frees its blocks;
        so does cancellation (a client that went away).
        """
        text = TextStream(self.tokenizer, job.stops)

        def started(request: EngineRequest) -> None:
            outcome.request = request
            self.live[request.id] = request

        tokens = self.runner.generate(job.prompt, job.max_tokens, job.temperature, job.top_p, job.seed,
                                      on_request=started)
        try:
            async for token in tokens:
                outcome.completion_tokens += 1
                text.add(token)
                if text.stopped:
                    outcome.finish_reason = "stop"
                    break
                if piece := text.take():
                    yield piece
            else:
                text.finish()
                outcome.finish_reason = "stop" if text.stopped else outcome.request.finish_reason
            if piece := text.take():
                yield piece
        finally:
            await tokens.aclose()
            if outcome.request is not None:
                self.live.pop(outcome.request.id, None)
                outcome.cached_tokens = outcome.request.cached_tokens
            self.metrics.observe(outcome)

    async def complete(self, job: Job, http: Request) -> tuple[str, Outcome] | None:
        """The whole answer, or None if the client disconnected first (its request is then aborted)."""
        outcome = Outcome()

        async def collect() -> str:
            return "".join([piece async for piece in self.generate(job, outcome)])

        task = asyncio.ensure_future(collect())
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=0.25)
                if done:
                    return task.result(), outcome
                if await http.is_disconnected():
                    return None
        finally:
            if not task.done():
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task

    def usage(self, job: Job, outcome: Outcome) -> dict:
        return {"prompt_tokens": len(job.prompt), "completion_tokens": outcome.completion_tokens,
                "total_tokens": len(job.prompt) + outcome.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens}}


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)}\n\n"


async def _read_json(http: Request) -> dict:
    """The request body as a JSON object, or ApiError(400) saying why it is not one."""
    raw = await http.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise bad_request(f"the request body is not valid UTF-8 (byte {error.start}: {error.reason}): send JSON encoded as "
                   "UTF-8") from error
    try:
        body = json.loads(text)
    except json.JSONDecodeError as error:
        raise bad_request(f"the request body is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}): "
                   "send a JSON object such as {\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}") from error
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got a JSON {type(body).__name__}")
    return body


def _check_unicode(value: Any, where: str = "body") -> None:
    """ApiError(400) for text that is not valid Unicode: a lone surrogate sent as a \\ud800 escape."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:
            raise bad_request(f"{where} holds text that is not valid Unicode (a lone surrogate at character {error.start}): "
                       "send UTF-8 text", where) from error
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _check_unicode(item, f"{where}.{i}")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(item, key if where == "body" else f"{where}.{key}")


def _parse(model: type[BaseModel], body: dict, example: str):
    _check_unicode(body)
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise bad_request(f"invalid request: {validation_problems(error)}. Expected a body such as {example}") from error


CHAT_EXAMPLE = '{"model": "%s", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32}'
COMPLETION_EXAMPLE = '{"model": "%s", "prompt": "Once upon a time", "max_tokens": 32}'


# --- the app ---------------------------------------------------------------------------------------------------------
class DrainGate:
    """ASGI middleware: counts generation requests in flight; while draining, answers new ones 503."""

    def __init__(self, app, service: LLMService):
        self.app, self.service = app, service

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        if self.service.draining:
            answer = ApiError(503, "the server is shutting down and takes no new requests: send this one to another "
                                   "replica or retry once it is restarted", None, "service_unavailable",
                              "shutting_down", {"Connection": "close"}).response()
            return await answer(scope, receive, send)
        self.service.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.service.in_flight -= 1


def create_llm_app(engine: Engine, tokenizer, model_name: str = MODEL_ID,
                   max_waiting: int = DEFAULT_MAX_WAITING) -> FastAPI:
    """The FastAPI app serving ``engine``; an ``AsyncEngine`` steps it in its own thread while the app runs."""
    service = LLMService(engine, tokenizer, model_name, max_waiting, Metrics(engine, model_name))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.runner = AsyncEngine(engine)
        yield
        service.runner.stop()

    app = FastAPI(title=f"{model_name} (OpenAI-compatible)", lifespan=lifespan)
    app.state.llm = service
    app.add_middleware(DrainGate, service=service)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, error: ApiError) -> JSONResponse:
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        hint = " (routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics)"
        return ApiError(error.status_code, f"{request.method} {request.url.path}: {error.detail}{hint}", None,
                        "invalid_request_error" if error.status_code < 500 else "server_error").response()

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        return ApiError(500, f"internal error ({type(error).__name__}: {error}); the server is still up and this is a "
                             "bug worth reporting", None, "server_error").response()

    @app.get("/health")
    def health() -> JSONResponse:
        if service.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        if service.runner is None or not service.runner.alive:
            return JSONResponse({"status": "engine stopped"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    def models() -> dict:
        card = {"id": model_name, "object": "model", "created": service.created, "owned_by": "edl-kit",
                "root": model_name, "parent": None, "max_model_len": engine.context}
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(http: Request):
        body = _parse(ChatRequest, await _read_json(http), CHAT_EXAMPLE % model_name)
        service.check_model(body.model)
        if not body.messages:
            raise bad_request("messages is empty: send at least one message, such as "
                       "[{\"role\": \"user\", \"content\": \"Hi\"}]", "messages")
        if body.logprobs:
            raise bad_request("logprobs are not supported by this server: leave logprobs out", "logprobs")
        conversation = [{"role": m.role, "content": text_of(m)} for m in body.messages]
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        job = service.job(body, tokenizer.encode_chat(conversation), limit, "messages")
        service.check_capacity()
        ident = f"chatcmpl-{uuid.uuid4().hex}"
        head = {"id": ident, "object": "chat.completion", "created": int(time.time()), "model": model_name}
        if not job.stream:
            answer = await service.complete(job, http)
            if answer is None:
                return Response(status_code=499)   # nobody is listening; nginx's "client closed request"
            text, outcome = answer
            return {**head, "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                         "logprobs": None, "finish_reason": outcome.finish_reason}],
                    "usage": service.usage(job, outcome)}

        chunk_head = {**head, "object": "chat.completion.chunk"}
        extra = {"usage": None} if job.include_usage else {}

        def chunk(delta: dict, finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _sse({**chunk_head, "choices": [choice], **extra})

        async def events() -> AsyncIterator[str]:
            outcome = Outcome()
            yield chunk({"role": "assistant", "content": ""})
            async for piece in service.generate(job, outcome):
                yield chunk({"content": piece})
            yield chunk({}, outcome.finish_reason)
            if job.include_usage:
                yield _sse({**chunk_head, "choices": [], "usage": service.usage(job, outcome)})
            yield _sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(http: Request):
        body = _parse(CompletionRequest, await _read_json(http), COMPLETION_EXAMPLE % model_name)
        service.check_model(body.model)
        if body.logprobs is not None or body.echo:
            raise bad_request("logprobs and echo are not supported by this server: leave them out", "logprobs")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise bad_request(f"send one prompt per request (got a list of {len(prompt)}): send them as separate "
                           "requests, which the server batches anyway", "prompt")
            prompt = prompt[0]
        ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        job = service.job(body, ids, body.max_tokens, "prompt")
        service.check_capacity()
        ident = f"cmpl-{uuid.uuid4().hex}"
        head = {"id": ident, "object": "text_completion", "created": int(time.time()), "model": model_name}

        def choice(text: str, finish: str | None) -> dict:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        if not job.stream:
            answer = await service.complete(job, http)
            if answer is None:
                return Response(status_code=499)
            text, outcome = answer
            return {**head, "choices": [choice(text, outcome.finish_reason)], "usage": service.usage(job, outcome)}

        extra = {"usage": None} if job.include_usage else {}

        async def events() -> AsyncIterator[str]:
            outcome = Outcome()
            async for piece in service.generate(job, outcome):
                yield _sse({**head, "choices": [choice(piece, None)], **extra})
            yield _sse({**head, "choices": [choice("", outcome.finish_reason)], **extra})
            if job.include_usage:
                yield _sse({**head, "choices": [], "usage": service.usage(job, outcome)})
            yield _sse("[DONE]")

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


# --- a load-test client ------------------------------------------------------------------------------------------------
class CompletionsSender:
    """A request callable for ``open_loop_test``: streams ``/v1/completions``; reports TTFT, chunk times, token count."""

    def __init__(self, base_url: str, prompts: list[str], max_tokens: int | list[int] = 32, temperature: float = 0.0,
                 timeout: float = 300.0):
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.prompts, self.temperature, self.timeout = prompts, temperature, timeout
        self.max_tokens = max_tokens if isinstance(max_tokens, list) else [max_tokens]
        self._client = None

    async def __call__(self, i: int) -> dict:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=httpx.Limits(max_connections=1000))
        body = {"prompt": self.prompts[i % len(self.prompts)], "max_tokens": self.max_tokens[i % len(self.max_tokens)],
                "temperature": self.temperature, "stream": True, "stream_options": {"include_usage": True}}
        times: list[float] = []
        tokens = 0
        async with self._client.stream("POST", self.url, json=body) as answer:
            if answer.status_code != 200:
                return {"error": f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}"}
            async for line in answer.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif event["choices"] and event["choices"][0]["text"]:
                    times.append(time.perf_counter())
        return {"first_token": times[0] if times else None, "token_times": times, "output_tokens": tokens}

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


# --- the process -------------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m helpers.serving.llm_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="TCP port on 127.0.0.1 (default 8000; 0 = any free port)")
    parser.add_argument("--scheduler", default="continuous", choices=SCHEDULERS, help="batching (default continuous)")
    parser.add_argument("--max-batch", type=int, default=16, help="most requests decoded together (default 16)")
    parser.add_argument("--num-blocks", type=int, default=512, help="KV-cache blocks of 16 tokens (default 512)")
    parser.add_argument("--chunk-size", type=int, default=256,
                        help="most prompt tokens computed per step (default 256; 0 = whole prompts)")
    parser.add_argument("--speculate", type=int, default=0, help="n-gram draft tokens per step, greedy requests (default 0)")
    parser.add_argument("--no-prefix-caching", action="store_true", help="do not reuse the KV blocks of shared prefixes")
    parser.add_argument("--max-waiting", type=int, default=DEFAULT_MAX_WAITING,
                        help=f"requests queued behind the batch before new ones get 429 (default {DEFAULT_MAX_WAITING})")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: a GPU if there is one)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--drain-timeout", type=float, default=120.0,
                        help="on SIGTERM, longest wait for requests in flight, in seconds (default 120)")
    args = parser.parse_args(argv)
    for name in ("max_batch", "num_blocks", "max_waiting"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("chunk_size", "speculate", "threads"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    return args


def _draining_server(config, service: LLMService, drain_timeout: float):
    """A uvicorn server whose first SIGTERM drains (503 to new requests, in-flight ones finish) before it stops."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain_deadline = math.inf

        def handle_exit(self, sig, frame) -> None:
            if sig == signal.SIGTERM and not service.draining:
                service.draining = True
                self.drain_deadline = time.monotonic() + drain_timeout
                print(f"SIGTERM: draining {service.in_flight} request(s) in flight; new ones get 503", flush=True)
                return
            super().handle_exit(sig, frame)

        async def on_tick(self, counter: int) -> bool:
            if await super().on_tick(counter):
                return True
            return service.draining and (service.in_flight == 0 or time.monotonic() > self.drain_deadline)

    return DrainingServer(config)


def build_engine(args: argparse.Namespace, device: str) -> tuple[Engine, object]:
    """The model, its engine and the tokenizer.

    ``main`` calls this in a thread that then ends (``in_fresh_thread``): a parallel region run while loading on the
    main thread would leave an OpenMP team there for good, and the engine's own thread then decoded at half speed on
    2 cores (16.7-17.4 tok/s against 31.7-32.3 once the engine's KV cache was no longer zeroed on the main thread)."""
    from helpers.serving.llama import load_llm
    from helpers.serving.smollm import load_tokenizer

    model, tokenizer = load_llm(device), load_tokenizer()
    engine = Engine(model, args.scheduler, args.max_batch, num_blocks=args.num_blocks, chunk_size=args.chunk_size or None,
                    prefix_caching=not args.no_prefix_caching, speculate=args.speculate, eos_ids=(tokenizer.eos_id,))
    return engine, tokenizer


def main(argv: list[str] | None = None) -> None:
    import prometheus_client
    import uvicorn

    from helpers.serving.smollm import gguf_path

    args = parse_args(argv)
    prometheus_client.disable_created_metrics()   # as vLLM: no *_created series beside each counter and histogram
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    engine, tokenizer = in_fresh_thread(lambda: build_engine(args, device))
    model = engine.model
    app = create_llm_app(engine, tokenizer, MODEL_ID, args.max_waiting)
    port = args.port or free_port()
    dtype = str(model.embed.weight.dtype).removeprefix("torch.")
    print(f"serving {MODEL_ID} from {gguf_path()} ({dtype} on {device}, {torch.get_num_threads()} threads) at "
          f"http://{LOOPBACK}:{port}/v1: {args.scheduler} batching of up to {args.max_batch}, "
          f"{args.num_blocks} KV blocks of {engine.block_size} tokens, up to {args.max_waiting} waiting; "
          "Ctrl-C or SIGTERM stops it", flush=True)
    config = uvicorn.Config(app, host=LOOPBACK, port=port, log_level="warning", timeout_graceful_shutdown=5)
    with suppress(KeyboardInterrupt):
        _draining_server(config, app.state.llm, args.drain_timeout).run()
    print("server stopped", flush=True)


def start_llm_service(port: int | None = None, *, scheduler: str = "continuous", max_batch: int = 16,
                      num_blocks: int = 512, chunk_size: int = 256, speculate: int = 0, prefix_caching: bool = True,
                      max_waiting: int = DEFAULT_MAX_WAITING, device: str | None = None, threads: int = 0,
                      startup_timeout: float = 180.0) -> ServedProcess:
    """The server as a child process on 127.0.0.1 (a free port unless given), healthy when this returns.

    Use it in a ``with`` block; ``.url`` is its address (the API under ``.url + "/v1"``).
    """
    from helpers.core.paths import build_dir

    port = port or free_port()
    command = [sys.executable, "-m", "helpers.serving.llm_server", "--port", str(port), "--scheduler", scheduler,
               "--max-batch", str(max_batch), "--num-blocks", str(num_blocks), "--chunk-size", str(chunk_size),
               "--speculate", str(speculate), "--max-waiting", str(max_waiting), "--threads", str(threads)]
    if not prefix_caching:
        command.append("--no-prefix-caching")
    if device:
        command += ["--device", device]
    return ServedProcess(command, port, health_path="/health", log_path=build_dir("serving") / f"llm-server-{port}.log",
                         startup_timeout=startup_timeout)


if __name__ == "__main__":
    main()
