"""Lectures 9-10 and Assignment 4: experiment tracking, data and pipeline versioning, drift monitoring.

Public face of ``helpers.mlops``; names load on first use (MLflow and DVC only then).
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".drift": ["DriftReport", "detect_drift"],
    ".evidently_bridge": ["import_evidently"],
    ".tracking": ["experiment_id", "quiet_mlflow", "start_mlflow_ui", "tracking_store"],
    ".versioning": ["Shell", "tool_path"],
    ".live": ["AliasRouter", "InputDriftWindow", "Slowed", "start_alias_service", "watch_inputs"],
    ".prometheus": ["Prometheus", "prometheus_missing", "sped_up_rules", "watch_alerts"],
    ".monitoring": ["FEATURE_NAMES", "alarm_rates", "behavioural_tests", "pixel_features", "random_split"],
})
