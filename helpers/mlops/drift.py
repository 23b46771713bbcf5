"""Input drift: has the distribution of what a deployed model sees moved away from what it was trained on?

``detect_drift`` runs a two-sample Kolmogorov-Smirnov test per feature (scipy) and corrects for testing
many features at once with Holm's step-down method, which keeps the chance of *any* false alarm across
features at ``alpha`` (family-wise), without assuming the features are independent. An alert that fires
on every tenth unshifted batch would soon be ignored; that is the reason for a family-wise bound rather
than a per-feature one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from helpers.core.report import Report, column


@dataclass
class FeatureDrift:
    feature: int = column("feature")
    statistic: float = column("KS statistic", ".3f")
    p_value: float = column("p-value", ".3g")
    adjusted: float = column("Holm-adjusted p", ".3g")
    drifted: bool = column("drifted")


class DriftReport(Report):
    """Per-feature tests of reference against current data; ``drifted``, ``p_values`` and ``features`` sum it up."""

    title = "Input drift (two-sample KS per feature, Holm-corrected)"

    def __init__(self, rows, alpha: float, reference_size: int, current_size: int):
        self.alpha = alpha
        self.p_values = np.array([r.p_value for r in rows])
        self.adjusted_p_values = np.array([r.adjusted for r in rows])
        self.features = [r.feature for r in rows if r.drifted]
        self.drifted = bool(self.features)
        verdict = (f"drift in {len(self.features)} of {len(rows)} features: {self.features[:20]}" if self.drifted
                   else f"no drift detected in {len(rows)} features")
        notes = [f"{verdict} (alpha={alpha:g}, family-wise; reference {reference_size:,} rows, current {current_size:,} rows)."]
        if len(rows) > 10:
            notes.append(f"The table shows the 10 most suspicious of {len(rows)} features; .rows has them all.")
        super().__init__(rows, notes)

    def shown_rows(self) -> list[FeatureDrift]:
        """The ten most suspicious features (smallest adjusted p-value): images have hundreds."""
        return sorted(self.rows, key=lambda r: (r.adjusted, -r.statistic))[:10]

    def plot(self, ax=None):
        from helpers.core.plots import new_axes

        ax = new_axes(ax, title=self.title, xlabel="feature", ylabel="KS statistic")
        colors = ["tab:red" if r.drifted else "tab:gray" for r in self.rows]
        ax.bar([r.feature for r in self.rows], [r.statistic for r in self.rows], color=colors)
        return ax


def _as_matrix(data, name: str) -> np.ndarray:
    array = data.detach().cpu().numpy() if hasattr(data, "detach") else np.asarray(data)
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows = samples, columns = features), got shape {array.shape}; "
                         "reshape images to (n, pixels) first")
    if array.shape[0] == 0:
        raise ValueError(f"{name} is empty: it needs at least one row")
    if not np.issubdtype(array.dtype, np.number):
        raise ValueError(f"{name} must hold numbers, got dtype {array.dtype}")
    if np.isnan(array).any():
        rows = np.unique(np.argwhere(np.isnan(array))[:, 0])
        raise ValueError(f"{name} holds NaNs (in {len(rows)} rows, first {rows[:5].tolist()}): drop or impute them first; "
                         "a missing value is a data-quality alert of its own")
    return array.astype(np.float64, copy=False)


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: reject where adjusted <= alpha keeps the family-wise error at alpha."""
    order = np.argsort(p_values)
    m = len(p_values)
    stepped = np.maximum.accumulate((m - np.arange(m)) * p_values[order])
    adjusted = np.empty(m)
    adjusted[order] = np.minimum(stepped, 1.0)
    return adjusted


def detect_drift(reference, current, alpha: float = 0.05) -> DriftReport:
    """Two 2-D arrays or tensors (rows samples, columns features): which features' distributions moved?"""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha is a false-alarm probability: it must lie in (0, 1), got {alpha}")
    ref, cur = _as_matrix(reference, "reference"), _as_matrix(current, "current")
    if ref.shape[1] != cur.shape[1]:
        raise ValueError(f"reference has {ref.shape[1]} features (columns) and current {cur.shape[1]}: "
                         "compare the same features in the same order")
    constant = (ref.min(0) == ref.max(0)) & (cur.min(0) == cur.max(0)) & (ref[0] == cur[0])
    result = stats.ks_2samp(ref, cur, axis=0)
    statistic, p_values = np.atleast_1d(result.statistic), np.atleast_1d(result.pvalue)
    p_values = np.where(constant, 1.0, p_values)  # the same constant on both sides (a blank pixel): nothing moved
    adjusted = holm(p_values)
    rows = [FeatureDrift(i, float(statistic[i]), float(p_values[i]), float(adjusted[i]), bool(adjusted[i] <= alpha))
            for i in range(ref.shape[1])]
    return DriftReport(rows, alpha, len(ref), len(cur))
