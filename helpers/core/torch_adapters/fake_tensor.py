"""Adapter for torch's fake tensors (``torch._subclasses.fake_tensor``), written for torch 2.14.

Relies on: ``FakeTensorMode(allow_non_fake_inputs=True)`` as a context manager under which
factory functions make fake tensors; the exceptions it raises when an operator needs real
values (``DataDependentOutputException``, ``DynamicOutputShapeException``) or has no fake
implementation (``UnsupportedOperatorException``). torch has no public path for these.
"""
from __future__ import annotations

import torch

from helpers.core.torch_adapters.changes import moved, require

_MODULE = "torch._subclasses.fake_tensor"
FakeTensorMode = require("fake_tensor", _MODULE, "FakeTensorMode")
NEEDS_REAL_VALUES: tuple[type[Exception], ...] = tuple(
    require("fake_tensor", _MODULE, name)
    for name in ("DataDependentOutputException", "DynamicOutputShapeException", "UnsupportedOperatorException"))


def new_fake_mode():
    """A fresh FakeTensorMode that also accepts stray real tensors (e.g. constants a model keeps as attributes)."""
    return FakeTensorMode(allow_non_fake_inputs=True)


FakeTensor = require("fake_tensor", _MODULE, "FakeTensor")


def is_fake(t: torch.Tensor) -> bool:
    return isinstance(t, FakeTensor)


def check() -> None:
    """A fake mode makes fake tensors that carry shape and dtype but no storage of their own."""
    with new_fake_mode():
        t = torch.empty(1000, 1000)
    if not is_fake(t) or tuple(t.shape) != (1000, 1000):
        raise moved("fake_tensor", f"{_MODULE}.FakeTensorMode", "tensors made under the mode are not FakeTensors of the asked shape")
