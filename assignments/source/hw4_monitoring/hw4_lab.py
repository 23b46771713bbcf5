"""Assignment 4's workbench: your tests run against the pipeline and its broken variants; drift data. Do not edit it.

Your tests are graded the way CI runs them: their notebook cell is written to a test file beside a *copy*
of ``hw4_pipeline.py`` (the shipped one, an equivalent rewrite, or one with a single function broken), and
pytest runs that file in a fresh Python process. Nothing your notebook holds in memory reaches that process.
"""
from __future__ import annotations

import ast
import inspect
import json
import linecache
import os
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import hw4_pipeline
import torch

FUNCTIONS = ["scale_pixels", "split_indices", "batches", "accuracy"]
HEADER = "import torch\nfrom hypothesis import given, settings\nfrom hypothesis import strategies as st\n\nimport hw4_pipeline\n\n"

# Runs inside the fresh process: which pipeline functions each test calls, how many examples hypothesis drew.
CONFTEST = '''
import json, sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.internal.observability import add_observability_callback

settings.register_profile("grading", database=None, derandomize=True, deadline=None,
                          suppress_health_check=list(HealthCheck))
settings.load_profile("grading")
REPORT = {"tests": {}, "called": []}
EXAMPLES = {}


def _count(observation, thread_id=None):
    if getattr(observation, "type", None) == "test_case" and getattr(observation, "status", "") != "gave_up":
        name = str(getattr(observation, "property", "")).split("::")[-1].split("[")[0]
        EXAMPLES[name] = EXAMPLES.get(name, 0) + 1


add_observability_callback(_count, all_threads=True)


def pytest_sessionstart(session):
    import hw4_pipeline

    codes = {getattr(hw4_pipeline, f).__code__: f for f in FUNCTIONS}
    called = set()

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            called.add(codes[frame.f_code])

    sys.setprofile(tracer)
    REPORT["_called"] = called


def pytest_runtest_logreport(report):
    if report.when == "call" or report.outcome != "passed":
        name = report.nodeid.split("::")[-1].split("[")[0]
        entry = REPORT["tests"].setdefault(name, {"error": ""})
        if report.outcome != "passed" and not entry["error"]:
            text = report.longreprtext.strip().splitlines()
            entry["error"] = (text[-1] if text else report.outcome)[:300]


def pytest_sessionfinish(session):
    sys.setprofile(None)
    REPORT["called"] = sorted(REPORT.pop("_called", set()))
    for name, entry in REPORT["tests"].items():
        entry["examples"] = EXAMPLES.get(name, 0)
    Path("report.json").write_text(json.dumps(REPORT))
'''


@dataclass
class StudentTests:
    """The notebook cells that define your ``test_*`` functions, as source text, and the test names."""

    names: list[str]
    source: str
    results: dict = field(default_factory=dict)  # pipeline source -> RunReport, so each copy runs once


@dataclass
class RunReport:
    errors: dict[str, str]  # test name -> '' (passed) or the failure's last line
    examples: dict[str, int]  # test name -> examples hypothesis drew (0 for a plain test)
    called: set[str]  # pipeline functions the tests called


def collect_tests(namespace: dict) -> StudentTests:
    """The ``test_*`` functions defined in the notebook (``globals()``), with the full text of their cells."""
    tests = {name: fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)}
    cells: list[str] = []
    for name, fn in tests.items():
        code = getattr(inspect.unwrap(fn), "__code__", None)
        lines = linecache.getlines(code.co_filename) if code else []
        if not lines:
            raise AssertionError(f"the source of {name} cannot be read: define your tests in a notebook cell")
        text = "".join(lines)
        if text not in cells:
            cells.append(text)
    return StudentTests(sorted(tests), HEADER + "\n\n".join(cells))


def function_source(name: str, variant: Callable | str) -> str:
    """``variant`` (a function or its source) as a top-level ``def name(...)``."""
    text = textwrap.dedent(variant if isinstance(variant, str) else inspect.getsource(variant))
    tree = ast.parse(text)
    definition = next(node for node in tree.body if isinstance(node, ast.FunctionDef))
    definition.name = name
    definition.decorator_list = []
    return ast.unparse(definition)


def mutated(name: str, variant: Callable | str, pipeline: str | None = None) -> str:
    """The pipeline's source with function ``name`` replaced by ``variant``; everything else as shipped."""
    pipeline = pipeline if pipeline is not None else Path(hw4_pipeline.__file__).read_text()
    lines = pipeline.splitlines(keepends=True)
    node = next(n for n in ast.parse(pipeline).body if isinstance(n, ast.FunctionDef) and n.name == name)
    return "".join(lines[:node.lineno - 1]) + function_source(name, variant) + "\n" + "".join(lines[node.end_lineno:])


# A process that has imported pytest, hypothesis and torch once; each run is a fork of it (a new process that
# starts with those imports done and nothing of yours), in the copy's own folder. Much faster than a new
# interpreter per run, and just as fresh: neither this notebook nor the forking process ever imports your tests.
FORKER = """
import importlib.metadata, os, sys, signal
import hypothesis, pytest, torch  # noqa: F401 - imported once, inherited by each fork
for plugin in importlib.metadata.entry_points(group="pytest11"):  # pytest's installed plugins too (2 s per run otherwise)
    try:
        plugin.load()
    except Exception:
        pass  # one that cannot load fails the same way, with its message, in pytest's own run below
for line in sys.stdin:
    folder, timeout = line.split("\\t")
    child = os.fork()
    if child == 0:
        os.setsid()
        os.chdir(folder)
        sys.path.insert(0, folder)
        sys.stdout = sys.stderr = open(os.path.join(folder, "pytest.log"), "w")
        signal.alarm(int(float(timeout)))
        code = pytest.main(["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", folder, "-c", os.devnull, "test_student.py"])
        sys.stdout.flush()
        os._exit(int(code))
    _, status = os.waitpid(child, 0)
    print(status, flush=True)
"""
_forker: subprocess.Popen | None = None
_forker_parent = 0  # the process that started _forker: a forked child starts its own (the pipes and the wait are its parent's)


