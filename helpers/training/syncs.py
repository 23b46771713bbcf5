"""Count the calls that make the host wait for the device: ``.item()``, ``.tolist()``, ``if tensor:``, printing...

On a GPU each of these blocks Python until every queued kernel has finished, so a
training loop that makes one per step can never run ahead of the device (the
"synchronisation bound" profile). The counter sees the calls on any device, so the
pattern can be found, and tested for, on a CPU too. Reads made inside torch's own
code are not counted: they are of host-side bookkeeping tensors (an optimizer's step
count, a DataLoader's seed), which stay on the CPU even when training runs on a GPU.

    with count_host_syncs() as syncs:
        train(...)
    syncs.total, syncs.counts   # e.g. 64, Counter({'item': 64})
"""
from __future__ import annotations

import sys
from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from helpers.core.torch_adapters.dispatch import TENSOR_METHOD_MODULES

# Tensor methods that read a value back to the host (and so wait for the device).
HOST_READS = frozenset({"item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__format__", "__repr__"})


class SyncCounter(TorchFunctionMode):
    """A torch function mode that counts host reads of tensors (by method name) while it is active."""

    def __init__(self):
        super().__init__()
        self.counts: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if (name in HOST_READS or _copies_to_host(name, args, kwargs)) and not _called_from_torch():
            self.counts[name] += 1
        return func(*args, **kwargs)


def _called_from_torch() -> bool:
    """True when the code that called the tensor method is part of torch itself."""
    frame = sys._getframe(2)  # 0: this function, 1: __torch_function__, 2: the caller (or torch's dispatch layer)
    while frame is not None and frame.f_globals.get("__name__") in TENSOR_METHOD_MODULES:
        frame = frame.f_back
    return frame is not None and frame.f_globals.get("__name__", "").split(".")[0] == "torch"


def _copies_to_host(name: str, args, kwargs) -> bool:
    """``x.cpu()`` or ``x.to('cpu')`` of a tensor that lives on an accelerator."""
    if name not in ("cpu", "to") or not args or not isinstance(args[0], torch.Tensor) or args[0].device.type == "cpu":
        return False
    if name == "cpu":
        return True
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu"


def count_host_syncs() -> SyncCounter:
    """A context manager counting host reads of tensors inside the block (``.total``, ``.counts``)."""
    return SyncCounter()
