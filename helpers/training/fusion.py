"""Lecture 5c's apparatus: which kernels a function runs eagerly, and which ones Inductor generates for it.

Eagerly, every ATen operator that computes something is a kernel of its own (views are not: they only
change the shape and strides of an existing tensor). Compiled, Inductor fuses chains of element-wise
operations and reductions into generated kernels (C++ loops on a CPU, Triton on a GPU) and calls libraries
for the rest (``extern_kernels.mm`` and the like); both are read from the code it generates.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from helpers.core.torch_adapters.dispatch import TorchDispatchMode, is_view
from helpers.core.torch_adapters.inductor_code import GENERATED, LIBRARY, run_and_get_code


class _AtenCalls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not is_view(func):
            self.calls.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def eager_kernels(fn: Callable, *args) -> list[str]:
    """The ATen operators one eager call of ``fn(*args)`` runs, views left out: one kernel each."""
    with _AtenCalls() as mode:
        fn(*args)
    return mode.calls


@dataclass(frozen=True)
class GeneratedCode:
    """What Inductor wrote for one compiled function: its source and the kernels in it."""

    source: str
    generated: list[str]  # kernels Inductor wrote (fused loops), by name
    library: list[str]  # library calls it kept (a matrix product goes to oneDNN or cuBLAS)

    @property
    def kernels(self) -> int:
        return len(self.generated) + len(self.library)

    def kernel_source(self, name: str | None = None, lines: int = 40) -> str:
        """The first ``lines`` lines of a generated kernel's definition (the first one when no name is given)."""
        name = name or (self.generated[0] if self.generated else None)
        if name is None:
            return "(Inductor generated no kernel: every operation went to a library)"
        start = self.source.index(f"{name} = async_compile")
        return "\n".join(self.source[start:].splitlines()[:lines])


def inductor_code(compiled: Callable, *args) -> tuple[object, GeneratedCode]:
    """Call ``compiled`` (a ``torch.compile``d function) on ``args``; return its output and the code Inductor wrote
    for these inputs (compiled on this call, or on an earlier one with the same shapes)."""
    output, sources = run_and_get_code(compiled, *args)
    if not sources:
        raise RuntimeError("no code from Inductor to read: pass a function compiled with torch.compile (Inductor, "
                           "the default backend), not the plain function")
    source = "\n".join(sources)
    return output, GeneratedCode(source, GENERATED.findall(source), LIBRARY.findall(source))


def count_launches(fn: Callable, *args, device: str | torch.device | None = None) -> int | None:
    """Kernels one call of ``fn(*args)`` launched on a CUDA GPU (torch.profiler's device events); None on a CPU.

    The device is ``device`` where given, else a GPU when any argument is a CUDA tensor.
    """
    on_gpu = torch.device(device).type == "cuda" if device is not None else any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    if not on_gpu or not torch.cuda.is_available():
        return None
    fn(*args)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        fn(*args)
        torch.cuda.synchronize()
    return sum(1 for event in profile.events() if event.device_type == torch.autograd.DeviceType.CUDA)
