"""`make lab`: JupyterLab starts on the kit with the widgets extension and the kit's kernel."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest

from helpers.course.lab import lab_command, lab_environment

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started the way `make lab` starts it; yields request(path, method="GET", body=None) -> JSON."""
    port, token = free_port(), "kit-test-token"
    command = lab_command(["--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"])
    env = {**lab_environment(), "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("lab-runtime"))}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)

    def request(path: str, method: str = "GET", body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
        with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers, method=method), timeout=10) as response:
            text = response.read()
            return json.loads(text) if text else None

    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                request("/api/status")
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail("JupyterLab did not start within 90 s")
                time.sleep(0.5)
        yield request
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


def _notebook_with_outputs() -> dict:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1", execution_count=3,
                                                                   outputs=[nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=3)])])
    return json.loads(nbformat.writes(nb))


def test_saving_a_lecture_stores_it_without_outputs_and_other_notebooks_as_they_are(lab):
    lecture, other = "lectures/_save_hook_check.ipynb", "build/_save_hook_check.ipynb"
    (ROOT / "build").mkdir(exist_ok=True)
    try:
        for path in (lecture, other):
            lab(f"/api/contents/{path}", "PUT", {"type": "notebook", "format": "json", "content": _notebook_with_outputs()})
        saved = nbformat.read(ROOT / lecture, as_version=4).cells[0]
        assert saved.outputs == [] and saved.execution_count is None, "outputs of a lecture reached the file in git"
        assert nbformat.read(ROOT / other, as_version=4).cells[0].outputs, "a notebook outside lectures/ lost its outputs"
    finally:
        for path in (lecture, other):
            (ROOT / path).unlink(missing_ok=True)


def test_the_lecture_server_has_no_nbgrader_menu_or_formgrader(lab):
    extensions = {extension["name"]: extension for extension in lab("/lab/api/extensions")}
    assert not extensions.get("@jupyter/nbgrader", {}).get("enabled", False), "the lab serves nbgrader's menu"
    listing = subprocess.run([str(Path(sys.executable).parent / "jupyter"), "labextension", "list"], env=lab_environment(),
                             capture_output=True, text=True, timeout=120)
    nbgrader = [line for line in (listing.stdout + listing.stderr).splitlines() if "@jupyter/nbgrader v" in line]
    assert nbgrader and "disabled" in nbgrader[0], "JupyterLab's own listing must show nbgrader's extension disabled"
    with pytest.raises(urllib.error.HTTPError) as missing:
        lab("/formgrader/api/assignments")
    assert missing.value.code == 404
