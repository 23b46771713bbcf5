"""Static checks of a service's Dockerfile: what a reviewer looks for before an image is ever built.

No image can be pulled or built here, so the checks read the file: a pinned base image, a non-root
user, dependencies installed before the code is copied (layer caching), an exposed port, a health
check, an exec-form start command, and no secrets baked into the image.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from helpers.core.report import Report, column

SECRET_WORDS = re.compile(r"(PASSWORD|PASSWD|SECRET|TOKEN|API_KEY|ACCESS_KEY)", re.IGNORECASE)


@dataclass
class DockerCheck:
    check: str = column("check")
    passed: bool = column("passed")
    detail: str = column("detail")


class DockerfileReport(Report):
    """One row per static check of a Dockerfile; ``ok`` when all pass."""

    title = "Dockerfile, checked statically"

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.rows)

    @property
    def failed(self) -> list[str]:
        return [r.check for r in self.rows if not r.passed]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per logical line: comments dropped, backslash continuations joined."""
    joined = re.sub(r"\\\s*\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def check_dockerfile(path: str | Path) -> DockerfileReport:
    """Check the Dockerfile at ``path``; a missing or empty file is an error that says so."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no Dockerfile at {path}: write one (see lectures/06-web-services/Dockerfile)")
    steps = instructions(path.read_text())
    if not steps:
        raise ValueError(f"{path} has no instructions")
    kinds = [k for k, _ in steps]
    base = next((a for k, a in steps if k == "FROM"), "")
    image = base.split(" AS ")[0].split(" as ")[0].strip()
    pinned = "@sha256:" in image or (":" in image.split("/")[-1] and not image.endswith(":latest"))
    users = [a for k, a in steps if k == "USER"]
    copy_code = [i for i, (k, a) in enumerate(steps) if k in ("COPY", "ADD") and not re.search(r"requirements|pyproject|\.lock", a)]
    installs = [i for i, (k, a) in enumerate(steps) if k == "RUN" and re.search(r"pip install|uv pip|poetry install", a)]
    cmd = next((a for k, a in reversed(steps) if k in ("CMD", "ENTRYPOINT")), "")
    secrets = [a for k, a in steps if k in ("ENV", "ARG") and SECRET_WORDS.search(a.split("=")[0].split(" ")[0])]
    urls = [a for k, a in steps if k == "ADD" and re.search(r"https?://", a)]
    rows = [
        DockerCheck("FROM a pinned base image", bool(base) and pinned,
                    f"{image} (a tag or digest, not :latest)" if pinned else f"{image or 'no FROM'}: pin a tag or a digest"),
        DockerCheck("runs as a non-root USER", bool(users) and users[-1].split(":")[0] not in ("root", "0"),
                    f"USER {users[-1]}" if users else "no USER: the process would run as root"),
        DockerCheck("dependencies installed before the code is copied", bool(installs) and (not copy_code or min(installs) < min(copy_code)),
                    "the pip layer is cached across code changes" if installs else "no pip install step found"),
        DockerCheck("EXPOSE the service port", "EXPOSE" in kinds, next((a for k, a in steps if k == "EXPOSE"), "no EXPOSE")),
        DockerCheck("a HEALTHCHECK", "HEALTHCHECK" in kinds, "probes /health" if "HEALTHCHECK" in kinds else "no HEALTHCHECK"),
        DockerCheck("exec-form start command", cmd.startswith("["),
                    "signals reach the server directly" if cmd.startswith("[") else f"shell form ({cmd or 'no CMD'}): SIGTERM goes to sh"),
        DockerCheck("no secrets in ENV/ARG", not secrets, "none" if not secrets else "; ".join(secrets)),
        DockerCheck("no ADD from a URL", not urls, "none" if not urls else "; ".join(urls)),
    ]
    return DockerfileReport(rows, [f"{path}: {len(steps)} instructions, read (this check builds and pulls nothing)."])


# ---------------------------------------------------------------- running an image's CMD without a container engine

PIP_OPTIONS_WITH_VALUE = {"--index-url", "-i", "--extra-index-url", "--find-links", "-f", "--trusted-host", "--target", "-t",
                          "--root", "--prefix", "--constraint", "-c"}


@dataclass
class ImagePlan:
    """What a Dockerfile asks for, as far as running its command here goes."""

    base: str
    workdir: str
    copies: list[tuple[list[str], str]]  # (sources in the context, destination)
    requirements: list[str]  # what its `pip install` lines name
    env: dict[str, str]
    command: list[str]
    port: int | None
    skipped: list[str]  # RUN steps other than pip, USER: noted, not emulated


def pip_requirements(arguments: str, context: Path) -> list[str]:
    """The requirement strings of one RUN line's ``pip install`` commands (``-r file`` read from the context)."""
    found = []
    for command in re.split(r"&&|;", arguments):
        words = command.split()
        if "install" not in words or not any(w.endswith("pip") or w == "pip3" for w in words[:words.index("install")]):
            continue
        words = words[words.index("install") + 1:]
        skip = False
        for i, word in enumerate(words):
            if skip:
                skip = False
            elif word in ("-r", "--requirement"):
                file = context / words[i + 1]
                if not file.is_file():
                    raise ValueError(f"`pip install -r {words[i + 1]}`: no such file in the build context {context}")
                found += [line.split("#")[0].strip() for line in file.read_text().splitlines()
                          if line.split("#")[0].strip() and not line.startswith("-")]
                skip = True
            elif word in PIP_OPTIONS_WITH_VALUE:
                skip = True
            elif not word.startswith("-") and not (i > 0 and words[i - 1] in ("-r", "--requirement")):
                found.append(word.strip("'\""))
    return found


def image_plan(path: str | Path, context: str | Path) -> ImagePlan:
    """Read the Dockerfile at ``path`` (build context ``context``) into the steps that matter for running it."""
    import json
    import shlex

    path, context = Path(path), Path(context)
    steps = instructions(path.read_text())
    base, workdir, copies, requirements, env, command, port, skipped = "", "/", [], [], {}, [], None, []
    for kind, arguments in steps:
        if kind == "FROM":
            base = arguments.split()[0]
        elif kind == "WORKDIR":
            workdir = arguments if arguments.startswith("/") else f"{workdir.rstrip('/')}/{arguments}"
        elif kind in ("COPY", "ADD"):
            words = [w for w in (json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments))
                     if not w.startswith("--")]
            if len(words) < 2:
                raise ValueError(f"{kind} {arguments}: needs a source and a destination")
            copies.append((words[:-1], words[-1]))
        elif kind == "RUN":
            names = pip_requirements(arguments, context)
            requirements += names
            if not names:
                skipped.append(f"RUN {arguments[:60]}")
        elif kind == "ENV":
            if "=" in arguments.split()[0]:
                env.update(dict(pair.split("=", 1) for pair in shlex.split(arguments)))
            else:
                key, _, value = arguments.partition(" ")
                env[key] = value.strip()
        elif kind in ("CMD", "ENTRYPOINT"):
            if not arguments.startswith("["):
                raise ValueError(f"{kind} {arguments}: write it in exec form, [\"program\", \"arg\", ...]")
            words = json.loads(arguments)
            command = words if kind == "ENTRYPOINT" or not command else command + words
        elif kind == "EXPOSE":
            port = int(arguments.split()[0].split("/")[0])
        elif kind == "USER":
            skipped.append(f"USER {arguments}")
    return ImagePlan(base, workdir, copies, requirements, env, command, port, skipped)


