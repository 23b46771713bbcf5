"""helpers.serving.compression: the table exports, times and scores every variant with the functions it is given."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers.serving import compression_table, mnist_holdout, mnist_model, train_mnist_model
from helpers.serving.compression import Variant, latency_against

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
    for r in table.rows:  # every variant timed in every round: its median lies inside its rounds' range
        assert r.quickest <= r.latency <= r.slowest


def timed(latency, quickest, slowest):
    return Variant("v", 1, 1.0, 1, latency, (quickest, slowest), 0.9)


def test_a_latency_gap_counts_only_when_the_rounds_do_not_overlap():
    base = timed(220e-6, 200e-6, 260e-6)
    assert latency_against(base, timed(255e-6, 230e-6, 280e-6)).startswith("a tie")  # 0.86x, but inside the spread
    assert latency_against(base, timed(200e-6, 190e-6, 240e-6)).startswith("a tie")
    assert latency_against(base, timed(65e-6, 60e-6, 70e-6)) == "faster, 3.38x"
    assert latency_against(base, timed(440e-6, 400e-6, 480e-6)) == "slower, 2.00x the time"
