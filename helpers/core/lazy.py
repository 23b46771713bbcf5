"""Lazy public faces: a package lists its public names once, and each is imported on first use.

This keeps ``import helpers`` cheap (no torch.distributed, widgets or pyplot until a
lecture asks for a name that needs them) while ``from helpers import profile_ops`` works.
"""
from __future__ import annotations

import importlib
import sys
from typing import Callable, Mapping, Sequence


def lazy_exports(package: str, exports: Mapping[str, Sequence[str]]) -> tuple[Callable, Callable, list[str]]:
    """Return ``(__getattr__, __dir__, __all__)`` for ``package`` from ``{module: [names]}``.

    A module path may be relative to ``package`` (``".bench"``); names listed under
    the package itself (``{"helpers.core": ["models"]}``) are its submodules.
    """
    where: dict[str, str] = {}
    for module, names in exports.items():
        for name in names:
            if name in where:
                raise ValueError(f"{package}: {name!r} is exported from both {where[name]} and {module}")
            where[name] = module

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where[name], package)
        if module.__name__ == package:  # a submodule of this very package
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(module, name)
        setattr(sys.modules[package], name, value)  # later look-ups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__, sorted(where)
