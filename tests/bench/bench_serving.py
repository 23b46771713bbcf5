"""The model service under load: a few thousand requests at concurrency 16 with zero errors (issue: make serve)."""
from __future__ import annotations

from helpers.serving import load_test, mnist_holdout, read_metrics, start_service

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
    sent = sum(r.requests for r in report.rows)
    targets = [
        Target.at_least("requests answered at concurrency 16", at16.requests, requests if not quick else 1, ""),
        Target.at_most("errors at concurrency 16", at16.errors, 0, ""),
        Target.at_most("|predictions_total - inputs sent|", abs(counted - sent), 0, ""),
    ]
    return BenchResult("serving", [report], targets)
