"""`make lab`: JupyterLab starts on the kit with the widgets extension and the kit's kernel."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JUPYTER = Path(sys.executable).parent / "jupyter"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    port, token = free_port(), "kit-test-token"
    process = subprocess.Popen(
        [str(JUPYTER), "lab", f"--notebook-dir={ROOT}", "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"]
        + (["--allow-root"] if os.geteuid() == 0 else []),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("lab-runtime"))},
    )

    def get(path: str):
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("JupyterLab did not start within 90 s")
                time.sleep(0.5)
        yield get
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_lab_serves_the_widgets_extension(lab):
    extensions = {extension["name"]: extension for extension in lab("/lab/api/extensions")}
    widgets = extensions.get("jupyter-widgets-jupyterlab-manager")
    assert widgets is not None, f"widgets extension missing; lab has {sorted(extensions)}"
    assert widgets.get("enabled", True) and widgets.get("installed", True)


def test_lab_offers_the_kits_python_kernel(lab):
    specs = lab("/api/kernelspecs")
    assert specs["default"] == "python3"
    assert "python3" in specs["kernelspecs"]


def test_lab_sees_the_lecture_notebooks(lab):
    listing = lab("/api/contents/lectures")
    assert any(item["type"] == "directory" and item["name"].startswith("01-") for item in listing["content"])
