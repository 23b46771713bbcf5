"""helpers.distributed.pipeline_parallel: schedules and their bubble, derived and measured on real processes, with the unsplit model's gradients."""
from __future__ import annotations

import sys

import cloudpickle
import matplotlib
import matplotlib.pyplot as plt
import pytest

from helpers.distributed.pipeline_parallel import bubble_fraction, bubble_of, ideal_timeline, pipeline_experiment, pipeline_schedule, stage_orders

matplotlib.use("Agg")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the schedules below run in the workers


def gpipe(stage, stages, micro_batches):
    return [("F", i) for i in range(micro_batches)] + [("B", i) for i in reversed(range(micro_batches))]


def one_f_one_b(stage, stages, micro_batches):
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    for i in range(micro_batches - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(micro_batches - warmup, micro_batches)]


def backward_first(stage, stages, micro_batches):
    return [("B", i) for i in range(micro_batches)] + [("F", i) for i in range(micro_batches)]


def test_stage_orders_are_checked():
    assert stage_orders(one_f_one_b, 4, 3)[3] == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    with pytest.raises(ValueError, match="forward"):
        stage_orders(backward_first, 2, 2)
    with pytest.raises(ValueError, match="exactly once"):
        stage_orders(lambda s, p, m: gpipe(s, p, m)[1:], 2, 2)


def test_a_stage_cannot_backpropagate_a_micro_batch_before_forwarding_it():
    def crossed(stage, stages, micro_batches):  # stage 0 wants micro-batch 1 back before it sent micro-batch 1 on
        return [("F", 0), ("B", 1), ("F", 1), ("B", 0)] if stage == 0 else gpipe(stage, stages, micro_batches)
    with pytest.raises(ValueError):
        stage_orders(crossed, 2, 2)


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
@pytest.mark.parametrize("stages,micro_batches", [(1, 3), (2, 1), (2, 8), (4, 4), (4, 16), (8, 3)])
def test_equal_stages_give_the_formula_bubble(schedule, stages, micro_batches):
    timeline = ideal_timeline(schedule, stages, micro_batches)
    assert bubble_of(timeline) == pytest.approx(bubble_fraction(stages, micro_batches))


def test_unequal_stages_idle_more_than_the_formula_and_1f1b_holds_fewer_activations():
    assert bubble_of(ideal_timeline(gpipe, 2, 4, forward=[1, 2], backward=[2, 4])) > bubble_fraction(2, 4)
    all_first, one_f = pipeline_schedule(gpipe, 4, 8), pipeline_schedule(one_f_one_b, 4, 8)
    assert [r.held for r in all_first.rows] == [8] * 4 and [r.held for r in one_f.rows] == [4, 3, 2, 1]
    assert all_first.bubble == pytest.approx(one_f.bubble) == pytest.approx(all_first.formula)
    plt.close(all_first.plot().figure)


def test_a_real_pipeline_gives_the_unsplit_gradients_and_its_bubble_is_measured():
    run = pipeline_experiment(gpipe, stages=2, micro_batches=(1, 4), batch=32, width=64, repeats=1)
    assert all(r.same_gradients for r in run.rows)
    one, four = run.find(micro_batches=1), run.find(micro_batches=4)
    assert one.measured_bubble >= 0.5 - 0.01  # one micro-batch: the two stages can never overlap
    assert 0 < four.measured_bubble < 1 and four.expected_bubble <= four.measured_bubble + 1e-9
    assert four.bytes_per_boundary == 2 * 32 * 64 * 4 and four.held == 4
    plt.close(run.plot().figure)
    plt.close(run.plot_timeline(4).figure)


def test_a_1f1b_pipeline_on_three_processes():
    run = pipeline_experiment(one_f_one_b, stages=3, micro_batches=(3,), batch=12, width=32, repeats=1)
    assert run.rows[0].same_gradients and run.rows[0].held == 3
    with pytest.raises(ValueError, match="equal micro-batches"):
        pipeline_experiment(gpipe, stages=2, micro_batches=(5,), batch=12)


def test_the_bubble_range_core_share_and_time_beyond_op_times_come_from_the_runs():
    from helpers.distributed.pipeline_parallel import _replayed
    run = pipeline_experiment(gpipe, stages=2, micro_batches=(1, 2), batch=64, width=128, repeats=3)
    for r in run.rows:
        low, high = r.measured_range
        assert low <= r.measured_bubble <= high  # the run shown is one of the repeats
        assert 0 < r.core_share <= 1.05 and r.work_per_micro_batch > 0
        expected, replayed_span, work = _replayed(run.timelines[r.micro_batches], r.micro_batches, gpipe)
        assert r.expected_bubble == expected and r.work_per_micro_batch == work
        assert r.wait_per_micro_batch == pytest.approx((r.makespan - replayed_span) / r.micro_batches)
        # the replay uses this run's own op times: the same busy time, and no op can start earlier for real than replayed
        assert r.wait_per_micro_batch >= -1e-9 and r.replayed_makespan == replayed_span
        assert r.busy_total == pytest.approx(sum(e[3] - e[2] for lane in run.timelines[r.micro_batches] for e in lane))
        assert r.makespan_range[0] <= r.makespan <= r.makespan_range[1]
    ax = run.plot()
    assert len(ax.collections) == 1  # the measured range, shaded
    plt.close(ax.figure)


def test_slowdowns_separate_the_micro_batch_size_from_stages_running_side_by_side():
    from helpers.distributed.pipeline_parallel import _slowdowns
    first = [[("F", 0, 0, 8, 0), ("B", 0, 16, 32, 0)], [("F", 0, 8, 16, 0)]]  # m = 1: every op alone
    # m = 2: alone ops take half of m = 1's (the same time per row); stage 0's F1 runs beside stage 1's F0 and takes 1.5x
    now = [[("F", 0, 0, 4, 0), ("F", 1, 4, 10, 0)], [("F", 0, 4, 10, 0), ("F", 1, 10, 14, 0)]]
    size, beside = _slowdowns(now, 2, first, 1)
    assert size == pytest.approx(1.0) and beside == pytest.approx(1.5)
