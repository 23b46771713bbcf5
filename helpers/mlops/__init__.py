"""Lectures 9-10 and Assignment 4: experiment tracking, testing, and monitoring a deployed model.

Public face of ``helpers.mlops``; names load on first use.
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".drift": ["DriftReport", "detect_drift"],
})
