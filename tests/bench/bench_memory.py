"""training_memory on a transformer of more than a billion parameters built on the meta device: time and RAM.

Each estimate runs in a fresh Python process, so its peak RSS (torch's import included) and its
wall time (interpreter start included) are its own. The peak is the process's VmHWM on Linux:
``ru_maxrss`` would also count the parent's resident memory at the fork (Linux carries it over the
exec), so a bench run that had grown large before this one would inflate it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.core.report import Report, column, format_bytes, format_seconds

from . import BenchResult, Target, full_runs_only

ROOT = Path(__file__).resolve().parents[2]
CHILD = """
import json, resource, sys, time
def peak_rss_bytes():
    try:
        with open("/proc/self/status") as status:  # this process image's own high-water mark
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)
start = time.perf_counter()
import torch
from helpers.core.memory import training_memory
from helpers.core.models import count_parameters, transformer_lm
size, batch, seq, optimizer, amp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5] == "amp"
with torch.device("meta"):
    model = transformer_lm(size)
began = time.perf_counter()
report = training_memory(model, model.example_input(batch, seq), optimizer, amp=amp)
print(json.dumps({"parameters": count_parameters(model), "peak_bytes": report.peak_bytes, "phase": report.peak_phase,
                  "estimate_s": time.perf_counter() - began, "process_s": time.perf_counter() - start,
                  "max_rss_bytes": peak_rss_bytes()}))
"""


@dataclass
class EstimateRun:
    model: str = column("model")
    parameters: int = column("parameters", ",")
    setting: str = column("batch x sequence, optimizer")
    peak_bytes: int = column("estimated peak", format_bytes)
    phase: str = column("peak in")
    estimate_s: float = column("estimate", format_seconds)
    process_s: float = column("whole process", format_seconds)
    max_rss_bytes: int = column("peak RSS", format_bytes)


class BigEstimate(Report):
    title = "training_memory of a meta-device transformer, each in a fresh process"


def estimate_in_fresh_process(size: str, batch: int, seq: int, optimizer: str, amp: bool) -> EstimateRun:
    """Run one estimate in a new interpreter and return what it reports about itself."""
    started = time.perf_counter()
    args = [sys.executable, "-c", CHILD, size, str(batch), str(seq), optimizer, "amp" if amp else "fp32"]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"the estimate for transformer {size!r} failed:\n{done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_s"] = time.perf_counter() - started  # wall time seen from outside: start-up and import included
    return EstimateRun(model=f"TransformerLM {size}", setting=f"{batch} x {seq}, {optimizer}{' + AMP' if amp else ''}", **result)


def run(quick: bool) -> BenchResult:
    settings = [("1.3b", 1, 1024, "adam", False)] + ([] if quick else [("1.3b", 8, 1024, "adam", True)])
    rows = [estimate_in_fresh_process(*s) for s in settings]
    report = BigEstimate(rows)
    targets = []
    for row in rows:
        targets += [
            Target.at_least(f"{row.setting}: parameters (billions)", row.parameters / 1e9, 1.0),
            *full_runs_only([Target.at_most(f"{row.setting}: whole process, seconds", row.process_s, 60, " s")], quick),
            Target.at_most(f"{row.setting}: peak RSS, GiB", row.max_rss_bytes / 2**30, 2, " GiB"),
        ]
    return BenchResult("memory", [report], targets)
