"""The language model behind an OpenAI-compatible API: ``python -m helpers.serving.llm_server`` (``make serve-llm``).

``GET /v1/models``, ``POST /v1/completions`` (``prompt``, ``max_tokens``, ``temperature``, ``seed``, ``stream``:
server-sent events ending ``data: [DONE]``), ``GET /health`` and ``GET /metrics`` (Prometheus, named in vLLM's
style: ``llm:generation_tokens_total``, ``llm:time_to_first_token_seconds``, ``llm:time_per_output_token_seconds``,
``llm:num_requests_running``, ``llm:num_requests_waiting``). Requests go through ``helpers.serving.llm_engine``'s
``Engine`` (``--scheduler continuous|static``). Listens on 127.0.0.1; Ctrl-C or SIGTERM stops it.
"""
from __future__ import annotations

import argparse
import codecs
import json
import signal
import sys
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from helpers.core.procs import LOOPBACK, ServedProcess, free_port
from helpers.serving.llm_engine import SCHEDULERS, AsyncEngine, Engine

MODEL_NAME = "edl-stdlib-byte-lm"
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24)


class CompletionRequest(BaseModel):
    """The subset of OpenAI's completions request this server honours (other fields are accepted and ignored)."""

    prompt: str | list[str]
    model: str | None = None
    max_tokens: int = Field(16, gt=0)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    seed: int | None = None
    stream: bool = False


def _error(status: int, message: str, param: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}},
                        status_code=status)


