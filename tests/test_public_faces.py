"""Each package's public face: every listed name resolves, and none is shadowed by a submodule of the same name."""
from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys

import pytest

import helpers

PACKAGES = ["helpers"] + [f"helpers.{m.name}" for m in pkgutil.iter_modules(helpers.__path__) if m.ispkg and m.name != "course"]


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_resolves_to_what_the_face_promises(package):
    face = importlib.import_module(package)
    for name in face.__all__:
        value = getattr(face, name)
        assert value is not None, f"{package}.{name} resolved to None"


def _modules_in_fresh_interpreter(package: str, names: list[str], import_submodules_first: bool) -> subprocess.Popen:
    """A fresh interpreter that prints, for each of ``names``, whether ``package.<name>`` is a module there
    (optionally after importing every submodule); started, not waited for."""
    code = (
        "import importlib, inspect, pkgutil\n"
        f"face = importlib.import_module({package!r})\n"
        f"if {import_submodules_first}:\n"
        "    for m in pkgutil.iter_modules(face.__path__):\n"
        "        importlib.import_module(face.__name__ + '.' + m.name)\n"
        f"for name in {names!r}:\n"
        "    print(name, inspect.ismodule(getattr(face, name)))\n"
    )
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def _answers(process: subprocess.Popen) -> dict[str, bool]:
    out, _ = process.communicate(timeout=300)
    assert process.returncode == 0, f"the fresh interpreter failed (exit {process.returncode})"
    return {name: value == "True" for name, value in (line.split() for line in out.splitlines())}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_public_function_is_shadowed_by_a_submodule_of_the_same_name(package):
    """Importing a submodule binds it on its package; a public function of that name would then be hidden."""
    face = importlib.import_module(package)
    submodules = {m.name for m in pkgutil.iter_modules(face.__path__)}
    names = sorted(set(face.__all__) & submodules)
    if not names:
        return  # no exported name is also a submodule's: nothing can be shadowed
    # what each name is before any submodule is imported (one interpreter per name, as a lazy face resolves each
    # alone) and what all are after every submodule is imported: the interpreters run side by side
    alone = {name: _modules_in_fresh_interpreter(package, [name], import_submodules_first=False) for name in names}
    after = _modules_in_fresh_interpreter(package, names, import_submodules_first=True)
    promised = {name: _answers(process)[name] for name, process in alone.items()}
    after_imports = _answers(after)
    for name in names:
        assert after_imports[name] == promised[name], (
            f"{package} exports {name!r}, which is also its submodule {package}.{name}: once that module is "
            f"imported, `from {package} import {name}` returns the module. Rename the module.")


def test_generated_files_go_to_the_checkouts_build_folder_wherever_python_runs(tmp_path):
    """build_dir and data_root find the checkout from the package's own location, not from the working folder."""
    code = "from helpers.core.paths import build_dir; from helpers.core.data import data_root; print(build_dir('x')); print(data_root())"
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("EDL_BUILD_DIR", "EDL_DATA_DIR")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env=env)
    built, data = out.stdout.split()
    checkout = __import__("pathlib").Path(helpers.__file__).resolve().parents[1]
    assert built == str(checkout / "build" / "x") and data == str(checkout / "data")
