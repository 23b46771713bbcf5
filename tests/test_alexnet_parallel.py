"""helpers.distributed.alexnet_parallel: AlexNet's towers on two real processes compute the whole network's output and gradients."""
from __future__ import annotations

import pytest
import torch

from helpers.core.models import ALEXNET_INPUT, alexnet_2012
from helpers.distributed.alexnet_parallel import alexnet_model_parallel, towers_on_two_devices

pytestmark = pytest.mark.slow


def test_towers_on_two_processes_match_the_whole_network():
    report = alexnet_model_parallel(batch=1, num_classes=10)
    assert [r.rank for r in report.rows] == [0, 1]
    for row in report.rows:
        assert row.same_gradients and row.max_output_difference < 1e-4
        assert 0.49 < row.share_of_whole < 0.51
        assert row.forward.startswith("5 all_gather") and row.backward.startswith("4 reduce_scatter")


def test_towers_on_two_devices_in_one_process_match_the_whole_network():
    # The GPU path (cuda:0 and cuda:1), run here with the CPU standing in for both devices.
    torch.manual_seed(0)
    whole = alexnet_2012(num_classes=10).eval()
    rows = towers_on_two_devices(whole, torch.randn(1, *ALEXNET_INPUT), ("cpu", "cpu"))
    assert [r.where for r in rows] == ["cpu", "cpu"]
    assert all(r.max_output_difference < 1e-4 and 0.49 < r.share_of_whole < 0.51 for r in rows)
