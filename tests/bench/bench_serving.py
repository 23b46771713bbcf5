"""The model service under load: a few thousand requests at concurrency 16 with zero errors (issue: make serve),
then an open loop (Poisson arrivals) at half the closed loop's rate: zero errors, latency counted from the due time."""
from __future__ import annotations

from helpers.serving import HttpSender, load_test, mnist_holdout, open_loop_test, read_metrics, start_service

from . import BenchResult, Target


def run(quick: bool) -> BenchResult:
    pixels, _ = mnist_holdout(256)
    payloads = [{"inputs": pixels[i:i + 1].tolist()} for i in range(len(pixels))]
    requests = 500 if quick else 3000
    with start_service() as service:
        report = load_test(service.url + "/predict", payloads, concurrency=[1, 4, 16], max_requests=requests,
                           max_seconds=30 if quick else 120)
        counted = read_metrics(service.url)["predictions_total"]
        at16 = report.find(concurrency=16)
        rate = max(1.0, 0.5 * at16.throughput)
        opened = open_loop_test(HttpSender(service.url + "/predict", payloads), rate=rate, max_requests=requests // 2,
                                max_seconds=15 if quick else 60)
    sent = sum(r.requests for r in report.rows)
    steady = opened.rows[0]
    targets = [
        Target.at_least("requests answered at concurrency 16", at16.requests, requests if not quick else 1, ""),
        Target.at_most("errors at concurrency 16", at16.errors, 0, ""),
        Target.at_most("|predictions_total - inputs sent|", abs(counted - sent), 0, ""),
        Target.at_most("errors in the open loop at half the closed loop's rate", steady.errors, 0, ""),
        Target.at_least("open loop: share of the offered rate answered", steady.achieved / rate, 0.8 if not quick else 0.0, ""),
    ]
    return BenchResult("serving", [report, opened], targets)
