"""Where the suite's CPU goes: each test's wall time and the CPU seconds of its process and of the child processes it
waited for, written per xdist worker to build/test-cpu/<worker>.jsonl; the summary lists the costliest modules.

On a saturated 2-core machine the suite's length is its CPU seconds over two, so this (not wall time, which counts
waiting on the other worker) says what to make cheaper. Children that outlive the test, or that something other
than the test reaps, are not counted."""
from __future__ import annotations

import json
import os
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest

FOLDER = Path(__file__).resolve().parents[1] / "build" / "test-cpu"
_log = None


def _now() -> tuple[float, float, float]:
    mine, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.monotonic(), mine.ru_utime + mine.ru_stime, children.ru_utime + children.ru_stime


OWNER = "EDL_TEST_CPU_LOG"  # set by the run that logs: a pytest the suite runs as a child (the GPU check's dry run) logs nothing


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _log
    if _log is None and os.environ.setdefault(OWNER, str(os.getpid())) == str(os.getpid()):
        FOLDER.mkdir(parents=True, exist_ok=True)
        _log = open(FOLDER / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.jsonl", "w", buffering=1)
    start = _now()
    yield
    end = _now()
    if _log is not None:
        _log.write(json.dumps({"test": item.nodeid, "wall": round(end[0] - start[0], 2), "cpu": round(end[1] - start[1], 2),
                               "children_cpu": round(end[2] - start[2], 2)}) + "\n")


def costliest_modules(since: float, top: int = 12, folder: Path = FOLDER) -> list[tuple[str, float, float]]:
    """(module, CPU seconds with children, wall seconds) of the runs logged after ``since`` (a time.time()), costliest first."""
    cpu, wall = defaultdict(float), defaultdict(float)
    for log in folder.glob("*.jsonl"):
        if log.stat().st_mtime < since:
            continue
        for line in log.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a line cut short (the run was stopped while writing it)
                continue
            module = row["test"].split("::")[0]
            cpu[module] += row["cpu"] + row["children_cpu"]
            wall[module] += row["wall"]
    return sorted(((m, cpu[m], wall[m]) for m in cpu), key=lambda row: -row[1])[:top]
