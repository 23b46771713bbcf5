"""Adapter for replacing an operator's kernels process-wide, for a while, written for torch 2.14.

A dispatch mode (``dispatch.py``) sees only the operators of the thread that entered it; a kernel registered
with ``torch.library.Library(namespace, "IMPL")`` is what every thread's call reaches. Relies on:
``torch._C._dispatch_get_all_op_names()`` (the registered operator names, ``namespace::name``), registering
a Python kernel over an existing one for a dispatch key (torch warns that it overrides; the old kernel stays
registered underneath), and ``Library._destroy()``, which removes the new kernels so the old ones answer again.
``calls_wrapped`` registers at the Autograd keys, which every CPU and CUDA tensor's call passes before its
backend kernel, and reaches that kernel again under ``torch._C._AutoDispatchBelowAutograd()``.
"""
from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable, Iterable, Iterator

import torch

from helpers.core.torch_adapters.changes import moved

_all_op_names = getattr(torch._C, "_dispatch_get_all_op_names", None)


def op_names(namespaces: Iterable[str]) -> list[str]:
    """The registered operators of ``namespaces``, as ``namespace::name`` (overload names left out)."""
    if _all_op_names is None:
        raise moved("op_overrides", "torch._C._dispatch_get_all_op_names", "it is gone")
    wanted = tuple(f"{ns}::" for ns in namespaces)
    return sorted({name for name in _all_op_names() if name.startswith(wanted)})


@contextlib.contextmanager
def kernels_replaced(kernels: dict[str, Callable], dispatch_keys: Iterable[str] = ("CPU", "CUDA")) -> Iterator[None]:
    """Within the block, ``kernels[op]`` answers every call of ``op`` (``namespace::name``) in any thread, for each key."""
    libraries: dict[str, torch.library.Library] = {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Overriding a previously registered kernel": that is the point
            for op, kernel in kernels.items():
                namespace, _, name = op.partition("::")
                library = libraries.setdefault(namespace, torch.library.Library(namespace, "IMPL"))
                for key in dispatch_keys:
                    library.impl(name, kernel, key)
        yield
    finally:
        for library in libraries.values():
            if not hasattr(library, "_destroy"):
                raise moved("op_overrides", "torch.library.Library._destroy", "it is gone: the kernels cannot be put back")
            library._destroy()


@contextlib.contextmanager
def calls_wrapped(wrappers: dict[str, Callable[..., Any]]) -> Iterator[None]:
    """Within the block, every call of ``op`` in any thread runs ``wrappers[op](original, *args)`` instead.

    ``original(*args)`` is the operator's own kernel (CPU or CUDA), so a wrapper can change what goes in or
    comes out and still do the real work. Autograd does not record a wrapped call: meant for operators with no
    backward (c10d's).
    """
    below = getattr(torch._C, "_AutoDispatchBelowAutograd", None)
    if below is None:
        raise moved("op_overrides", "torch._C._AutoDispatchBelowAutograd", "it is gone")

    def kernel_for(op: str, wrapper: Callable[..., Any]) -> Callable[..., Any]:
        namespace, _, name = op.partition("::")
        operator = getattr(getattr(torch.ops, namespace), name).default

        def original(*args):
            with below():
                return operator(*args)

        return lambda *args: wrapper(original, *args)

    with kernels_replaced({op: kernel_for(op, w) for op, w in wrappers.items()}, ("AutogradCPU", "AutogradCUDA")):
        yield


def check() -> None:
    """A replaced kernel answers in every thread, and the old one answers again after the block."""
    import threading

    x = torch.tensor([1.0, -2.0])
    seen = []
    with kernels_replaced({"aten::neg": lambda t: torch.zeros_like(t)}, ("CPU",)):
        worker = threading.Thread(target=lambda: seen.append(torch.neg(x)))
        worker.start()
        worker.join()
    if not (seen and torch.equal(seen[0], torch.zeros(2)) and torch.equal(torch.neg(x), -x)):
        raise moved("op_overrides", "torch.library.Library.impl over an existing kernel",
                    f"the replacement did not answer in another thread, or the old kernel did not come back ({seen})")
    doubled = []
    with calls_wrapped({"aten::neg": lambda original, t: original(t) * 2}):
        worker = threading.Thread(target=lambda: doubled.append(torch.neg(x)))
        worker.start()
        worker.join()
    if not (doubled and torch.equal(doubled[0], -2 * x) and torch.equal(torch.neg(x), -x)):
        raise moved("op_overrides", "a kernel at AutogradCPU reaching the CPU kernel below autograd",
                    f"the wrapper did not answer in another thread, or the op did not come back ({doubled})")
    if "aten::neg" not in op_names(["aten"]):
        raise moved("op_overrides", "torch._C._dispatch_get_all_op_names", "aten::neg is not among the names")
