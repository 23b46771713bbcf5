"""Dockerfiles that start: the image's CMD runs in a clean environment holding only what the Dockerfile installs."""
from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from helpers.serving.container_image import build_image, debian_suite, running_image
from helpers.serving.dockerfile import clean_environment, image_plan, packages_weight, start_image_command
from helpers.serving.model import mnist_model

from .grading_support import ROOT

LECTURE_DOCKERFILE = ROOT / "lectures" / "06-web-services" / "Dockerfile"


@pytest.mark.slow  # starts real processes: not in the unit lane
def test_the_lectures_image_starts_and_answers_health(tmp_path):
    mnist_model()
    with start_image_command(LECTURE_DOCKERFILE, ROOT, tmp_path) as served:
        assert httpx.get(served.url + "/health").json() == {"status": "ok"}
        assert served.url.startswith("http://127.0.0.1:")
    plan = image_plan(LECTURE_DOCKERFILE, ROOT)
    assert {"psutil==7.2.2", "pillow==13.0.0"} <= set(plan.requirements)


@pytest.mark.slow  # starts real processes: not in the unit lane
def test_an_image_missing_a_package_fails_with_the_servers_own_import_error(tmp_path):
    mnist_model()
    text = LECTURE_DOCKERFILE.read_text().replace(" \\\n    psutil==7.2.2 pillow==13.0.0", "")
    (tmp_path / "Dockerfile").write_text(text)
    with pytest.raises(RuntimeError, match="No module named 'psutil'"):
        start_image_command(tmp_path / "Dockerfile", ROOT, tmp_path / "run")


@pytest.mark.parametrize("text, problem", [
    ('FROM x:1\nRUN pip install\nUSER a\nEXPOSE 1\nHEALTHCHECK NONE\nCMD ["x"]', "only python:3.11"),
    ('FROM python:3.11-slim\nRUN pip install\nUSER a\nEXPOSE 1\nHEALTHCHECK NONE\nCMD ["x"]', "No module named x"),
    ('FROM python:3.11-slim\nRUN pip install fastapi==0.1\nEXPOSE 1\nCMD ["uvicorn", "a:b"]', "only 0.165.0 can be installed"),
    ('FROM python:3.11-slim\nCOPY nothing_here.py .\nEXPOSE 1\nCMD ["python", "nothing_here.py"]', "not in the build context"),
    ('FROM python:3.11-slim\nEXPOSE 1\nCMD python -m http.server 1', "exec form"),
])
def test_images_that_cannot_run_anything_fail_with_a_reason(tmp_path, text, problem):
    (tmp_path / "Dockerfile").write_text(text)
    with pytest.raises((ValueError, RuntimeError), match=problem):
        start_image_command(tmp_path / "Dockerfile", tmp_path, tmp_path / "run", startup_timeout=60)


def test_dockerignore_keeps_environments_out_and_the_weights_in():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    assert ".venv" in lines and ".git" in lines and "!build/serving/" in lines
    assert "PID 1's only child" not in LECTURE_DOCKERFILE.read_text()
    assert Path(ROOT / "Makefile").read_text().count("helpers.serving.dockerfile") == 1


@pytest.mark.parametrize("base, suite", [
    ("python:3.11.14-slim-bookworm", "bookworm"), ("docker.io/library/python:3.13-trixie", "trixie"),
    ("python:3.11", "bookworm"), ("registry.local:5000/python", "bookworm"), ("debian:bullseye", "bullseye"),
])
def test_the_stand_in_base_follows_the_debian_release_the_from_line_names(base, suite):
    assert debian_suite(base) == suite


# An image no machine holds, so that the build must use the stand-in built from Debian's packages.
TINY_DOCKERFILE = """FROM python:3.11.99-slim-bookworm
RUN useradd --uid 10001 web
WORKDIR /srv
COPY health.py .
USER web
EXPOSE 8080
CMD ["python", "health.py"]
"""
TINY_SERVER = """import http.server, os
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(f"uid={os.getuid()}".encode())
http.server.HTTPServer(("0.0.0.0", 8080), Health).serve_forever()
"""


