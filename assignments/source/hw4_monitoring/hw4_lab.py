"""Assignment 4's workbench: running your tests against the pipeline and its broken variants, drift data. Do not edit it."""
from __future__ import annotations

import inspect
import sys
import traceback
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

import hw4_pipeline

FUNCTIONS = ["scale_pixels", "split_indices", "batches", "accuracy"]


def collect_tests(namespace: dict) -> dict[str, Callable]:
    """The test_* functions defined in the notebook (``globals()``)."""
    return {name: fn for name, fn in namespace.items() if name.startswith("test_") and callable(fn)}


def run_tests(tests: dict[str, Callable]) -> dict[str, str]:
    """Run each test; {name: ''} when it passed, else the failure's last line."""
    results = {}
    for name, test in tests.items():
        try:
            test()
            results[name] = ""
        except Exception as err:  # noqa: BLE001 - any exception is a failing test
            results[name] = f"{type(err).__name__}: {err}".splitlines()[0][:200] or traceback.format_exc(limit=1)
    return results


@contextmanager
def replaced(name: str, broken: Callable) -> Iterator[None]:
    """Within the block, hw4_pipeline.<name> is ``broken`` (tests that import the module see the variant)."""
    original = getattr(hw4_pipeline, name)
    setattr(hw4_pipeline, name, broken)
    try:
        yield
    finally:
        setattr(hw4_pipeline, name, original)


def caught(tests: dict[str, Callable], name: str, broken: Callable) -> bool:
    """True when at least one test fails with hw4_pipeline.<name> replaced by ``broken``.

    Tests that already fail on the correct code catch nothing: that is an error, not a catch.
    """
    failing = {test: error for test, error in run_tests(tests).items() if error}
    if not tests or failing:
        raise AssertionError(f"your tests must first pass on the correct pipeline; failing: {failing or 'no tests'}")
    with replaced(name, broken):
        return any(run_tests(tests).values())


def functions_called(tests: dict[str, Callable]) -> set[str]:
    """Which pipeline functions the tests call (traced while they run)."""
    targets = {getattr(hw4_pipeline, f).__code__: f for f in FUNCTIONS}
    seen: set[str] = set()

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code in targets:
            seen.add(targets[frame.f_code])
        return None

    sys.settrace(tracer)
    try:
        run_tests(tests)
    finally:
        sys.settrace(None)
    return seen


def is_property_test(test: Callable) -> bool:
    """A hypothesis @given test."""
    return hasattr(test, "hypothesis") or "given" in inspect.getsource(test).split("def ")[0]


def digits_pixels() -> torch.Tensor:
    """The course's training digits as pixels (N, 784) in 0..1, for the drift part."""
    from helpers.core.data import load_digits

    return hw4_pipeline.scale_pixels(load_digits(train=True).images)
