"""helpers.training.profiling and helpers.training.workloads: the profilers' readings, the anomaly demo, and the programs' fixes."""
from __future__ import annotations

import json
import time

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function, schedule, tensorboard_trace_handler

from helpers.training import profiling, workloads

CPU = torch.device("cpu")


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def hot_function():
    spin(0.05)  # 25x the cold function: on a loaded machine a preempted time slice cannot close that gap


def cold_function():
    spin(0.002)


def two_parts():
    hot_function()
    cold_function()


def test_cprofile_ranks_the_function_that_takes_the_time():
    report = profiling.cprofile(two_parts, repeat=2, rounds=2)
    by_name = {r.function.split(" (")[0]: r for r in report.rows}
    assert report.rows[0].function.startswith(("spin", "<built-in method time.perf_counter>"))
    assert by_name["hot_function"].calls == 4 and by_name["two_parts"].calls == 4  # 2 calls in each of 2 rounds
    assert len(report.profiled_rounds) == len(report.plain_rounds) == 2
    assert by_name["hot_function"].total_seconds > 2 * by_name["cold_function"].total_seconds
    assert report.plain_seconds > 0 and report.overhead == pytest.approx(report.profiled_seconds / report.plain_seconds)


def test_cprofile_overhead_is_judged_against_the_rounds_spread():
    slower = profiling.PythonProfile([], 1.25, 1.05, [1.2, 1.3, 1.25], [1.0, 1.1, 1.05])
    assert slower.overhead_verdict == "slower" and "slower in every round" in slower.notes[0]
    tie = profiling.PythonProfile([], 0.94, 1.0, [0.9, 1.1, 0.94], [1.0, 0.95, 1.2])  # a lower median, overlapping ranges
    assert tie.overhead_verdict == "a tie" and "a tie" in tie.notes[0] and "slower" not in tie.notes[0]


def test_collapsed_stacks_give_own_and_total_shares():
    text = "main (a.py:1);_run_for (w.py:2);step (w.py:3);decode (w.py:4) 6\n" \
           "main (a.py:1);_run_for (w.py:2);step (w.py:3);train (w.py:5) 2\n" \
           "main (a.py:1);import torch (i.py:1) 12\n" \
           "garbage line\n"
    rows, samples = profiling.parse_collapsed_stacks(text, within="_run_for")
    shares = {r.function.split(" (")[0]: (r.own_share, r.total_share) for r in rows}
    assert samples == 8
    assert shares["decode"] == (0.75, 0.75) and shares["train"] == (0.25, 0.25) and shares["step"] == (0.0, 1.0)
    assert "import torch" not in shares
    assert profiling.parse_collapsed_stacks(text)[1] == 20


def test_py_spy_failures_are_explained_not_raised():
    status, why = profiling.explain_py_spy_failure(1, "Error: Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'")
    assert status == "cannot attach" and "ptrace" in why and "SYS_PTRACE" in why
    status, why = profiling.explain_py_spy_failure(2, "Error: Failed to find python version from target process")
    assert status == "failed" and "python version" in why


@pytest.mark.slow  # starts real processes: not in the unit lane
def test_py_spy_samples_a_workload_or_says_why_not():
    report = profiling.py_spy("input_pipeline", seconds=1, rate=100)
    if profiling.find_py_spy() is None:
        assert report.status == "not installed"
        return
    assert report.status in ("ok", "cannot attach"), report.table()
    if report.status == "cannot attach":
        assert "ptrace" in report.table()
        return
    assert report.samples > 0 and report.output.exists()
    # nearly every counted sample is in the loop (one of 116 fell between two steps once, on a loaded machine)
    assert report.share_of("make_input_pipeline.<locals>.step") > 0.9
    assert sum(f.own_share for f in report.functions) == pytest.approx(1.0)
    assert report.share_of("decode_batch") > 0


def test_op_table_tabulates_a_scheduled_profile_and_finds_its_trace(tmp_path):
    a = torch.randn(128, 128)
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=3),
                 on_trace_ready=tensorboard_trace_handler(str(tmp_path))) as prof:
        for _ in range(5):
            with record_function("step"):
                (a @ a).relu()
            prof.step()
    report = profiling.op_table(prof, device="cpu", trace_folder=tmp_path)
    assert report.trace is not None and report.trace.is_relative_to(tmp_path) and report.steps == 3
    events = json.loads(report.trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)
    mm = next(r for r in report.rows if r.op == "aten::mm")
    assert mm.calls == 3 and str(report.trace) in report.table()  # the two skipped steps are not counted


def test_fixed_programs_compute_the_same_results():
    launch = workloads.make_launch_bound(CPU, samples=5)
    assert torch.allclose(torch.cat(launch.step()), launch.fixed(), atol=1e-5)
    sync = workloads.make_sync_bound(CPU, length=5)
    assert sync.step() == sync.fixed()
    compute = workloads.make_compute_bound(CPU, 64)
    exact, fast = compute.step(), compute.fixed()
    assert ((exact - fast.float()).norm() / exact.norm()).item() < 0.05


def test_workload_command_runs_a_workload_for_a_while():
    assert workloads.main(["launch_bound", "--seconds", "0"]) == 0
