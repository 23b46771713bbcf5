"""The language-model server under open-loop load: continuous against static batching, plus KV-cache and speculative figures.

vLLM's serving-benchmark method: Poisson arrivals at a set request rate, each request streamed, TTFT and time per
output token (TPOT) and inter-token latency (ITL) measured at the client, output tokens per second over the run.
Both schedulers serve the same requests at the same rates, one server process at a time, on 127.0.0.1.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from helpers.core.report import Report, column
from helpers.serving import (
    CompletionsSender,
    Engine,
    OpenLoopReport,
    encode_text,
    language_model,
    open_loop_test,
    python_corpus,
    speculative_decode,
    start_llm_service,
    target_only,
)

from . import BenchResult, Target

# Output lengths vary, as real answers do, most short and a few long: a static batch runs as long as its longest
# member while its finished members hold their slots, the case continuous batching is for.
OUTPUT_MIX = [8, 24, 16, 128, 8, 48, 16, 96]
MAX_BATCH = 8


@dataclass
class Figure:
    what: str = column("figure")
    value: float = column("value", ".3g")
    unit: str = column("unit")


class Figures(Report):
    title = "KV cache and speculative decoding (in process)"


def prompts_from_corpus(n: int = 32, length: int = 40) -> list[str]:
    data, _ = python_corpus()
    text = bytes(data[: 200_000].tolist()).decode("utf-8", errors="ignore")
    lines = [line.strip() for line in text.splitlines() if len(line.strip()) > 20]
    return [line[:length] for line in lines[:: max(len(lines) // n, 1)][:n]]


def kv_and_speculative(quick: bool) -> tuple[list[Figure], list[Target]]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs: on a CPU a model this small gains little from a second thread
    try:
        return _kv_and_speculative(quick)
    finally:
        torch.set_num_threads(threads)


def _kv_and_speculative(quick: bool) -> tuple[list[Figure], list[Target]]:
    target, _ = language_model("target")
    draft, _ = language_model("draft")
    prompt = encode_text("def parse_args(argv):\n    ")
    new = 48 if quick else 160
    start = time.perf_counter()
    cached = Engine(target).generate([prompt], new)[0]
    with_cache = time.perf_counter() - start
    plain = target_only(target, prompt, new)
    assert cached == plain.tokens, "the paged KV cache changed a greedy answer"
    fast = speculative_decode(target, draft, prompt, new, k=4)
    figures = [Figure(f"decode {new} tokens, no KV cache", plain.seconds / new * 1e3, "ms/token"),
               Figure(f"decode {new} tokens, KV cache", with_cache / new * 1e3, "ms/token"),
               Figure("KV cache speed-up", plain.seconds / with_cache, "x"),
               Figure("speculative: acceptance rate (k=4)", fast.acceptance_rate, ""),
               Figure("speculative: target calls per token", fast.target_calls_per_token, ""),
               Figure("speculative: speed-up over the target alone", plain.seconds / fast.seconds, "x")]
    targets = [Target.at_least("speculative greedy output equals the target's (1 = yes)", float(fast.tokens == plain.tokens), 1),
               Target.at_most("speculative target calls per token", fast.target_calls_per_token, 0.9)]
    return figures, targets


def run(quick: bool) -> BenchResult:
    prompts = prompts_from_corpus()
    # the top rate is past what static batching answers on a CPU, so its queue grows while continuous keeps up longer
    rates = [32.0] if quick else [8.0, 32.0, 64.0]
    requests, seconds = (48, 4.0) if quick else (128, 10.0)
    rows = {}
    for scheduler in ("static", "continuous"):
        # one torch thread on a CPU: the model is small, and the load generator needs the other core
        with start_llm_service(scheduler=scheduler, max_batch=MAX_BATCH, torch_threads=1) as service:
            sender = CompletionsSender(service.url, prompts, OUTPUT_MIX)
            open_loop_test(sender, 4.0, max_requests=4, max_seconds=1.0)   # warm-up
            for row in open_loop_test(sender, rates, max_requests=requests, max_seconds=seconds, seed=0).rows:
                row.mode = f"{scheduler}, {row.offered:g} req/s"
                rows[scheduler, row.offered] = row
    report = OpenLoopReport([rows[s, r] for r in rates for s in ("static", "continuous")],
                            [f"Poisson arrivals, {requests} requests or {seconds:g} s per rate; output lengths cycle "
                             f"through {OUTPUT_MIX}; up to {MAX_BATCH} requests per batch; greedy; TTFT from each request's "
                             "scheduled send time."])
    report.title = "Language-model server under open-loop load: static against continuous batching"
    top = max(rates)
    static, continuous = rows["static", top], rows["continuous", top]
    errors = sum(r.errors for r in rows.values())
    timing = [Target.at_least(f"continuous / static output tokens/s at {top:g} req/s", continuous.output_tps / static.output_tps, 1.2),
              Target.at_least(f"static / continuous median TTFT at {top:g} req/s (> 1: continuous lower)",
                              static.ttft_p50 / continuous.ttft_p50, 1.0)]
    figures, spec_targets = kv_and_speculative(quick)
    if quick:  # a quick run (the test suite's, often on a busy machine) shows the ratios without judging them
        timing = [Target(f"{t.what} (quick run: not judged)", t.measured, t.required, "n/a") for t in timing]
    targets = [Target.at_most("errors, all runs", errors, 0)] + timing + spec_targets
    return BenchResult("llm", [report, Figures(figures)], targets)
