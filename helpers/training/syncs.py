"""Count the reads that make the host wait for the device: ``.item()``, ``float(t)``, ``if t:``, ``.tolist()``, ``.cpu()``...

On a GPU each of these blocks Python until every queued kernel has finished, so a
training loop that makes one per step can never run ahead of the device (the
"synchronisation bound" profile). The reads are counted where they happen, whoever
makes them, from whatever module and on whatever thread of the process:

- at torch's dispatcher, every ``aten._local_scalar_dense`` (the one op behind ``.item()``,
  ``float()``, ``int()``, ``bool()`` and formatting a tensor), by a kernel that counts in place
  of the op's own (CPU, CUDA, MPS) while a counter is open;
- at the Python level, the tensor methods that read without that op on a CPU: ``.tolist()``,
  ``.numpy()``, ``__array__`` and ``repr``, replaced on ``torch.Tensor`` while a counter is open;
- copies from an accelerator to the CPU, by a dispatch mode of the thread that opened the counter.

Every read counts, torch's own included (Adam's step counters and a DataLoader's seed are
read with ``.item()`` too): measure a loop built without them, or compare two loops.

    with count_host_syncs() as syncs:
        train(...)
    syncs.total, syncs.counts   # e.g. 64, Counter({'_local_scalar_dense': 64})
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections import Counter

import torch

from helpers.core.torch_adapters.dispatch import TorchDispatchMode
from helpers.core.torch_adapters.op_overrides import kernels_replaced

# Tensor methods that read values to the host without an aten op on a CPU (on a GPU they copy, counted as the method).
PYTHON_LEVEL_READS = ("tolist", "numpy", "__array__", "__repr__")
SCALAR_READ = "_local_scalar_dense"
COPY_OPS = frozenset({"_to_copy", "copy_", "_copy_from", "_copy_from_and_resize"})
DEVICE_KEYS = ("CPU", "CUDA", "MPS")  # the backends whose scalar reads are counted in every thread

_open: list[SyncCounter] = []  # the counters open now, in any thread: every read is counted by each
_open_lock = threading.Lock()
_hooks = contextlib.ExitStack()  # the process-wide kernels and methods, in place while a counter is open
_reading = threading.local()  # .depth > 0 while this thread runs a read already counted: its inner reads are not


class SyncCounter:
    """Counts host reads while active; ``counts`` by what read (op or method name), ``total``."""

    def __init__(self):
        self.counts: Counter[str] = Counter()
        self._copies = _CopiesToHost(self)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __enter__(self) -> SyncCounter:
        with _open_lock:
            if not _open:
                _hooks.enter_context(kernels_replaced({f"aten::{SCALAR_READ}": _counted_scalar_read}, DEVICE_KEYS))
                _hooks.enter_context(_methods_counted())
            _open.append(self)
        self._copies.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._copies.__exit__(*exc)
        with _open_lock:
            _open.remove(self)
            if not _open:
                _hooks.close()


@contextlib.contextmanager
def _counted_read(name: str):
    """Count one read by ``name`` in every open counter, unless it happens inside a read already counted."""
    depth = getattr(_reading, "depth", 0)
    if depth == 0:
        with _open_lock:
            for counter in _open:
                counter.counts[name] += 1
    _reading.depth = depth + 1
    try:
        yield
    finally:
        _reading.depth = depth


def _counted_scalar_read(tensor: torch.Tensor):
    """``aten._local_scalar_dense`` done without calling it (its own kernel is replaced): the one value, as Python's."""
    with _counted_read(SCALAR_READ):
        on_cpu = tensor if tensor.device.type == "cpu" else tensor.to("cpu")
        return on_cpu.reshape(-1).tolist()[0]


@contextlib.contextmanager
def _methods_counted():
    """``torch.Tensor``'s reading methods replaced by ones that count, then put back as they were."""
    own = {name: torch.Tensor.__dict__.get(name) for name in PYTHON_LEVEL_READS}
    for name in PYTHON_LEVEL_READS:
        setattr(torch.Tensor, name, _counting(name, getattr(torch.Tensor, name)))
    try:
        yield
    finally:
        for name, method in own.items():
            if method is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, method)


def _counting(name: str, method):
    @functools.wraps(method)
    def read(*args, **kwargs):
        with _counted_read(name):
            return method(*args, **kwargs)
    return read


class _CopiesToHost(TorchDispatchMode):
    """Copies from an accelerator to the CPU, in the thread that opened the counter."""

    def __init__(self, counter: SyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name in COPY_OPS and not getattr(_reading, "depth", 0) and _device_to_host(args, out):
            with _open_lock:
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
