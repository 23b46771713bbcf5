"""helpers.alexnet_parallel: AlexNet's towers on two real processes compute the whole network's output and gradients."""
from __future__ import annotations

from helpers.alexnet_parallel import alexnet_model_parallel


def test_towers_on_two_processes_match_the_whole_network():
    report = alexnet_model_parallel(batch=1, num_classes=10)
    assert [r.rank for r in report.rows] == [0, 1]
    for row in report.rows:
        assert row.same_gradients and row.max_output_difference < 1e-4
        assert 0.49 < row.share_of_whole < 0.51
        assert row.forward.startswith("5 all_gather") and row.backward.startswith("4 reduce_scatter")