def _installed_closure(requirements: list[str]):
    """The installed distributions that ``requirements`` name, with everything they need (a clear error when one is missing)."""
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    chosen, queue = {}, []
    for text in requirements:
        try:
            queue.append((Requirement(text), text))
        except InvalidRequirement as err:
            raise ValueError(f"pip install {text}: not a requirement pip would accept ({err})") from err
    while queue:
        requirement, wanted_by = queue.pop()
        name = canonicalize_name(requirement.name)
        if name in chosen:
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError as err:
            raise ValueError(f"{wanted_by} needs {requirement.name}, which this environment cannot install offline") from err
        if requirement.specifier and not requirement.specifier.contains(dist.version, prereleases=True):
            raise ValueError(f"{wanted_by}: {requirement} asked, but only {dist.version} can be installed here: pin that version")
        chosen[name] = dist
        for extra_text in dist.requires or []:
            need = Requirement(extra_text)
            extras = requirement.extras or {""}
            if need.marker is None or any(need.marker.evaluate({"extra": e}) for e in extras):
                queue.append((need, f"{wanted_by} (through {requirement.name})"))
    return chosen


def packages_weight(dockerfile: str | Path, context: str | Path) -> tuple[int, list[str]]:
    """What the image's pip lines install: (bytes on disk, the distributions' names), each requirement with everything
    it needs, as this environment holds them (the same closure ``clean_environment`` links into the image's venv)."""
    closure = _installed_closure(image_plan(dockerfile, context).requirements)
    total = 0
    for dist in closure.values():
        root = Path(dist.locate_file(""))
        total += sum((root / file).stat().st_size for file in dist.files or [] if (root / file).is_file())
    return total, sorted(closure)


