"""helpers.core.timing: the interleaved rounds every comparison of timings in the kit goes through."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from helpers.core.timing import Turns, time_interleaved


def test_functions_take_turns_after_one_warm_up_each():
    calls = []
    turns = time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3)
    assert calls == ["a", "b"] * 4  # one warm-up each, then rounds taken in turn
    assert set(turns) == {"a", "b"} and all(0 <= t.fastest <= t.median for t in turns.values())


def test_the_fastest_round_finds_each_functions_own_cost():
    # sleeping only ever overshoots, so the fastest round is close to the time asked for, even on a busy machine
    turns = time_interleaved({"20 ms": lambda: time.sleep(0.02), "80 ms": lambda: time.sleep(0.08)}, rounds=3)
    assert 0.02 <= turns["20 ms"].fastest and 0.08 <= turns["80 ms"].fastest
    assert 1.5 < turns["80 ms"].fastest / turns["20 ms"].fastest < 4.5  # 4 on a quiet machine; waking late shrinks it


def test_blocks_of_timeit_count_when_a_minimum_run_time_is_given():
    calls = []

    def nap():
        calls.append(1)
        time.sleep(0.001)

    turns = time_interleaved({"1 ms": nap}, rounds=2, min_run_time=0.05)
    assert len(calls) > 2 * 2  # a round is many calls (timeit's blocks), not one
    assert 0.001 <= turns["1 ms"].fastest < 0.025  # seconds per call, not per block or per round (>= 0.05 s)


def test_spread_is_median_over_fastest():
    assert Turns(0.5, 1.0).spread == 2.0 and Turns(0.0, 1.0).spread == float("inf")
    with pytest.raises(ValueError, match="rounds"):
        time_interleaved({"a": lambda: None}, rounds=0)


def test_the_suites_cpu_summary_adds_up_each_modules_tests_across_workers_and_skips_old_logs(tmp_path):
    import json
    import os

    from tests.cpu_accounting import costliest_modules

    rows = {"gw0": [("tests/a.py::one", 1.0, 2.0, 3.0), ("tests/b.py::x", 1.0, 0.5, 0.0)], "gw1": [("tests/a.py::two", 4.0, 1.0, 0.0)]}
    for worker, tests in rows.items():
        (tmp_path / f"{worker}.jsonl").write_text("".join(json.dumps({"test": t, "wall": w, "cpu": c, "children_cpu": k}) + "\n"
                                                          for t, w, c, k in tests))
    (tmp_path / "old.jsonl").write_text(json.dumps({"test": "tests/c.py::t", "wall": 1, "cpu": 99, "children_cpu": 0}) + "\n")
    with (tmp_path / "gw1.jsonl").open("a") as log:
        log.write('{"test": "tests/a.py::cut sho')  # stopped while writing
    os.utime(tmp_path / "old.jsonl", (1000, 1000))
    assert costliest_modules(since=2000, folder=tmp_path) == [("tests/a.py", 6.0, 5.0), ("tests/b.py", 0.5, 1.0)]


def test_each_pytest_worker_runs_torch_on_its_share_of_the_cores():
    """Two workers at torch's default (a thread per core) make both cores' OpenMP teams wait on each other: the share
    must be in the environment before the suite's conftest imports the kit, which imports torch."""
    import os
    import subprocess
    import sys

    from helpers.core.procs import available_cores

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    code = "import tests.conftest, torch; print(torch.get_num_threads())"
    threads = subprocess.run([sys.executable, "-c", code], env={**env, "PYTEST_XDIST_WORKER_COUNT": "2"}, cwd=Path(__file__).parents[1],
                             capture_output=True, text=True, check=True, timeout=120).stdout.split()[-1]
    assert int(threads) == max(1, available_cores() // 2)
