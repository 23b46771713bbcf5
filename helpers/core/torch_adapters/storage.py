"""Adapter for telling storages apart (``UntypedStorage._cdata``), written for torch 2.14.

Relies on: ``tensor.untyped_storage()._cdata``, the address of the C++ storage object, the
same for every tensor that shares memory (views, in-place results) and different otherwise,
for real and fake tensors alike. The public ``data_ptr()`` cannot serve: fake tensors have
no data, and a zero-size storage has no address. (``torch.multiprocessing``'s
``StorageWeakRef`` wraps the same attribute.)
"""
from __future__ import annotations

import torch

from helpers.core.torch_adapters.changes import moved


def storage_key(t: torch.Tensor) -> int:
    """A number that is equal for tensors sharing one storage and differs between storages alive at the same time."""
    return t.untyped_storage()._cdata


def check() -> None:
    """Views share a key with their base; a clone does not."""
    base = torch.zeros(6)
    try:
        same, other = storage_key(base.view(2, 3)) == storage_key(base), storage_key(base.clone()) != storage_key(base)
    except AttributeError as err:
        raise moved("storage", "torch.UntypedStorage._cdata", str(err)) from err
    if not (same and other):
        raise moved("storage", "torch.UntypedStorage._cdata", "it no longer tells shared storages from distinct ones")