def clean_environment(requirements: list[str], folder: Path) -> Path:
    """A virtual environment at ``folder`` holding only ``requirements`` and what they depend on; returns its python.

    Nothing is downloaded: each distribution is linked in from this environment (the versions
    the kit installs), file by top-level entry, so making one costs seconds, not a pip install.
    """
    import subprocess
    import sys

    folder = Path(folder)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, capture_output=True)
    python = folder / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # top-level entry -> (folder, child) pairs: each distribution's files where it was installed (site-packages, or a
    # --target folder on PYTHONPATH); child "" means the entry is the distribution's own, not a shared namespace folder
    owners: dict[str, set[tuple[Path, str]]] = {}
    for dist in _installed_closure(requirements).values():
        root = Path(dist.locate_file(""))
        for file in dist.files or []:
            parts = Path(file).parts
            if parts and parts[0] != ".." and not parts[0].endswith(".pth") and (root / parts[0]).exists():
                owners.setdefault(parts[0], set()).add((root, parts[1] if len(parts) > 2 else ""))
    for top, places in owners.items():
        if (site / top).exists():
            continue
        whole = [root for root, child in places if child == "" or not (root / top).is_dir()]
        if whole:
            (site / top).symlink_to(whole[0] / top)
        else:  # a namespace folder several distributions share: link only the children of the chosen ones
            (site / top).mkdir()
            for root, child in places:
                if not (site / top / child).exists():
                    (site / top / child).symlink_to(root / top / child)
    return python


