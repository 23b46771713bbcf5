"""Shared fixtures: the repository root and the kit's notebooks."""
from __future__ import annotations

from pathlib import Path

import pytest

import helpers  # noqa: F401  (quietens torch's import-time warnings before any test imports torch pieces)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _close_figures():
    """Reports draw with pyplot; close what a test opened so hundreds of figures do not pile up."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
