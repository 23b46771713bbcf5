"""Lectures 2 and 3 say only what their numbers back: a model's error at every measured point, extrapolation only from a
model that fits, and verdicts taken over groups of rounds (helpers.distributed.comm_models, experiments, ddp)."""
from __future__ import annotations

import math

import pytest

from helpers.distributed.comm_models import (
    SCHEMES,
    Link,
    all_reduce_time,
    bytes_per_round,
    comm_costs,
    critical_path_bytes,
    model_error,
    rounds,
    within,
)
from helpers.distributed.ddp import Scaling, ScalingPoint, group_fastest
from helpers.distributed.experiments import AllReducePoint, AllReduceSweep


def test_the_time_model_is_rounds_of_latency_plus_bytes_in_sequence():
    link = Link(alpha=3e-5, beta=2e-10)
    for scheme in SCHEMES:
        for n in (1, 2, 3, 8, 64):
            expected = rounds(scheme, n) * (link.alpha + bytes_per_round(scheme, 1e6, n) * link.beta)  # rounds x one message each
            assert all_reduce_time(scheme, 1e6, n, link) == pytest.approx(expected)
    # worked by hand, M = 1: the server's link carries 2NM in sequence, a ring link 2(N-1)/N x M, in 2 and 2(N-1) rounds
    assert critical_path_bytes("parameter server", 1.0, 64) == 128 and critical_path_bytes("ring", 1.0, 64) == pytest.approx(126 / 64)
    assert critical_path_bytes("butterfly", 1.0, 64) == 6 and critical_path_bytes("tree", 1.0, 64) == 12
    assert comm_costs(1.0, workers=(64,), schemes=("ring",)).rows[0].critical_path == pytest.approx(126 / 64)


def test_a_model_fits_within_a_factor_either_way():
    assert model_error(3e-3, 1e-3) == pytest.approx(3.0) and math.isinf(model_error(1.0, 0.0))
    assert within(2.0, 2.0) and within(0.5, 2.0) and within(1.0, 1.5)
    assert not within(2.01, 2.0) and not within(0.49, 2.0) and not within(math.inf, 2.0)


def test_the_sweep_reports_the_models_error_at_every_measured_point():
    link = Link(1e-5, 1e-9)
    rows = [AllReducePoint("butterfly", n, b, fastest, 2 * fastest, 3 * fastest, all_reduce_time("butterfly", b, n, link),
                           model_error(fastest, all_reduce_time("butterfly", b, n, link)), 0.0)
            for n, b, fastest in ((2, 1024, 1e-4), (2, 1 << 20, 2e-3), (4, 1024, 5e-4))]
    rows.append(AllReducePoint("dist.all_reduce", 2, 1024, 1e-4, 1e-4, 1e-4, None, None, 0.0))  # no formula: no error
    sweep = AllReduceSweep(rows, link)
    errors = sweep.model_errors("butterfly")
    assert set(errors) == {2, 4} and set(errors[2]) == {1024, 1 << 20}
    assert errors[2][1024] == pytest.approx(1e-4 / (1e-5 + 1024e-9))  # fastest / model, one round of alpha + M beta at N = 2
    with pytest.raises(ValueError, match="no modelled rows"):
        sweep.model_errors("dist.all_reduce")


def test_scaling_extrapolates_only_rows_it_did_not_measure_and_marks_them():
    link = Link(1e-4, 1e-9)
    measured = ScalingPoint(2, 0.05, 0.06, "", 1.6, 0.05, 1e-3, 0.051, 1.96, 0.06 / 0.051)
    report = Scaling([measured], ["measured"], base_compute=0.1, gradient_bytes=4000, link=link)
    beyond = report.extrapolate((2, 8))
    assert [r.workers for r in beyond.rows] == [2, 8] and beyond.rows[0] is measured  # N = 2 ran: it is not replaced by the model
    predicted = beyond.rows[1]
    assert not predicted.ran_here and predicted.error is None
    assert predicted.model_step == pytest.approx(0.1 / 8 + all_reduce_time("ring", 4000, 8, link))
    assert "8 workers" in beyond.notes[-1] and "predictions only" in beyond.notes[-1]


def test_groups_take_the_fastest_of_every_third_round():
    assert group_fastest([5, 1, 4, 2, 6, 3]) == [2, 1, 3]
    assert group_fastest([7.0, 8.0]) == [7.0, 8.0]  # fewer rounds than groups: one group per round
