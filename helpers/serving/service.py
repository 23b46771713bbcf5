"""The model service: FastAPI app with /predict, /health and /metrics, its time split per request.

``POST /predict`` takes ``{"inputs": [[784 floats in 0..1], ...]}`` and answers
``{"predictions": [digit, ...]}``. Each answer carries a standard ``Server-Timing`` header
with the time spent parsing the JSON, validating it, running the model and serialising the
answer, so a client can tell where a request's time went (the rest is network and queueing).
Bad input is answered 422 with a message that says what was wrong; the service stays up.
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import Annotated, Callable

import anyio
import torch
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from pydantic import Field, TypeAdapter, ValidationError
from torch import nn

from helpers.core.load import keep_torch_threads
from helpers.mlops import watch_inputs
from helpers.serving.model import INPUTS

MAX_BATCH = 1024  # inputs per request: a bound on what one request can make the server hold
Pixel = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]
Image = Annotated[list[Pixel], Field(min_length=INPUTS, max_length=INPUTS)]
Inputs = TypeAdapter(Annotated[list[Image], Field(min_length=1, max_length=MAX_BATCH)])
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (so that two apps in one process never clash)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.predictions = Counter("predictions", "Inputs predicted (one per image).", registry=self.registry)
        self.requests = Counter("predict_requests", "Requests to /predict by outcome.", ["outcome"], registry=self.registry)
        self.latency = Histogram("predict_latency_seconds", "Time to answer /predict, parsing to serialising.",
                                 buckets=LATENCY_BUCKETS, registry=self.registry)
        self.batch_sizes = Histogram("model_batch_inputs", "Inputs per model call when batching dynamically.",
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024), registry=self.registry)


def validation_message(error: ValidationError) -> str:
    """The first problem of a pydantic error, as one sentence naming where it is."""
    first = error.errors()[0]
    where = "inputs" + "".join(f"[{part}]" for part in first["loc"])
    return f"{where}: {first['msg']}. Send {{\"inputs\": [[{INPUTS} numbers in 0..1], ...]}} (1 to {MAX_BATCH} images)."


def unprocessable(message: str, metrics: Metrics) -> JSONResponse:
    metrics.requests.labels("rejected").inc()
    return JSONResponse({"detail": message}, status_code=422)


def create_app(model: nn.Module, *, threads: int = 1, registry: CollectorRegistry | None = None,
               metrics_body: Callable[[], bytes] | None = None, grpc_port: int | None = None,
               batch_size: int = 0, max_wait_ms: float = 2.0) -> FastAPI:
    """The service around ``model`` (pixels (N, 784) -> logits (N, 10)).

    ``threads`` model calls may run at once, each in a thread of its own (torch releases the GIL inside
    its operators); more requests wait. ``metrics_body`` overrides what /metrics returns (several worker
    processes aggregate their metrics there). ``grpc_port`` also serves the same model over gRPC
    (digits.proto) while the app runs, counted in the same metrics. ``batch_size`` > 0 batches concurrent
    requests dynamically (up to that many inputs, waiting at most ``max_wait_ms``; see batching.py).
    """
    model.eval()
    metrics = Metrics(registry)
    drift = watch_inputs(metrics.registry)  # input drift over a sliding window, read at /metrics (lecture 10)
    limiter = anyio.CapacityLimiter(threads)

    def predict_digits(pixels: torch.Tensor) -> list[int]:
        keep_torch_threads()  # a worker thread of anyio's: torch's thread count holds only where it was set
        with torch.inference_mode():
            return model(pixels).argmax(1).tolist()

    def predict_over_grpc(pixels: torch.Tensor) -> list[int]:
        digits = predict_digits(pixels)
        metrics.predictions.inc(len(digits))
        return digits

    batcher = None
    if batch_size:
        from helpers.serving.batching import DynamicBatcher

        batcher = DynamicBatcher(predict_digits, batch_size, max_wait_ms,
                                 on_batch=lambda size, wait: metrics.batch_sizes.observe(size))

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        if batcher:
            batcher.start()
        grpc_server = None
        if grpc_port:
            from helpers.serving.grpc_service import serve_grpc

            grpc_server = serve_grpc(predict_over_grpc, grpc_port, max_batch=MAX_BATCH)
        yield
        if grpc_server is not None:
            grpc_server.stop(grace=1.0).wait()
        if batcher:
            await batcher.stop()

    app = FastAPI(title="MNIST digit service", version="1.0", lifespan=lifespan)
    app.state.metrics = metrics

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/metrics")
    def read_metrics() -> Response:
        body = metrics_body() if metrics_body else generate_latest(metrics.registry)
        return PlainTextResponse(body, media_type=CONTENT_TYPE_LATEST)

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        start = time.perf_counter()
        body = await request.body()
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            return unprocessable(f"the body is not valid JSON ({err.msg if hasattr(err, 'msg') else err}).", metrics)
        if not isinstance(payload, dict) or "inputs" not in payload:
            return unprocessable(f"expected a JSON object with the key \"inputs\", got {type(payload).__name__}.", metrics)
        parsed = time.perf_counter()
        try:
            images = Inputs.validate_python(payload["inputs"])
        except ValidationError as err:
            return unprocessable(validation_message(err), metrics)
        pixels = torch.tensor(images, dtype=torch.float32)
        drift.observe(pixels)
        validated = time.perf_counter()
        if batcher and len(pixels) <= batch_size:  # a request bigger than a batch is a batch of its own
            digits = await batcher.submit(pixels)
        else:
            async with limiter:
                digits = await anyio.to_thread.run_sync(predict_digits, pixels)
        predicted = time.perf_counter()
        answer = json.dumps({"predictions": digits}).encode()
        done = time.perf_counter()
        metrics.predictions.inc(len(digits))
        metrics.requests.labels("ok").inc()
        metrics.latency.observe(done - start)
        timing = ", ".join(f"{name};dur={seconds * 1e3:.3f}" for name, seconds in (
            ("parse", parsed - start), ("validate", validated - parsed), ("model", predicted - validated),
            ("serialize", done - predicted)))
        return Response(answer, media_type="application/json", headers={"Server-Timing": timing})

    return app


def timing_entries(header: str) -> list[tuple[str, str, float]]:
    """A ``Server-Timing`` header -> [(name, description or "", seconds)], in the header's order."""
    entries = []
    for metric in filter(None, (part.strip() for part in header.split(","))):
        name, *params = (piece.strip() for piece in metric.split(";"))
        values = dict(param.partition("=")[::2] for param in params)
        entries.append((name, values.get("desc", "").strip('"'), float(values.get("dur", "0")) / 1e3))
    return entries


def server_timing(header: str) -> dict[str, float]:
    """A ``Server-Timing`` header -> {phase: seconds}."""
    return {name: seconds for name, _, seconds in timing_entries(header)}