class Metrics:
    """The server's Prometheus metrics, in a registry of its own."""

    def __init__(self, engine: Engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.generation_tokens = Counter("llm:generation_tokens", "Generated tokens.", registry=r)
        self.prompt_tokens = Counter("llm:prompt_tokens", "Prompt tokens prefilled.", registry=r)
        self.success = Counter("llm:request_success", "Requests answered in full.", registry=r)
        self.ttft = Histogram("llm:time_to_first_token_seconds", "Time to first token.", buckets=TOKEN_BUCKETS, registry=r)
        self.tpot = Histogram("llm:time_per_output_token_seconds", "Time per output token after the first.",
                              buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("llm:e2e_request_latency_seconds", "Request latency, arrival to last token.",
                             buckets=TOKEN_BUCKETS, registry=r)
        Gauge("llm:num_requests_running", "Requests in the running batch.", registry=r).set_function(lambda: len(engine.running))
        Gauge("llm:num_requests_waiting", "Requests waiting to be scheduled.", registry=r).set_function(lambda: len(engine.waiting))

    def body(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_llm_app(engine: Engine, model_name: str = MODEL_NAME) -> FastAPI:
    """The FastAPI app serving ``engine``; the engine steps in its own thread while the app runs."""
    from helpers.serving.lm import decode_tokens, encode_text

    metrics = Metrics(engine)
    state: dict[str, Any] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state["engine"] = AsyncEngine(engine)
        yield
        state["engine"].stop()

    app = FastAPI(title="language model (OpenAI-compatible completions)", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in exc.errors())
        return _error(422, f"invalid request: {problems} (send JSON such as {{\"prompt\": \"def \", \"max_tokens\": 16}})")

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(metrics.body(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "edl-kit",
                                            "max_model_len": engine.max_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            return _error(400, f"send one prompt per request (got {len(prompts)})", "prompt")
        tokens = encode_text(prompts[0])
        try:
            engine.check(tokens, body.max_tokens)
        except ValueError as err:
            return _error(400, str(err), "prompt")
        arrived = time.perf_counter()
        stream = state["engine"].generate(tokens, body.max_tokens, body.temperature, body.seed)
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        metrics.prompt_tokens.inc(len(tokens))
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        times: list[float] = []

        def chunk(text: str, finish: str | None) -> dict:
            return {"id": ident, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}

        def account() -> None:
            metrics.generation_tokens.inc(len(times))
            metrics.ttft.observe(times[0] - arrived)
            if len(times) > 1:
                metrics.tpot.observe((times[-1] - times[0]) / (len(times) - 1))
            metrics.e2e.observe(times[-1] - arrived)
            metrics.success.inc()

        if body.stream:
            async def events():
                async for token in stream:
                    times.append(time.perf_counter())
                    yield f"data: {json.dumps(chunk(utf8.decode(bytes([token])), None))}\n\n"
                yield f"data: {json.dumps(chunk(utf8.decode(b'', final=True), 'length'))}\n\n"
                account()
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        out = []
        async for token in stream:
            times.append(time.perf_counter())
            out.append(token)
        account()
        answer = chunk(decode_tokens(out), "length")
        answer["usage"] = {"prompt_tokens": len(tokens), "completion_tokens": len(out), "total_tokens": len(tokens) + len(out)}
        return answer

    return app


class CompletionsSender:
    """A request callable for ``open_loop_test``: streams ``/v1/completions`` and reports TTFT, token times, count."""

    def __init__(self, base_url: str, prompts: list[str], max_tokens: int | list[int] = 32, temperature: float = 0.0,
                 timeout: float = 120.0):
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.prompts, self.temperature, self.timeout = prompts, temperature, timeout
        self.max_tokens = max_tokens if isinstance(max_tokens, list) else [max_tokens]
        self._client = None

    async def __call__(self, i: int) -> dict:
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout, limits=httpx.Limits(max_connections=1000))
        body = {"prompt": self.prompts[i % len(self.prompts)], "max_tokens": self.max_tokens[i % len(self.max_tokens)],
                "temperature": self.temperature, "stream": True}
        times: list[float] = []
        async with self._client.stream("POST", self.url, json=body) as answer:
            if answer.status_code != 200:
                return {"error": f"HTTP {answer.status_code}: {(await answer.aread())[:200]!r}"}
            async for line in answer.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if json.loads(line[6:])["choices"][0]["finish_reason"] is None:
                        times.append(time.perf_counter())
        return {"first_token": times[0] if times else None, "token_times": times, "output_tokens": len(times)}

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m helpers.serving.llm_server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--scheduler", default="continuous", choices=SCHEDULERS, help="batching (default continuous)")
    parser.add_argument("--max-batch", type=int, default=16, help="most requests decoded together (default 16)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: a GPU if there is one)")
    parser.add_argument("--torch-threads", type=int, default=0, help="torch intra-op threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.max_batch < 1:
        parser.error(f"--max-batch must be at least 1, got {args.max_batch}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    return args


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    from helpers.serving.lm import language_model

    args = parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    model, info = language_model("target", args.device)
    engine = Engine(model, args.scheduler, args.max_batch)
    port = args.port or free_port()
    print(f"serving {MODEL_NAME} ({info.parameters:,} parameters, trained {info.steps} steps on {info.corpus}; held-out "
          f"perplexity {info.perplexity:.2f} per byte) on {info.trained_on} at http://{args.host}:{port}/v1 with "
          f"{args.scheduler} batching (up to {args.max_batch}); Ctrl-C stops it", flush=True)
    # uvicorn shuts down gracefully on SIGINT or SIGTERM, then raises the signal again to the handler it found:
    # for SIGTERM that would be the default (die by the signal), so a handler here turns it into a clean exit.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    try:
        uvicorn.run(create_llm_app(engine), host=args.host, port=port, log_level="warning", timeout_graceful_shutdown=5)
    except (KeyboardInterrupt, SystemExit):
        pass
    print("server stopped", flush=True)


def _exit_cleanly(signum, frame) -> None:
    raise SystemExit(0)


def start_llm_service(port: int | None = None, scheduler: str = "continuous", max_batch: int = 16,
                      device: str | None = None, torch_threads: int = 0, startup_timeout: float = 120.0) -> ServedProcess:
    """The server as a child process on 127.0.0.1 (a free port unless given), healthy when this returns.

    The model is trained here first if it is not cached, so the child only loads it. Use it in a ``with`` block.
    """
    from helpers.core.paths import build_dir
    from helpers.serving.lm import language_model

    language_model("target", device)
    port = port or free_port()
    command = [sys.executable, "-m", "helpers.serving.llm_server", "--port", str(port), "--scheduler", scheduler,
               "--max-batch", str(max_batch), "--torch-threads", str(torch_threads)]
    if device:
        command += ["--device", device]
    return ServedProcess(command, port, health_path="/health", log_path=build_dir("serving") / f"llm-server-{port}.log",
                         startup_timeout=startup_timeout)


if __name__ == "__main__":
    main()