def _fork_runner() -> subprocess.Popen:
    global _forker, _forker_parent
    if _forker is None or _forker_parent != os.getpid() or _forker.poll() is not None:
        _forker_parent = os.getpid()
        env = {key: value for key, value in os.environ.items() if not key.startswith("PYTHON")}
        _forker = subprocess.Popen([sys.executable, "-I", "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True, env={**env, "PYTHONDONTWRITEBYTECODE": "1"})
    return _forker


def run_in_fresh_process(tests: StudentTests, pipeline: str | None = None, timeout: float = 120) -> RunReport:
    """pytest on your tests in a new process, against ``pipeline`` (source text; default: as shipped)."""
    pipeline = pipeline if pipeline is not None else Path(hw4_pipeline.__file__).read_text()
    if pipeline in tests.results:
        return tests.results[pipeline]
    with tempfile.TemporaryDirectory(prefix="hw4-tests-") as folder:
        where = Path(folder)
        (where / "hw4_pipeline.py").write_text(pipeline)
        (where / "test_student.py").write_text(tests.source)
        (where / "conftest.py").write_text(f"FUNCTIONS = {FUNCTIONS!r}\n" + CONFTEST)
        runner = _fork_runner()
        runner.stdin.write(f"{folder}\t{timeout}\n")
        runner.stdin.flush()
        status = int(runner.stdout.readline() or -1)
        log = (where / "pytest.log").read_text(errors="replace") if (where / "pytest.log").exists() else ""
        if os.WIFSIGNALED(status) if status >= 0 else True:
            raise AssertionError(f"your tests did not finish within {timeout:.0f} s in a fresh process: make them smaller\n{log[-800:]}")
        report_file = where / "report.json"
        if not report_file.exists():
            raise AssertionError(f"your tests did not run in a fresh process (as pytest would run them):\n{log[-1500:]}")
        report = json.loads(report_file.read_text())
    errors = {name: entry["error"] for name, entry in report["tests"].items()}
    missing = [name for name in tests.names if name not in errors]
    if missing:
        raise AssertionError(f"pytest did not collect {missing} from your cell: is every test a plain top-level function?\n{log[-1000:]}")
    result = RunReport(errors, {name: entry["examples"] for name, entry in report["tests"].items()}, set(report["called"]))
    tests.results[pipeline] = result
    return result


def run_tests(tests: StudentTests, pipeline: str | None = None) -> dict[str, str]:
    """{test name: '' when it passed, else the failure's last line}, from a fresh process."""
    return run_in_fresh_process(tests, pipeline).errors


def functions_called(tests: StudentTests) -> set[str]:
    """Which pipeline functions the tests called (traced in the fresh process)."""
    return run_in_fresh_process(tests).called


def property_tests(tests: StudentTests) -> list[str]:
    """The tests for which hypothesis generated several examples (a real @given test, run)."""
    return [name for name, count in run_in_fresh_process(tests).examples.items() if count >= 2]


def caught(tests: StudentTests, name: str, broken: Callable | str, clean: str | None = None) -> bool:
    """True when at least one test fails on the pipeline with ``name`` replaced by ``broken``.

    The tests must first pass on the correct pipeline (``clean``: its source, default as shipped); tests
    that fail on correct code catch nothing: that is an error, not a catch.
    """
    failing = {test: error for test, error in run_tests(tests, clean).items() if error}
    if not tests.names or failing:
        raise AssertionError(f"your tests must first pass on the correct pipeline; failing: {failing or 'no tests'}")
    return any(run_tests(tests, mutated(name, broken, clean)).values())


def digits_pixels() -> torch.Tensor:
    """The course's training digits as pixels (N, 784) in 0..1, for the drift part."""
    from helpers.core import load_digits

    return hw4_pipeline.scale_pixels(load_digits(train=True).images)


def heldout_pixels() -> torch.Tensor:
    """The course's held-out digits as pixels (N, 784) in 0..1: the live stream of the drift part is drawn from these."""
    from helpers.core import load_digits

    return hw4_pipeline.scale_pixels(load_digits(train=False).images)


# The pipeline rewritten with the same behaviour and other code: tests must pass on it too (they may test only
# what the docstrings promise). The hidden tests check that with run_tests(tests, EQUIVALENT_PIPELINE).
EQUIVALENT_PIPELINE = '''"""The pipeline rewritten: the same behaviour, other code."""
import torch


def scale_pixels(images):
    if images.dtype != torch.uint8:
        raise TypeError(f"scale_pixels takes uint8 images, got {images.dtype}")
    return images.reshape(images.shape[0], -1).to(torch.float32).div(255.0)


def split_indices(n, test_share, seed=0):
    if not 0 < test_share < 1:
        raise ValueError(f"test_share must lie in (0, 1), got {test_share}")
    generator = torch.Generator()
    generator.manual_seed(seed)
    order = torch.randperm(n, generator=generator)
    cut = round(n * test_share)
    test, train = order[:cut], order[cut:]
    return train, test


def batches(pixels, labels, size):
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    out, start = [], 0
    while start < len(labels):
        out.append((pixels[start:start + size], labels[start:start + size]))
        start += size
    return out


def accuracy(logits, labels):
    if len(logits) != len(labels):
        raise ValueError(f"{len(logits)} rows of logits for {len(labels)} labels")
    hits = logits.argmax(dim=1).eq(labels)
    return hits.to(torch.float32).mean().item()
'''
