"""Each package's public face: every listed name resolves, and none is shadowed by a submodule of the same name."""
from __future__ import annotations

import importlib
import pkgutil

import pytest

import helpers

PACKAGES = ["helpers"] + [f"helpers.{m.name}" for m in pkgutil.iter_modules(helpers.__path__) if m.ispkg and m.name != "course"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_to_what_the_face_promises(package):
    face = importlib.import_module(package)
    for name in face.__all__:
        value = getattr(face, name)
        assert value is not None, f"{package}.{name} resolved to None"


@pytest.mark.parametrize("package", PACKAGES)
def test_no_public_function_shares_its_name_with_a_submodule(package):
    """Once a submodule is imported, Python binds it on its package and it would hide a public name."""
    face = importlib.import_module(package)
    submodules = {m.name for m in pkgutil.iter_modules(face.__path__)}
    for name in set(face.__all__) & submodules:
        value = getattr(face, name)
        assert value.__name__ == f"{package}.{name}", (
            f"{package} exports {name!r}, which is also the name of its submodule {package}.{name}: "
            "rename the module so that `from {package} import {name}` cannot return the module")
