"""helpers.distributed.ddp on real gloo groups: DDP's buckets follow bucket_cap_mb, no_sync skips all-reduces, the scaling model is consistent."""
from __future__ import annotations

import contextlib
import sys

import cloudpickle
import pytest
from torch import nn

from helpers.distributed.comm_models import Link
from helpers.distributed.ddp import accumulation_demo, bucket_sweep, gradient_bytes, mlp, scaling

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the accumulation steps below run in the workers

pytestmark = pytest.mark.slow


def test_bucket_cap_sets_the_number_of_buckets_and_small_buckets_start_early():
    sweep = bucket_sweep(caps_mb=(0.2, 100), width=256, depth=4, batch=8, steps=2)  # 0.2 MB < one layer: DDP closes a bucket once it reaches the cap
    small, large = sweep.rows
    layer_bytes = 256 * 256 * 4
    assert large.buckets == 1 and large.largest_bucket == gradient_bytes(mlp(256, 4))
    assert small.buckets == 4 and small.largest_bucket <= layer_bytes + 256 * 4  # one layer (weight + bias) per bucket
    assert small.first_launch_pct < large.first_launch_pct == pytest.approx(100)
    assert all(r.step_seconds > 0 and r.compute_seconds > 0 and r.all_reduce_seconds > 0 and r.one_bucket_seconds > 0 for r in sweep.rows)
    assert all(r.hidden_low <= r.hidden_pct <= r.hidden_high for r in sweep.rows if not r.is_baseline) and sweep.noise_pct >= 0  # the range holds the median
    # a cap that makes one bucket is the baseline's own setup: no hidden share, and its gap from the baseline counts as noise
    assert large.is_baseline and large.hidden_pct is None and sweep.noise_pct >= max(abs(large.hidden_low), abs(large.hidden_high))


def accumulate(model, micro_batches, no_sync):
    model.zero_grad(set_to_none=False)
    for i, (x, y) in enumerate(micro_batches):
        with model.no_sync() if no_sync and i < len(micro_batches) - 1 else contextlib.nullcontext():
            (nn.functional.mse_loss(model(x), y) / len(micro_batches)).backward()


def forgets_the_scale(model, micro_batches, no_sync):
    model.zero_grad(set_to_none=False)
    for x, y in micro_batches:
        nn.functional.mse_loss(model(x), y).backward()


def test_no_sync_all_reduces_once_per_update_with_the_same_gradients():
    demo = accumulation_demo(accumulate, micro_batches=3, width=64, depth=2, batch=4, repeats=1)
    every, once = demo.rows
    assert every.same_gradients and once.same_gradients
    assert every.all_reduces_per_update == 3 * once.all_reduces_per_update
    assert every.bytes_per_update == 3 * once.bytes_per_update == 3 * gradient_bytes(mlp(64, 2))
    assert len(every.group_fastest) == 3 and every.seconds_per_update <= every.slowest_update
    assert demo.verdict().startswith(("no_sync() was faster", "no_sync() was slower", "a tie"))
    wrong = accumulation_demo(forgets_the_scale, micro_batches=3, width=64, depth=2, batch=4, repeats=1)
    assert not any(r.same_gradients for r in wrong.rows)


def test_accumulation_verdict_needs_every_group_past_the_noise():
    from helpers.distributed.ddp import AccumulationDemo, AccumulationRun

    def demo(every, once):
        return AccumulationDemo([AccumulationRun("every", 8, 0, min(every), max(every), True, every),
                                 AccumulationRun("no_sync", 2, 0, min(once), max(once), True, once)])
    assert demo([0.10, 0.11, 0.10], [0.05, 0.06, 0.05]).verdict().startswith("no_sync() was faster")
    assert demo([0.10, 0.20, 0.10], [0.08, 0.09, 0.08]).verdict().startswith("a tie")  # one group's spread (0.10) swamps the 0.02 gap
    assert demo([0.05, 0.05, 0.05], [0.10, 0.10, 0.10]).verdict().startswith("no_sync() was slower")


def test_scaling_measures_small_n_and_models_the_rest():
    report = scaling(world_sizes=(1, 2), steps=2, link=Link(alpha=1e-4, beta=1e-9), model_workers=(4, 64))
    by_n = {r.workers: r for r in report.rows}
    assert by_n[1].ran_here and by_n[2].ran_here and not by_n[64].ran_here
    assert by_n[1].measured_speedup == 1.0 and by_n[1].model_speedup == pytest.approx(1.0)
    assert by_n[64].model_comm > by_n[4].model_comm > by_n[2].model_comm  # more rounds with more workers
    assert by_n[64].model_compute == pytest.approx(by_n[1].model_compute / 64)
    assert by_n[2].error == pytest.approx(by_n[2].measured_step / by_n[2].model_step) and by_n[64].error is None
    assert "predictions only" in report.notes[-1]
    lines = {line.get_label(): line for line in report.plot().get_lines()}
    assert list(lines["measured"].get_xdata()) == [1, 2] and list(lines["model"].get_xdata()) == [1, 2, 4, 64]
    assert list(lines["measured"].get_ydata()) == [by_n[1].measured_speedup, by_n[2].measured_speedup]
    assert list(lines["ideal"].get_ydata()) == [1.0, 2.0, 4.0, 64.0]
