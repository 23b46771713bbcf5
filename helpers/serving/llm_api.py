"""The OpenAI-compatible protocol of the kit's LLM server (``helpers.serving.llm_server``): errors in OpenAI's shape,
the requests it accepts (validated with pydantic), text streamed out whole characters at a time, and the metrics under
vLLM's names."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError

from helpers.serving.llm_engine import Engine
from helpers.serving.llm_engine import Request as EngineRequest

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
                 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)


# --- errors --------------------------------------------------------------------------------------------------------
class ApiError(Exception):
    """An answer in OpenAI's error shape: the status, what was wrong and what to do, the parameter at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


# --- requests ------------------------------------------------------------------------------------------------------
class _Strict(BaseModel):
    """JSON types as OpenAI documents them (no "5" for 5); fields this server does not know are ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class Message(_Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[TextPart]


class StreamOptions(_Strict):
    include_usage: bool = False


class Sampling(_Strict):
    """The fields both endpoints share."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1


class ChatRequest(Sampling):
    messages: list[Message]
    max_completion_tokens: int | None = None    # OpenAI's newer name for max_tokens
    logprobs: bool | None = None


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int]
    logprobs: int | None = None
    echo: bool = False


@dataclass
class Job:
    """A validated request, ready for the engine."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stops: list[str]
    stream: bool
    include_usage: bool


def validation_problems(error: ValidationError) -> str:
    parts = []
    for e in error.errors()[:4]:
        where = ".".join(str(p) for p in e["loc"]) or "body"
        parts.append(f"{where}: {e['msg']}")
    return "; ".join(parts)


def text_of(message: Message) -> str:
    if isinstance(message.content, str):
        return message.content
    return "\n".join(part.text for part in message.content)    # vLLM joins text parts with newlines


# --- text out ------------------------------------------------------------------------------------------------------
class TextStream:
    """The answer's text as tokens arrive: whole characters only, cut before a stop string.

    Each token decodes the tokens since the last point where the text ended on a whole character; a trailing
    U+FFFD (the first bytes of a character still to come) is held back until the next token completes it. ``take()``
    hands out text not sent before, less any tail that could be the start of a stop string, so the pieces streamed
    add up to exactly the text a non-streamed answer holds.
    """

    def __init__(self, tokenizer, stops: list[str]):
        self.tokenizer, self.stops = tokenizer, stops
        self.tokens: list[int] = []
        self.settled, self.settled_text = 0, ""    # tokens[:settled] decode to settled_text, ending on a whole char
        self.text = ""                             # the answer so far
        self.sent = 0                              # characters of text handed out
        self.stopped = False                       # a stop string was found: the text ends before it
        self.final = False                         # no more changes: stopped, or finish() was called
        self._searched = 0

    def add(self, token: int) -> None:
        self.tokens.append(token)
        tail = self.tokenizer.decode(self.tokens[self.settled:])
        if tail.endswith("\ufffd"):
            self._update(self.settled_text + tail.rstrip("\ufffd"))
        else:
            self.settled, self.settled_text = len(self.tokens), self.settled_text + tail
            self._update(self.settled_text)

    def finish(self) -> None:
        """No more tokens: whatever the last ones decode to is part of the answer."""
        if not self.stopped:
            self._update(self.settled_text + self.tokenizer.decode(self.tokens[self.settled:]))
        self.final = True

    def _update(self, text: str) -> None:
        self.text = text
        cut = min((i for s in self.stops if (i := text.find(s, max(0, self._searched - len(s) + 1))) >= 0), default=-1)
        if cut >= 0:
            self.text, self.stopped, self.final = text[:cut], True, True
        self._searched = len(self.text)

    def _held_back(self) -> int:
        """Length of the longest tail of the text that begins some stop string."""
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:k]):
                    longest = k
                    break
        return longest

    def take(self) -> str:
        end = len(self.text) if self.final else len(self.text) - self._held_back()
        piece = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return piece


@dataclass
class Outcome:
    """How one generation ended."""

    finish_reason: str = "abort"       # "stop", "length" or "abort" (the client went away)
    completion_tokens: int = 0
    cached_tokens: int = 0
    request: EngineRequest | None = None


# --- metrics -------------------------------------------------------------------------------------------------------
class Metrics:
    """``/metrics`` in a registry of its own, under vLLM's names; engine counters are read at each scrape."""

    def __init__(self, engine: Engine, model_name: str):
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.engine, self.model_name = engine, model_name
        self.registry = r = CollectorRegistry()
        label = ["model_name"]

        def histogram(name: str, doc: str, buckets) -> Any:
            return Histogram(name, doc, label, buckets=buckets, registry=r).labels(model_name)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token, arrival to first token.",
                              TTFT_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds", "Mean time per output token after the first, "
                              "per request.", TOKEN_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds", "Time between consecutive output tokens.",
                             TOKEN_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Arrival to last token.", E2E_BUCKETS)
        self.success = Counter("vllm:request_success", "Finished requests, by finish reason.",
                               ["model_name", "finished_reason"], registry=r)
        for reason in ("stop", "length", "abort"):
            self.success.labels(model_name, reason)
        r.register(self)
        self.mean_latency = 1.0     # a running mean of e2e latency, for Retry-After

    def collect(self):
        """The engine's own gauges and counters (prometheus_client calls this at every scrape)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        e, stats = self.engine, self.engine.stats
        gauges = [("vllm:num_requests_running", "Requests in the running batch.", len(e.running)),
                  ("vllm:num_requests_waiting", "Requests waiting to be scheduled.", len(e.waiting)),
                  ("vllm:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = all).", e.kv_usage)]
        counters = [("vllm:prompt_tokens", "Prompt tokens of admitted requests.", stats.prompt_tokens),
                    ("vllm:generation_tokens", "Generated tokens.", stats.generated_tokens),
                    ("vllm:num_preemptions", "Preemptions (a sequence's blocks freed, recomputed later).",
                     stats.preemptions),
                    ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_queries),
                    ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_hits),
                    ("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", stats.draft_tokens),
                    ("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", stats.accepted_tokens)]
        for name, doc, value in gauges:
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family
        for name, doc, value in counters:
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], value)
            yield family

    def observe(self, outcome: Outcome) -> None:
        self.success.labels(self.model_name, outcome.finish_reason).inc()
        request = outcome.request
        if request is None or request.first_token_at is None:
            return
        times = list(request.token_times)
        end = times[-1]
        self.ttft.observe(request.first_token_at - request.arrived)
        self.e2e.observe(end - request.arrived)
        if len(times) > 1:
            self.tpot.observe((end - times[0]) / (len(times) - 1))
        for before, after in zip(times, times[1:]):
            self.itl.observe(after - before)
        self.mean_latency = 0.9 * self.mean_latency + 0.1 * (end - request.arrived)

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)
