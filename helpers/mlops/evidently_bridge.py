"""Evidently (the open-source drift-report library lecture 10 runs beside ``detect_drift``) under pandas 3.

Evidently 0.7.23, its latest release, imports ``pandas.core.dtypes.common.infer_dtype_from_object`` at the top of
its legacy column-type test, a function pandas 3 removed; the import fails and ``import evidently`` with it,
although nothing in the drift report calls that function. ``import_evidently`` puts a stand-in with pandas 2's
behaviour back (only where pandas lacks it) and imports Evidently. When the pin moves, check whether the new
release imports without it (``tests/test_drift_report.py`` names the version this was checked with).
"""
from __future__ import annotations

import importlib
from types import ModuleType

import numpy as np


def _infer_dtype_from_object(dtype) -> type:
    """pandas 2's ``infer_dtype_from_object`` for what Evidently passes: a NumPy scalar type for a dtype or type."""
    from pandas.api.types import pandas_dtype

    if isinstance(dtype, type) and issubclass(dtype, np.generic):
        return dtype
    return pandas_dtype(dtype).type


def import_evidently() -> ModuleType:
    """``evidently``, importable under pandas 3 (``from evidently import Report`` works after this call)."""
    from pandas.core.dtypes import common

    if not hasattr(common, "infer_dtype_from_object"):
        common.infer_dtype_from_object = _infer_dtype_from_object
    try:
        return importlib.import_module("evidently")
    except ImportError as err:
        raise ImportError(f"Evidently does not import here ({err}): install the kit's pin with "
                          "`pip install evidently==0.7.23` (pyproject.toml lists it)") from err
