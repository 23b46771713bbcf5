"""Shared fixtures: the repository root and the kit's notebooks."""
from __future__ import annotations

import os
import time
from pathlib import Path

from helpers.core.procs import available_cores  # imports no torch
from tests.notebook_runs import THREAD_VARIABLES  # imports no torch


def _share_the_cores_between_workers() -> None:
    """Under pytest-xdist (make test runs TEST_WORKERS of them), each worker and every process it starts gets its share of
    the cores as threads: two workers at torch's default of one thread per core would run OpenMP's teams on cores the
    other worker holds, which on 2 cores made a forward pass several times slower than on one thread alone. Before
    anything imports torch, which fixes its thread count then (importing the kit's helpers below does)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers <= 1:
        return
    share = str(max(1, available_cores() // workers))
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, share)


_share_the_cores_between_workers()

import pytest  # noqa: E402 - the thread share must be in the environment first

import helpers  # noqa: E402,F401  (quietens torch's import-time warnings before any test imports torch pieces)
from helpers.course import sealed  # noqa: E402
from tests.cpu_accounting import costliest_modules, pytest_runtest_protocol  # noqa: E402,F401 (a hook)

ROOT = Path(__file__).resolve().parents[1]
LOCKED = sealed.locked(ROOT / "assignments" / "source")  # cloned without the instructor key
KEY_USED = os.environ.get("EDL_INSTRUCTOR_KEY") == "unlocked"  # .ci/run unlocked with the key: nothing may be skipped as sealed
HEAVY_LANES = ("notebooks", "grading", "browser", "slow")  # a module in one of these runs for minutes; the first, longest


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _close_figures():
    """Reports draw with pyplot; close what a test opened so hundreds of figures do not pile up."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.fixture(autouse=True)
def _no_import_hook_left_behind():
    """A test that runs an assignment's notebook in this process must take its import hook away again (kit_use.scoped)."""
    import builtins

    before = builtins.__import__
    yield
    assert builtins.__import__ is before, "this test left an assignment's import hook installed: run notebooks inside kit_use.scoped()"


def pytest_sessionstart(session):
    if KEY_USED and LOCKED:
        pytest.exit("the instructor key was used, yet assignments/source is still ciphertext: git-crypt unlock failed", returncode=3)


class SealedTests(pytest.File):
    """A test module stored encrypted (the instructor material): one test that says so, where the key is missing."""

    def collect(self):
        yield SealedModule.from_parent(self, name="sealed")


class SealedModule(pytest.Item):
    def runtest(self):
        pytest.skip(sealed.MESSAGE)

    def reportinfo(self):
        return self.path, None, f"{self.path.name} (sealed)"


def pytest_pycollect_makemodule(module_path, parent):
    """A test module that is git-crypt ciphertext is not imported: it becomes one skipped test."""
    if sealed.is_ciphertext(module_path):
        return SealedTests.from_parent(parent, path=module_path)
    return None


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` run where CUDA is; elsewhere each is skipped and says so (``make test-gpu`` runs them on a GPU).
    Tests marked ``instructor`` need the sealed instructor material: on a checkout without the key each is skipped."""
    import torch

    _heavy_modules_first(items)
    if LOCKED:
        for item in items:
            if "instructor" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=sealed.MESSAGE))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (this machine has none): run make test-gpu on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _heavy_modules_first(items: list) -> None:
    """Modules by their heaviest lane (notebooks, then grading, ...), each module's tests together and in order:
    pytest-xdist hands out whole modules (--dist loadfile) as workers come free, so the long ones start first."""
    def module(item) -> str:
        return item.nodeid.split("::")[0]

    rank: dict[str, int] = {}
    for item in items:
        lanes = [i for i, lane in enumerate(HEAVY_LANES) if item.get_closest_marker(lane)]
        rank[module(item)] = min([rank.get(module(item), len(HEAVY_LANES)), *lanes])
    items.sort(key=lambda item: rank[module(item)])


def pytest_configure(config):
    config._edl_started = time.time()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The modules that cost the most CPU; and say when the browser checks or the instructor material's tests did not
    run, and why."""
    costly = costliest_modules(since=getattr(config, "_edl_started", 0))
    if costly and len(terminalreporter.stats.get("passed", [])) + len(terminalreporter.stats.get("failed", [])) >= 100:
        terminalreporter.write_sep("=", "CPU seconds by module (the test processes and the children they reaped)")
        for module, cpu, wall in costly:
            terminalreporter.write_line(f"{cpu:8.0f} s CPU {wall:8.0f} s wall  {module}")
    sealed_skips = [r for r in terminalreporter.stats.get("skipped", []) if sealed.MESSAGE in str(r.longrepr)]
    if sealed_skips:
        terminalreporter.write_sep("=", f"{len(sealed_skips)} tests skipped: {sealed.MESSAGE}", yellow=True)
    skipped = [r for r in terminalreporter.stats.get("skipped", []) if "browser" in r.keywords]
    if not skipped:
        return
    reason = skipped[0].longrepr[2] if isinstance(skipped[0].longrepr, tuple) else str(skipped[0].longrepr)
    reason = reason.removeprefix("Skipped: ")
    terminalreporter.write_sep("=", f"browser checks skipped ({len(skipped)}): {reason}; make browser-tool installs Chromium where it can",
                               yellow=True)


@pytest.fixture(scope="session")
def smollm_reference():
    """transformers over SmolLM2's GGUF file, fp32 on the CPU: (model, tokenizer), the reference the kit's LLM code is
    checked against, loaded once for every module that needs it (about 20 s)."""
    import torch
    from transformers import AutoTokenizer

    from helpers.serving.smollm import gguf_path
    from tests.bench.bench_llm import load_reference

    path = gguf_path()
    return load_reference(torch.device("cpu")), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
