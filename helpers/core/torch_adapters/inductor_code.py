"""Adapter for reading the code Inductor generates (``torch._inductor.utils.run_and_get_code``), written for torch 2.14.

Relies on: ``run_and_get_code(fn, *args)`` calling ``fn`` (a ``torch.compile``d function) and returning
``(output, sources)``, ``sources`` being the Python wrapper modules Inductor wrote during that call, in which each
generated kernel is bound as ``<name> = async_compile.cpp_pybinding(...)`` (C++ on a CPU) or
``<name> = async_compile.triton(...)`` (a GPU), and each library call reads ``extern_kernels.<op>(``.
"""
from __future__ import annotations

import re

import torch

from helpers.core.torch_adapters.changes import moved, require

run_and_get_code = require("inductor_code", "torch._inductor.utils", "run_and_get_code")
GENERATED = re.compile(r"^(\w+) = async_compile\.(?:cpp_pybinding|cpp|triton)\(", re.MULTILINE)
LIBRARY = re.compile(r"\bextern_kernels\.(\w+)\(")


def check() -> None:
    """A compiled x * 2 + 1 is one generated kernel, and a matrix product one library call."""
    torch._dynamo.reset()
    try:
        _, sources = run_and_get_code(torch.compile(lambda x, w: (x @ w) * 2 + 1), torch.ones(4, 4), torch.ones(4, 4))
    finally:
        torch._dynamo.reset()
    source = "\n".join(sources)
    if len(GENERATED.findall(source)) != 1 or LIBRARY.findall(source) not in (["mm"], ["addmm"]):
        raise moved("inductor_code", "torch._inductor.utils.run_and_get_code", "its source no longer binds kernels as "
                    f"`name = async_compile.cpp_pybinding(` or calls `extern_kernels.mm(`: found {GENERATED.findall(source)}, {LIBRARY.findall(source)}")
