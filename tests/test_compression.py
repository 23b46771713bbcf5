"""helpers.serving.compression: pruning zeroes what it says, static int8 is calibrated, the table scores every variant."""
from __future__ import annotations

import pytest
import torch

from helpers.serving import compression_table, export_onnx, mnist_holdout, mnist_model, pruned, quantize_static_onnx, train_mnist_model


def test_pruning_zeroes_the_smallest_share_of_each_layer_and_leaves_the_model_alone():
    model, _ = mnist_model()
    before = model.net.fc1.weight.detach().clone()
    cut = pruned(model, 0.75)
    weight = cut.net.fc1.weight.detach()
    assert (weight == 0).float().mean().item() == pytest.approx(0.75, abs=0.01)
    kept = weight != 0
    assert weight[kept].abs().min() >= before[~kept].abs().max()  # the smallest magnitudes went
    assert torch.equal(model.net.fc1.weight, before)
    with pytest.raises(ValueError, match="share"):
        pruned(model, 1.5)


def test_distillation_trains_a_student_of_the_asked_size_that_learns():
    teacher, _ = mnist_model()
    student, info = train_mnist_model(epochs=1, hidden=8, teacher=teacher)
    assert student.net.fc1.out_features == 8 and info.holdout_accuracy > 0.6


def test_the_table_has_one_scored_row_per_variant(tmp_path):
    model, info = mnist_model()
    pixels, labels = mnist_holdout(300)
    base = export_onnx(model, tmp_path / "base.onnx")
    static = quantize_static_onnx(base, tmp_path / "static.onnx", pixels[:100])
    table = compression_table({"fp32": model, "static int8": static, "pruned": pruned(model, 0.5)}, pixels, labels, tmp_path,
                              min_run_time=0.01)
    assert [r.variant for r in table.rows] == ["fp32", "static int8", "pruned"]
    assert table.find(variant="pruned").nonzero == pytest.approx(0.5, abs=0.01)
    baseline = table.rows[0]  # the first variant passed: the model as served
    assert table.find(variant="static int8").file_size < baseline.file_size / 3
    assert abs(table.find(variant="static int8").accuracy - baseline.accuracy) < 0.03
    assert baseline.accuracy == pytest.approx(info.holdout_accuracy, abs=0.05)
