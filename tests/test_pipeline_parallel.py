"""helpers.distributed.pipeline_parallel: schedules and their bubble, derived and measured on real processes, with the unsplit model's gradients."""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pytest

from helpers.distributed.pipeline_parallel import bubble_fraction, bubble_of, ideal_timeline, pipeline_experiment, pipeline_schedule, stage_order

matplotlib.use("Agg")

def test_stage_orders():
    assert stage_order(0, 2, 3) == [("F", 0), ("F", 1), ("F", 2), ("B", 2), ("B", 1), ("B", 0)]
    assert stage_order(3, 4, 3, "1f1b") == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert stage_order(0, 4, 6, "1f1b")[:4] == [("F", 0), ("F", 1), ("F", 2), ("F", 3)]
    with pytest.raises(ValueError, match="schedule"):
        stage_order(0, 2, 2, "zigzag")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("stages,micro_batches", [(1, 3), (2, 1), (2, 8), (4, 4), (4, 16), (8, 3)])
def test_equal_stages_give_the_formula_bubble(schedule, stages, micro_batches):
    timeline = ideal_timeline(stages, micro_batches, schedule)
    assert bubble_of(timeline) == pytest.approx(bubble_fraction(stages, micro_batches))


def test_unequal_stages_idle_more_than_the_formula_and_1f1b_holds_fewer_activations():
    assert bubble_of(ideal_timeline(2, 4, "gpipe", forward=[1, 2], backward=[2, 4])) > bubble_fraction(2, 4)
    gpipe, one_f = pipeline_schedule(4, 8), pipeline_schedule(4, 8, "1f1b")
    assert [r.held for r in gpipe.rows] == [8] * 4 and [r.held for r in one_f.rows] == [4, 3, 2, 1]
    assert gpipe.bubble == pytest.approx(one_f.bubble) == pytest.approx(gpipe.formula)
    plt.close(gpipe.plot().figure)


def test_a_real_pipeline_gives_the_unsplit_gradients_and_its_bubble_is_measured():
    run = pipeline_experiment(stages=2, micro_batches=(1, 4), batch=32, width=64, repeats=1)
    assert all(r.same_gradients for r in run.rows)
    one, four = run.find(micro_batches=1), run.find(micro_batches=4)
    assert one.measured_bubble >= 0.5 - 0.01  # one micro-batch: the two stages can never overlap
    assert 0 < four.measured_bubble < 1 and four.expected_bubble >= four.formula_bubble - 1e-9
    assert four.bytes_per_boundary == 2 * 32 * 64 * 4 and four.held == 4
    plt.close(run.plot().figure)
    plt.close(run.plot_timeline(4).figure)


def test_a_1f1b_pipeline_on_three_processes():
    run = pipeline_experiment(stages=3, micro_batches=(3,), batch=12, width=32, schedule="1f1b", repeats=1)
    assert run.rows[0].same_gradients and run.rows[0].held == 3
    with pytest.raises(ValueError, match="equal micro-batches"):
        pipeline_experiment(stages=2, micro_batches=(5,), batch=12)
