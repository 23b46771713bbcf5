"""What every adapter shares: the error that names a moved torch API, and the list of adapters to check."""
from __future__ import annotations

import importlib
from typing import Any

import torch

WRITTEN_FOR = "2.14"  # the torch version every adapter here was written and tested against
ADAPTERS = ("fake_tensor", "dispatch", "mem_tracker", "profiler_memory", "storage", "optim_defaults", "op_overrides", "inductor_code",
            "memory_history")


class TorchAPIChanged(RuntimeError):
    """A private torch API an adapter relies on has moved or changed; the message names it and the adapter to update."""


def moved(adapter: str, api: str, detail: str) -> TorchAPIChanged:
    """The error an adapter raises when ``api`` is not what it was: what changed, under which torch, where to fix it."""
    return TorchAPIChanged(
        f"torch {torch.__version__}: {api} changed ({detail}). helpers/core/torch_adapters/{adapter}.py was written for "
        f"torch {WRITTEN_FOR}; update that adapter (only it) to torch's new location or behaviour.")


def require(adapter: str, module: str, name: str | None = None) -> Any:
    """``module`` (or ``module.name``) imported, or ``TorchAPIChanged`` naming what is missing."""
    api = f"{module}.{name}" if name else module
    try:
        found = importlib.import_module(module)
    except ImportError as err:
        raise moved(adapter, api, f"module {module} cannot be imported: {err}") from err
    if name is None:
        return found
    if not hasattr(found, name):
        raise moved(adapter, api, f"{module} has no attribute {name}")
    return getattr(found, name)


def check_all() -> list[str]:
    """Run every adapter's ``check()``; returns the adapters checked, raises ``TorchAPIChanged`` at the first that fails."""
    for adapter in ADAPTERS:
        importlib.import_module(f"{__package__}.{adapter}").check()
    return list(ADAPTERS)
