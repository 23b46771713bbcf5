"""helpers.detect_drift: per-feature KS tests with Holm's correction: its false-alarm rate, its power, its errors."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from helpers import detect_drift
from helpers.mlops.drift import holm


def test_unshifted_batches_raise_at_most_alpha_false_alarms_family_wise():
    rng = np.random.default_rng(1)
    trials, alarms = 300, 0
    for _ in range(trials):
        alarms += detect_drift(rng.normal(size=(200, 12)), rng.normal(size=(200, 12)), alpha=0.05).drifted
    # Binomial(300, 0.05) exceeds 25 with probability < 0.1%: a rate above that is a broken correction.
    assert alarms / trials <= 25 / 300


def test_a_small_shift_in_one_feature_is_found_and_named():
    rng = np.random.default_rng(2)
    found = 0
    for _ in range(50):
        reference, current = rng.normal(size=(1000, 10)), rng.normal(size=(1000, 10))
        current[:, 7] += 0.3  # 0.3 standard deviations
        report = detect_drift(reference, current)
        found += report.features == [7]
    assert found >= 45  # power >= 90% for this shift and size


def test_the_report_carries_one_p_value_per_feature_and_takes_tensors():
    rng = np.random.default_rng(3)
    reference = torch.from_numpy(rng.normal(size=(300, 5)))
    current = reference.clone() + torch.tensor([0, 0, 2.0, 0, 0])
    report = detect_drift(reference, current)
    assert report.drifted and report.features == [2] and len(report.p_values) == 5
    assert report.p_values[2] == pytest.approx(stats.ks_2samp(reference[:, 2], current[:, 2]).pvalue)
    assert "feature" in str(report) and report.find(feature=2).drifted


def test_holm_matches_its_definition_on_a_small_case():
    # sorted p: 0.01, 0.02, 0.04 -> 3*0.01, max(0.03, 2*0.02), max(0.04, 1*0.04)
    assert holm(np.array([0.04, 0.01, 0.02])) == pytest.approx([0.04, 0.03, 0.04])


def test_a_blank_feature_on_both_sides_is_not_drift():
    reference, current = np.zeros((50, 3)), np.zeros((60, 3))
    current[:, 1] = np.linspace(0, 1, 60)
    assert detect_drift(reference, current).features == [1]


@pytest.mark.parametrize("reference, current, says", [
    (np.zeros((10, 3)), np.zeros((10, 4)), "3 features"),
    (np.zeros((0, 3)), np.zeros((10, 3)), "empty"),
    (np.zeros((10, 3)), np.full((10, 3), np.nan), "NaN"),
    (np.zeros(10), np.zeros(10), "2-D"),
    (np.array([["a"]]), np.array([["b"]]), "numbers"),
])
def test_bad_input_is_a_clear_error(reference, current, says):
    with pytest.raises(ValueError, match=says):
        detect_drift(reference, current)


def test_alpha_must_be_a_probability():
    with pytest.raises(ValueError, match="alpha"):
        detect_drift(np.zeros((5, 2)), np.zeros((5, 2)), alpha=5)
