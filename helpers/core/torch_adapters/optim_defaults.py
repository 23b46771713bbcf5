"""Adapter for torch's optimizer defaults (``torch.utils._foreach_utils``), written for torch 2.14.

Relies on: ``_get_foreach_kernels_supported_devices()``, the device types on which
torch.optim's optimizers pick their multi-tensor (foreach) kernels by default ("cuda" and
friends, not "cpu"). Fake tensors hide their device from that choice, so the kit asks once,
to make an estimate's optimizer take the same path a real one would.
"""
from __future__ import annotations

import torch

from helpers.core.torch_adapters.changes import moved, require

_supported = require("optim_defaults", "torch.utils._foreach_utils", "_get_foreach_kernels_supported_devices")


def foreach_by_default(params: list[torch.Tensor]) -> bool:
    """What torch's optimizers choose by default for real tensors on these devices: foreach kernels only on GPUs."""
    devices = _supported()
    return bool(params) and all(p.device.type in devices for p in params)


def check() -> None:
    devices = _supported()
    if not isinstance(devices, (list, tuple, set)) or "cuda" not in devices or "cpu" in devices:
        raise moved("optim_defaults", "torch.utils._foreach_utils._get_foreach_kernels_supported_devices",
                    f"it returned {devices!r}, expected a list with 'cuda' and without 'cpu'")
