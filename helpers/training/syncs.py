"""Count the reads that make the host wait for the device: ``.item()``, ``float(t)``, ``if t:``, ``.tolist()``, ``.cpu()``...

On a GPU each of these blocks Python until every queued kernel has finished, so a
training loop that makes one per step can never run ahead of the device (the
"synchronisation bound" profile). The reads are counted where they happen, whoever
makes them and from whatever module:

- at torch's dispatcher, every ``aten._local_scalar_dense`` (the one op behind ``.item()``,
  ``float()``, ``int()``, ``bool()`` and formatting a tensor) and every copy from an
  accelerator to the CPU;
- at the Python level, the reads that never reach the dispatcher on a CPU: ``.tolist()``,
  ``.numpy()``, ``__array__`` and ``repr``.

Every read counts, torch's own included (Adam's step counters and a DataLoader's seed are
read with ``.item()`` too): measure a loop built without them, or compare two loops.

    with count_host_syncs() as syncs:
        train(...)
    syncs.total, syncs.counts   # e.g. 64, Counter({'_local_scalar_dense': 64})
"""
from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode

from helpers.core.torch_adapters.dispatch import TorchDispatchMode

# Tensor methods that read values to the host without an aten op on a CPU (on a GPU they copy, which is counted too).
PYTHON_LEVEL_READS = frozenset({"tolist", "numpy", "__array__", "__repr__"})
SCALAR_READ = "_local_scalar_dense"
COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})


class SyncCounter:
    """Counts host reads while active; ``counts`` by what read (op or method name), ``total``."""

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self._inside_read = 0  # > 0 while a Python-level read runs: its own aten ops are not counted again
        self._modes = (_ReadMethods(self), _ReadOps(self))

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> SyncCounter:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _ReadMethods(TorchFunctionMode):
    """Python level: the methods in PYTHON_LEVEL_READS, whoever calls them."""

    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in PYTHON_LEVEL_READS or self.counter._inside_read:
            return func(*args, **(kwargs or {}))
        self.counter.counts[name] += 1
        self.counter._inside_read += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.counter._inside_read -= 1


class _ReadOps(TorchDispatchMode):
    """Dispatcher level: ``_local_scalar_dense`` on any device, and copies from an accelerator to the CPU."""

    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not self.counter._inside_read:
            name = func.overloadpacket.__name__
            if name == SCALAR_READ or (name in COPY_OPS and _device_to_host(args, out)):
                self.counter.counts[name] += 1
        return out


def _device_to_host(args, out) -> bool:
    """A copy whose source lives on an accelerator and whose result is on the CPU."""
    sources = [a for a in args if isinstance(a, torch.Tensor)]
    target = out if isinstance(out, torch.Tensor) else (sources[0] if sources else None)
    return target is not None and target.device.type == "cpu" and any(s.device.type != "cpu" for s in sources)


def count_host_syncs() -> SyncCounter:
    """A context manager counting host reads of tensors inside the block (``.total``, ``.counts``)."""
    return SyncCounter()
