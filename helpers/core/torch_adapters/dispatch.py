"""Adapter for torch's Python dispatch modes (``torch.utils._python_dispatch.TorchDispatchMode``), written for torch 2.14.

Relies on: subclassing ``TorchDispatchMode`` and overriding
``__torch_dispatch__(self, func, types, args, kwargs)``, called once per aten operator with
an ``OpOverload`` (``func.overloadpacket``, ``func.namespace``, ``func.is_view``), used as a
context manager. torch documents the mechanism (``__torch_dispatch__``) but keeps the base
class in a private module.
"""
from __future__ import annotations

import torch

from helpers.core.torch_adapters.changes import moved, require

TorchDispatchMode = require("dispatch", "torch.utils._python_dispatch", "TorchDispatchMode")
# torch imports this on the first operation under a dispatch mode: processes that will use one import it up front.
FIRST_USE_IMPORTS = "torch._dynamo"


def is_view(func) -> bool:
    """Whether an aten operator returns a view of its input (no new memory, no arithmetic)."""
    return bool(func.is_view)


class _SeenOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def check() -> None:
    """A mode sees each aten operator once, as an OpOverload whose view flag is right."""
    x = torch.ones(4)
    with _SeenOps() as mode:
        (x + 1).view(2, 2)
    names = [f.overloadpacket.__name__ for f in mode.seen]
    if names != ["add", "view"]:
        raise moved("dispatch", "torch.utils._python_dispatch.TorchDispatchMode", f"a mode saw {names} for x + 1 then .view")
    if not hasattr(mode.seen[1], "is_view") or not is_view(mode.seen[1]) or is_view(mode.seen[0]):
        raise moved("dispatch", "torch._ops.OpOverload.is_view", "aten.view is not flagged as a view, or aten.add is")

