"""helpers.distributed.zero: bytes per parameter per ZeRO stage, and ZeRO-1 / ZeRO-3 on a real gloo group against the formula."""
from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt
import pytest

from helpers import bytes_per_param
from helpers.distributed.zero import Layout, formula, per_worker, zero_check, zero_memory

pytestmark = pytest.mark.slow

matplotlib.use("Agg")

def test_each_stage_splits_one_more_part_of_the_training_state():
    mixed = Layout.mixed_precision_adam()
    assert (mixed.weights, mixed.gradients, mixed.optimizer_state) == (2, 2, 12)
    assert [sum(per_worker(s, 1, mixed).values()) for s in range(4)] == [16] * 4
    assert [sum(per_worker(s, 64, mixed).values()) for s in range(4)] == [16, 4 + 12 / 64, 2 + 14 / 64, 16 / 64]
    assert [formula(s, mixed) for s in range(4)] == ["2 + 2 + 12", "2 + 2 + 12/N", "2 + 14/N", "16/N"]
    with pytest.raises(ValueError, match="stages"):
        per_worker(4, 2, mixed)
    with pytest.raises(ValueError, match="worker"):
        per_worker(1, 0, mixed)


def test_layout_from_a_bytes_per_param_row_counts_the_master_copy_as_optimizer_state():
    row = bytes_per_param().find(setup="mixed precision, Adam, fp32 master copy")
    assert Layout.from_row(row) == Layout(2, 2, 12, row.setup)
    report = zero_memory(workers=(1, 8), layout=row, params=1000, model_name="toy")
    assert report.find(stage=3).per_param[8] == 2 and report.find(stage=0).per_param[8] == 16
    assert report.find(stage=3).model == {"toy at N=8": 2000}
    assert "N=8" in str(report) and "toy at N=8" in str(report)
    plt.close(report.plot().figure)


def test_zero_on_real_workers_holds_what_the_formula_says_and_trains_like_ddp():
    report = zero_check(world_size=2, width=64, depth=2, steps=2)
    assert len(report.rows) == 6
    for row in report.rows:
        assert row.total == pytest.approx(row.formula_bytes, rel=0.002)  # Adam's step counters are the only extra
        assert row.max_weight_difference < 1e-5
    ddp, zero1, zero3 = (report.find(stage=s, rank=0) for s in (0, 1, 3))
    assert zero1.parameters == ddp.parameters and zero1.optimizer_state < 0.6 * ddp.optimizer_state
    assert zero3.parameters == ddp.parameters // 2 and zero3.gradients == ddp.gradients // 2
    with pytest.raises(ValueError, match="multiple"):
        zero_check(world_size=3, width=64)
