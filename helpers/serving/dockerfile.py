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
    return DockerfileReport(rows, [f"{path}: {len(steps)} instructions; no image was built or pulled."])
