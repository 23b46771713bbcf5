"""Lecture 10's drift report: Evidently imports under the kit's pandas, writes its HTML, and agrees with detect_drift.

The two run the same two-sample KS test per column, so their p-values must match; their verdicts follow different
rules (any feature after Holm's correction, against half the columns at an uncorrected alpha), so they must agree
where the drift is clear (most columns moved) and where there is none.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from helpers import detect_drift
from helpers.mlops import import_evidently
from helpers.mlops.evidently_bridge import _infer_dtype_from_object

COLUMNS = ["a", "b", "c", "d"]


@pytest.fixture(scope="module")
def evidently():
    return import_evidently()


def drift_preset(evidently, alpha=0.05):
    return evidently.Report([evidently.presets.DataDriftPreset(method="ks", threshold=alpha, drift_share=0.5)])


def evidently_p_values_and_share(snapshot) -> tuple[np.ndarray, float]:
    metrics = snapshot.dict()["metrics"]
    p_values = {m["config"]["column"]: m["value"] for m in metrics if m["config"]["type"].endswith(":ValueDrift")}
    share = next(m["value"]["share"] for m in metrics if m["config"]["type"].endswith(":DriftedColumnsCount"))
    return np.array([p_values[c] for c in COLUMNS]), share


def frames(shift: list[float], seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    reference = pd.DataFrame(rng.normal(size=(600, len(COLUMNS))), columns=COLUMNS)
    current = pd.DataFrame(rng.normal(size=(200, len(COLUMNS))) + shift, columns=COLUMNS)
    return reference, current


def test_the_pinned_evidently_imports_under_the_kits_pandas(evidently):
    assert evidently.__version__ == "0.7.23"  # the pin in pyproject.toml; a new release may not need the bridge
    assert hasattr(evidently, "Report") and hasattr(evidently.presets, "DataDriftPreset")


@pytest.mark.parametrize("dtype, expected", [(np.dtype("int64"), np.int64), ("float64", np.float64), (np.float32, np.float32),
                                             (np.dtype("bool"), np.bool_)])
def test_the_stand_in_maps_dtypes_to_numpy_scalar_types_as_pandas_2_did(dtype, expected):
    assert _infer_dtype_from_object(dtype) is expected


@pytest.mark.parametrize("shift, drifted", [([0.0, 0.0, 0.0, 0.0], False), ([1.0, 1.0, 1.0, 0.0], True)],
                         ids=["no drift", "three of four columns moved"])
def test_evidently_and_detect_drift_give_the_same_p_values_and_verdict_where_it_is_clear(evidently, shift, drifted, tmp_path):
    reference, current = frames(shift)
    ours = detect_drift(reference.to_numpy(), current.to_numpy())
    snapshot = drift_preset(evidently).run(current_data=current, reference_data=reference)
    p_values, share = evidently_p_values_and_share(snapshot)
    np.testing.assert_allclose(p_values, ours.p_values, rtol=1e-9, atol=1e-300)  # the same scipy KS test per column
    assert ours.drifted is drifted and (share >= 0.5) is drifted, (ours.features, share)
    html = tmp_path / "report.html"
    snapshot.save_html(str(html))
    text = html.read_text()
    assert html.stat().st_size > 100_000 and all(c in text for c in COLUMNS)  # a self-contained page naming every column


def test_the_rules_differ_on_a_shift_in_one_column_of_four(evidently):
    reference, current = frames([1.0, 0.0, 0.0, 0.0])
    ours = detect_drift(reference.to_numpy(), current.to_numpy())
    p_values, share = evidently_p_values_and_share(drift_preset(evidently).run(current_data=current, reference_data=reference))
    assert ours.features == [0] and p_values[0] < 0.05  # both see the column...
    assert share < 0.5  # ...but Evidently's dataset verdict needs half the columns drifted