@pytest.mark.slow  # builds and runs a real image (about a minute the first time, while the Debian base is built)
@pytest.mark.skipif(not (shutil.which("podman") and shutil.which("mmdebstrap")),
                    reason="needs podman and mmdebstrap (apt install podman mmdebstrap): make image uses them where installed")
def test_podman_builds_on_a_debian_base_and_runs_the_image_on_loopback_only(tmp_path):
    (tmp_path / "Dockerfile").write_text(TINY_DOCKERFILE)
    (tmp_path / "health.py").write_text(TINY_SERVER)
    podman = shutil.which("podman")
    used = build_image(podman, tmp_path / "Dockerfile", tmp_path, "edl-test-tiny:local", "python:3.11.99-slim-bookworm")
    assert used.startswith("localhost/edl-python-base:bookworm")
    with running_image(podman, "edl-test-tiny:local", 8080) as served:
        answer = httpx.get(served.url + "/health")
        assert answer.status_code == 200 and answer.text == "uid=10001"  # the USER step holds at run time
        published = subprocess.run([podman, "ps", "--format", "{{.Names}} {{.Ports}}"], capture_output=True, text=True).stdout
        ours = [line for line in published.splitlines() if f":{served.port}->" in line]
        assert ours and all("127.0.0.1:" in line for line in ours), published
    left = subprocess.run([podman, "ps", "-a", "--format", "{{.Image}}"], capture_output=True, text=True).stdout
    assert "edl-test-tiny" not in left  # the container went with the caller


def _distribution_outside_site_packages(folder: Path, name: str) -> None:
    """A one-module distribution installed as pip --target installs one: its files and its dist-info in ``folder``."""
    (folder / name).mkdir(parents=True)
    (folder / name / "__init__.py").write_text("ANSWER = 42\n")
    info = folder / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "RECORD").write_text(f"{name}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def test_the_clean_environment_links_a_distribution_from_where_it_was_installed(tmp_path, monkeypatch):
    """A package on PYTHONPATH (pip --target, as the GPU check installs what a GPU image lacks) is linked from its own
    folder: the image's command once started without uvicorn because every package was looked for in site-packages."""

    _distribution_outside_site_packages(tmp_path / "target", "edl_demo_dist")
    monkeypatch.syspath_prepend(str(tmp_path / "target"))
    python = clean_environment(["edl-demo-dist==1.0"], tmp_path / "venv")
    done = subprocess.run([str(python), "-E", "-s", "-c", "import edl_demo_dist; print(edl_demo_dist.ANSWER)"], capture_output=True, text=True)
    assert done.stdout.strip() == "42", done.stderr


def test_an_images_packages_are_weighed_with_what_they_need(tmp_path, monkeypatch):
    """packages_weight adds up the files of the pip lines' distributions and of those they require, and nothing else."""
    _distribution_outside_site_packages(tmp_path / "target", "edl_demo_dist")
    monkeypatch.syspath_prepend(str(tmp_path / "target"))
    own = sum(f.stat().st_size for f in (tmp_path / "target").rglob("*") if f.is_file())
    (tmp_path / "Dockerfile").write_text('FROM python:3.11-slim\nRUN pip install edl-demo-dist==1.0\nCMD ["python"]\n')
    assert packages_weight(tmp_path / "Dockerfile", tmp_path) == (own, ["edl-demo-dist"])
    (tmp_path / "Dockerfile").write_text('FROM python:3.11-slim\nRUN pip install fastapi==0.165.0\nCMD ["python"]\n')
    size, names = packages_weight(tmp_path / "Dockerfile", tmp_path)
    assert {"fastapi", "starlette", "pydantic"} <= set(names) and "torch" not in names  # fastapi's requirements, not the kit's
    fastapi_alone = sum(f.locate().stat().st_size for f in metadata.distribution("fastapi").files if f.locate().is_file())
    assert size > fastapi_alone
