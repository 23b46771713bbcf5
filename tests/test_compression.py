"""helpers.serving.compression: the table exports, times and scores every variant with the functions it is given."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers.serving import compression_table, mnist_holdout, mnist_model, train_mnist_model

from .test_export import session, to_onnx


def test_a_loss_function_replaces_cross_entropy_in_training():
    seen = []

    def loss(logits, labels, pixels):
        seen.append(pixels.shape[1])
        return nn.functional.cross_entropy(logits, labels)
    student, info = train_mnist_model(epochs=1, hidden=8, loss_fn=loss)
    assert student.net.fc1.out_features == 8 and info.holdout_accuracy > 0.6 and set(seen) == {784}


def test_the_table_has_one_scored_row_per_variant(tmp_path):
    model, info = mnist_model()
    pixels, labels = mnist_holdout(300)
    half = copy.deepcopy(model)
    with torch.no_grad():
        weight = half.net.fc1.weight
        weight[weight.abs() < weight.abs().median()] = 0
    exported = []
    table = compression_table({"fp32": model, "half zero": half, "again": to_onnx(model, tmp_path / "given.onnx")}, pixels, labels,
                              tmp_path, export=lambda m, p: exported.append(p) or to_onnx(m, p), session=session, min_run_time=0.01)
    assert [r.variant for r in table.rows] == ["fp32", "half zero", "again"] and len(exported) == 2
    assert table.find(variant="half zero").nonzero < 0.9
    assert table.find(variant="again").accuracy == table.find(variant="fp32").accuracy
    assert table.rows[0].accuracy == pytest.approx(info.holdout_accuracy, abs=0.05)
