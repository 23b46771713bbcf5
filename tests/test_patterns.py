"""helpers.training.patterns: each program of helpers.training.workloads diagnosed from its own profile; the GPU rules on given figures."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from helpers.training import patterns, workloads

CPU = torch.device("cpu")


def profile_steps(step, steps):
    """The profiling loop the helpers take (Lecture 5b writes its own): one step skipped, one warm-up, then ``steps``."""
    with profile(activities=[ProfilerActivity.CPU], schedule=schedule(wait=1, warmup=1, active=steps)) as prof:
        for _ in range(steps + 2):
            step()
            prof.step()
    return prof


def measure(step, steps=2):
    return patterns.metrics_from_profiler(profile_steps(step, steps), CPU)


@pytest.fixture(scope="module")
def one_thread():
    """The diagnosis reads the structure of a profile; one thread keeps other programs' load from distorting op times."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("make", [lambda: workloads.make_compute_bound(CPU, 256), lambda: workloads.make_launch_bound(CPU, 16),
                                  lambda: workloads.make_sync_bound(CPU, length=6)], ids=["compute", "launch", "sync"])
def test_each_program_is_diagnosed_as_the_pattern_it_reproduces(make, one_thread):
    program = make()
    metrics = measure(program.step)
    verdict, evidence = patterns.diagnose(metrics)
    if program.expected == "synchronisation bound":  # on a CPU the reads bind the step only if they cost a share of it
        assert (verdict == program.expected) == (metrics.sync_stall_share >= patterns.SYNC_STALL_SHARE), evidence
        assert f"{metrics.syncs_per_step:.0f} host reads" in evidence
    else:
        assert verdict == program.expected, evidence


def test_profile_metrics_count_ops_and_host_reads():
    metrics = measure(workloads.make_sync_bound(CPU, length=6).step)
    assert metrics.syncs_per_step == 6  # one .item() per generated token
    assert metrics.device_busy is None and 0 < metrics.op_share <= 1 and 0 <= metrics.sync_stall_share < 1
    four, eight = (measure(workloads.make_launch_bound(CPU, samples=n).step) for n in (4, 8))
    per_sample = (eight.ops_per_step - four.ops_per_step) / 4
    assert four.syncs_per_step == 0 and per_sample >= 6 * 3  # six layers of linear, layer norm and GELU per sample
    assert four.ops_per_step == pytest.approx(4 * per_sample, abs=2)  # ops grow with the samples, one call each


def _gpu_metrics(**changes) -> patterns.ProfileMetrics:
    base = patterns.ProfileMetrics("cuda", 5, 0.01, 20, 10.0, 0.5, 0, 0.0, 0.95, "aten::mm", 0.9)
    return dataclasses.replace(base, **changes)


def test_gpu_side_of_the_diagnosis_reads_how_busy_the_gpu_was():
    assert patterns.diagnose(_gpu_metrics())[0] == "compute bound"
    assert patterns.diagnose(_gpu_metrics(device_busy=0.2, ops_per_step=800))[0] == "launch bound"
    assert patterns.diagnose(_gpu_metrics(syncs_per_step=3, sync_stall_share=0.4, device_busy=0.3))[0] == "synchronisation bound"
    assert patterns.diagnose(_gpu_metrics(syncs_per_step=1, sync_stall_share=0.001))[0] == "compute bound"  # one cheap read


def _cpu_metrics(**changes) -> patterns.ProfileMetrics:
    base = patterns.ProfileMetrics("cpu", 5, 0.02, 300, 8.0, 0.6, 24, 0.008, None, "aten::addmm", 0.4)
    return dataclasses.replace(base, **changes)


def test_frequent_host_reads_on_a_cpu_bind_the_step_only_when_they_cost():
    verdict, evidence = patterns.diagnose(_cpu_metrics())  # 24 reads costing 0.8% of the step: the ops bind it
    assert verdict == "launch bound" and "24 host reads" in evidence and "0.8%" in evidence
    assert patterns.diagnose(_cpu_metrics(sync_stall_share=0.3))[0] == "synchronisation bound"


def test_a_fix_counts_as_faster_only_when_the_ranges_are_apart():
    assert patterns.fix_outcome([10.0, 11.0, 12.0], [8.0, 9.0, 9.5]) == "faster"
    assert patterns.fix_outcome([10.0, 11.0, 12.0], [9.0, 10.5, 8.5]) == "a tie"  # a lower median, overlapping ranges
    assert patterns.fix_outcome([10.0, 11.0], [12.0, 13.0]) == "slower"


def test_profile_patterns_report_all_three(one_thread):
    report = patterns.profile_patterns(profile_steps, "cpu", steps=1, min_run_time=0.01, compute_n=128, launch_samples=8, decode_length=4)
    assert [r.expected for r in report.rows] == ["compute bound", "launch bound", "synchronisation bound"]
    assert all(r.speedup == pytest.approx(r.step_seconds / r.fixed_seconds) for r in report.rows)
    assert all(r.outcome == patterns.fix_outcome([*r.step_range], [*r.fixed_range]) for r in report.rows)
    assert len(report.conclusions()) == 3
    assert report.find(expected="launch bound").verdict == "launch bound"
    assert len(report.plot().collections) == 3  # one point per program


def test_a_profile_without_steps_is_refused_with_what_to_do():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(3).sum()
    with pytest.raises(ValueError, match="call prof.step"):
        patterns.metrics_from_profiler(prof, CPU)
