"""A Dockerfile's image built and run for real with podman, without ever pulling from a registry.

The base image its FROM names is used when podman already holds it. Otherwise a stand-in is built from
Debian's packages with mmdebstrap: Debian's python3 with a virtual environment at /usr/local, which puts
`python` and `pip` where the official python images keep them, and the build uses it in the FROM's place
(`podman build --from`). The image runs with its port published on 127.0.0.1 only, and is removed when the
caller is done with it.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from helpers.core.paths import build_dir
from helpers.core.procs import LOOPBACK, ServedProcess, free_port

STAND_IN_TAG = "localhost/edl-python-base:{suite}"
DEBIAN_SUITES = ("bookworm", "trixie", "bullseye")
# What the stand-in holds: Python with venv and pip, certificates for pip's downloads, useradd for USER steps.
STAND_IN_PACKAGES = "python3,python3-venv,ca-certificates,passwd"


class ImageUnavailable(RuntimeError):
    """No image can be built here; the message says why and what would make it possible."""


def debian_suite(base: str) -> str:
    """The Debian release a base image names (``python:3.11.14-slim-bookworm`` -> ``bookworm``); bookworm otherwise."""
    tag = base.rsplit(":", 1)[-1] if ":" in base.split("/")[-1] else ""
    return next((suite for suite in DEBIAN_SUITES if tag.endswith(suite)), "bookworm")


def has_image(podman: str, name: str) -> bool:
    return subprocess.run([podman, "image", "exists", name], capture_output=True).returncode == 0


def stand_in_base(podman: str, suite: str) -> str:
    """The tag of a Python base built from Debian's ``suite`` with mmdebstrap (built once, then reused)."""
    tag = STAND_IN_TAG.format(suite=suite)
    if has_image(podman, tag):
        return tag
    mmdebstrap = shutil.which("mmdebstrap")
    if mmdebstrap is None:
        raise ImageUnavailable("mmdebstrap is not installed, so no base image can be built from Debian's packages "
                               "(Debian/Ubuntu: apt install mmdebstrap), and this kit never pulls from a registry")
    with tempfile.TemporaryDirectory(prefix="edl-base-") as folder:
        tarball = Path(folder) / "rootfs.tar"
        print(f"building {tag} from Debian {suite}'s packages with mmdebstrap (once; about a minute)", flush=True)
        made = subprocess.run([mmdebstrap, "--variant=minbase", f"--include={STAND_IN_PACKAGES}",
                               "--customize-hook=chroot \"$1\" python3 -m venv /usr/local", suite, str(tarball)],
                              capture_output=True, text=True)
        if made.returncode != 0:
            raise ImageUnavailable(f"mmdebstrap could not build a {suite} base (exit {made.returncode}; as a user other "
                                   f"than root it needs subordinate ids in /etc/subuid):\n{made.stderr[-2000:]}")
        subprocess.run([podman, "import", "--change", 'CMD ["python"]', str(tarball), tag],
                       check=True, capture_output=True)
    return tag


def build_image(podman: str, dockerfile: str | Path, context: str | Path, tag: str, base: str,
                extra_args: Sequence[str] = ()) -> str:
    """``podman build`` the Dockerfile as ``tag`` (no pull; Docker format, which keeps HEALTHCHECK); returns the base used."""
    used = base if has_image(podman, base) else stand_in_base(podman, debian_suite(base))
    if used != base:
        print(f"podman has no {base} image and this kit never pulls one: building on {used} in its place", flush=True)
    command = [podman, "build", "--pull=never", "--format=docker", "-f", str(dockerfile), "-t", tag,
               *(["--from", used] if used != base else []), *extra_args, str(context)]
    built = subprocess.run(command)
    if built.returncode != 0:
        raise RuntimeError(f"podman build exited with code {built.returncode}: the step it stopped at is printed above "
                           "(a package index this machine cannot reach? pass a mirror with IMAGE_ARGS='--build-arg ...')")
    return used


@contextlib.contextmanager
def running_image(podman: str, tag: str, container_port: int, startup_timeout: float = 120.0) -> Iterator[ServedProcess]:
    """The image running, its ``container_port`` published on 127.0.0.1 and a free port; removed afterwards."""
    port = free_port()
    name = f"edl-{re.sub(r'[^a-z0-9]+', '-', tag.lower())}-{port}"
    command = [podman, "run", "--rm", "--name", name, "-p", f"{LOOPBACK}:{port}:{container_port}", tag]
    try:
        with ServedProcess(command, port, log_path=build_dir("serving") / f"image-{port}.log",
                           startup_timeout=startup_timeout) as served:
            yield served
    finally:  # stopping `podman run` stops its container; make sure, since conmon is not our child
        subprocess.run([podman, "rm", "--force", "--ignore", "--time", "5", name], capture_output=True)