def start_image_command(dockerfile: str | Path, context: str | Path, folder: str | Path, startup_timeout: float = 120.0):
    """Run the image's CMD as ``docker run`` would, without a container engine: a ServedProcess answering /health.

    The files its COPY steps name are copied from ``context`` into ``folder``/root, its pip lines are
    installed into a clean virtual environment (``clean_environment``), its ENV is set, and its CMD starts
    in its WORKDIR, on 127.0.0.1 and a free port in place of the port it EXPOSEs (and of 0.0.0.0).
    Raises ValueError naming what cannot run (an unknown base, a missing file, a package it never installs
    shows up as the server's own import error in the raised RuntimeError).
    """
    import glob
    import shutil

    from helpers.core.procs import LOOPBACK, ServedProcess, free_port

    folder, context = Path(folder), Path(context)
    plan = image_plan(dockerfile, context)
    if not re.match(r"(docker\.io/)?(library/)?python:3\.11", plan.base):
        raise ValueError(f"FROM {plan.base or '(none)'}: only python:3.11 images can be run here (this kit's Python)")
    if not plan.command:
        raise ValueError("no CMD or ENTRYPOINT: the image would not start anything")
    if plan.port is None:
        raise ValueError("no EXPOSE: which port does the service listen on?")
    root = folder / "root"
    workdir = root / plan.workdir.lstrip("/")
    workdir.mkdir(parents=True, exist_ok=True)
    for sources, destination in plan.copies:
        target = (workdir / destination) if not destination.startswith("/") else root / destination.lstrip("/")
        for source in sources:
            matches = glob.glob(str(context / source))
            if not matches:
                raise ValueError(f"COPY {source}: not in the build context {context}")
            for match in map(Path, matches):
                into_folder = destination.endswith("/") or len(sources) > 1 or len(matches) > 1 or match.is_dir()
                if match.is_dir():
                    shutil.copytree(match, target if destination.endswith("/") or destination in (".", "./") else target,
                                    dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    out = target / match.name if into_folder or target.is_dir() else target
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(match, out)
    python = clean_environment(plan.requirements, folder / "venv")
    port = free_port()
    command = []
    for i, word in enumerate(plan.command):
        if i == 0 and word in ("python", "python3", "python3.11", "/usr/local/bin/python"):
            command += [str(python), "-E", "-s"]
        elif i == 0 and (python.parent / word).exists() is False and "/" not in word:
            command += [str(python), "-E", "-s", "-m", word]  # a console script: run its module
        else:
            command.append(word.replace("0.0.0.0", LOOPBACK).replace(str(plan.port), str(port))
                           if word in ("0.0.0.0", str(plan.port)) or word.endswith((f"={plan.port}", f":{plan.port}"))
                           or word.startswith("--host=") else word)
    env = {**plan.env, "PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(folder), "PYTHONDONTWRITEBYTECODE": "1"}
    return ServedProcess(command, port, health_path="/health", log_path=folder / "image.log", env=env, cwd=workdir,
                         startup_timeout=startup_timeout)


def main(argv: list[str] | None = None) -> int:
    """``make image``: build and run the lecture's image with podman where it can, else run its CMD in a clean environment."""
    import argparse
    import shlex
    import shutil
    import tempfile
    import urllib.request

    from helpers.serving.container_image import ImageUnavailable, build_image, running_image

    parser = argparse.ArgumentParser(prog="python -m helpers.serving.dockerfile", description=main.__doc__)
    parser.add_argument("--dockerfile", default="lectures/06-web-services/Dockerfile")
    parser.add_argument("--context", default=".")
    parser.add_argument("--build-args", default="", help="more `podman build` options, one shell-quoted string "
                        "(a mirror: --build-arg TORCH_INDEX_URL=...; a folder of wheels: -v /wheels:/wheels:ro)")
    args = parser.parse_args(argv)
    from helpers.serving.model import mnist_model

    mnist_model()  # the image copies the trained weights from build/serving/
    print(check_dockerfile(args.dockerfile))
    plan = image_plan(args.dockerfile, args.context)
    podman = shutil.which("podman")
    why = "podman is not installed (install it, e.g. `apt-get install podman`, and `make image` builds and runs the image)"
    if podman:
        tag = "edl-mnist-service:local"
        try:
            build_image(podman, args.dockerfile, args.context, tag, plan.base, shlex.split(args.build_args))
        except ImageUnavailable as err:
            why = str(err)
        except RuntimeError as err:
            print(f"make image: {err}")
            return 1
        else:
            with running_image(podman, tag, plan.port) as served, urllib.request.urlopen(served.url + "/health") as answer:
                print(f"podman: the image {tag} runs; {served.url}/health answered {answer.status}")
            return 0
    print(f"{why}.\nRunning the image's CMD in a clean virtual environment that holds only what the Dockerfile installs:")
    with tempfile.TemporaryDirectory(prefix="edl-image-") as folder, start_image_command(args.dockerfile, args.context, folder) as served:
        with urllib.request.urlopen(served.url + "/health") as answer:
            print(f"{served.url}/health answered {answer.status}: the image's command starts with only its own packages")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
