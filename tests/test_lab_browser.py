"""`make lab` in a real browser: headless Chromium driven by Playwright against JupyterLab started as make starts it.

Runs when Chromium (Debian's /usr/bin/chromium, or $EDL_CHROMIUM) and the playwright package are installed;
otherwise each test is skipped and says what to install.
"""
from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import nbformat
import pytest

from helpers.core.procs import free_port, stop_tree
from helpers.course.notebooks import clean, strip_outputs

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("EDL_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (Debian/Ubuntu: apt install chromium, or make browser-tool)")]

# The flags a headless Chromium needs on a machine with no display and no outside network.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
LECTURE = "lectures/01-gpu-architecture/01-gpu-architecture-and-benchmarking.ipynb"


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory):
    """JupyterLab started with `python -m helpers.course.lab` (what `make lab` runs) on a copy of one lecture."""
    root = tmp_path_factory.mktemp("lab-root")
    (root / Path(LECTURE).parent).mkdir(parents=True)
    shutil.copy(ROOT / LECTURE, root / LECTURE)
    strip_outputs(root / LECTURE)  # as `make strip` stores it (test_repository checks every stored notebook is so)
    explorer = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("from helpers import alexnet_explorer\n\nalexnet_explorer(batch_size=128)")])
    clean(explorer)  # the kit's kernel metadata, so JupyterLab starts the kernel without asking
    nbformat.write(explorer, root / "explorer.ipynb")
    port, token = free_port(), "kit-browser-test"
    command = [sys.executable, "-m", "helpers.course.lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               f"--LabApp.workspaces_dir={tmp_path_factory.mktemp('workspaces')}"]
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path_factory.mktemp("runtime"))}
    log = open(root.parent / "lab.log", "w")
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    pytest.fail(f"JupyterLab did not start within 120 s; its log: {Path(log.name).read_text()[-2000:]}")
                time.sleep(0.5)
        # Each page gets a workspace of its own, reset, so no tab another test opened is restored beside it.
        yield root, lambda path: f"{base}/lab/workspaces/{uuid.uuid4().hex}/tree/{path}?reset&token={token}"
    finally:
        stop_tree(process.pid)
        process.wait(timeout=30)
        log.close()


@pytest.fixture()
def page():
    """A fresh headless Chromium page; the browser console's errors are collected in ``page.errors``."""
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1500, "height": 1000})
            tab.errors = []
            tab.on("console", lambda message: tab.errors.append(message.text) if message.type == "error" else None)
            tab.on("pageerror", lambda error: tab.errors.append(str(error)))
            yield tab
        finally:
            browser.close()


def open_notebook(page, url: str) -> None:
    """Open a notebook and wait until its kernel has started and reports idle."""
    page.goto(url)
    page.wait_for_selector(".jp-NotebookPanel .jp-Notebook", timeout=120_000)
    page.wait_for_function("() => document.querySelector('#jp-main-statusbar')?.innerText.includes('Idle')", timeout=120_000)
    time.sleep(2)  # the kernel's info reply is applied to the notebook's metadata just after idle


def notebook_tab_is_dirty(page) -> bool:
    return page.evaluate("() => !!document.querySelector('.lm-DockPanel-tabBar .lm-TabBar-tab.jp-mod-current.jp-mod-dirty')")


def test_a_lecture_as_stored_opens_unmodified_and_saves_back_byte_identical(lab_url, page):
    root, url = lab_url
    stored = (root / LECTURE).read_bytes()
    open_notebook(page, url(LECTURE))
    assert not notebook_tab_is_dirty(page), "JupyterLab marks the lecture modified as soon as its kernel starts"
    before = (root / LECTURE).stat().st_mtime_ns
    page.click(".jp-NotebookPanel .jp-Notebook")
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 30
    while (root / LECTURE).stat().st_mtime_ns == before:
        assert time.monotonic() < deadline, "Ctrl+S did not save the lecture within 30 s"
        time.sleep(0.2)
    assert (root / LECTURE).read_bytes() == stored, "opening and saving a lecture changed its file"
    assert not page.errors, f"browser console errors: {page.errors}"


def shown_chart(page) -> str:
    return page.evaluate("() => document.querySelector('.widget-output img')?.getAttribute('src') || ''")


@pytest.mark.parametrize("attempt", range(3))
def test_typing_256_as_the_first_change_draws_the_same_chart_as_opening_at_256(lab_url, page, attempt):
    from helpers.hardware import profile_layer_alexnet
    from helpers.hardware.widgets import render_png

    root, url = lab_url
    open_notebook(page, url("explorer.ipynb"))
    page.click(".jp-Notebook .jp-Cell .cm-content")
    page.keyboard.press("Shift+Enter")
    page.wait_for_selector(".widget-slider .widget-readout", timeout=120_000)
    page.wait_for_function("() => document.querySelector('.widget-output img')", timeout=120_000)
    first = shown_chart(page)
    readout = page.locator(".widget-slider .widget-readout")
    readout.click()
    page.keyboard.press("Control+a")
    page.keyboard.type("256")
    page.keyboard.press("Enter")
    page.wait_for_function("(first) => { const img = document.querySelector('.widget-output img');"
                           " return img && img.getAttribute('src') !== first; }", arg=first, timeout=120_000)
    time.sleep(1)  # a second, stale redraw would land here
    assert readout.inner_text().strip() == "256"
    prefix, _, data = shown_chart(page).partition(",")
    assert prefix == "data:image/png;base64"
    expected = render_png(profile_layer_alexnet(None, 256, "fp32"))
    assert base64.b64decode(data) == expected, "the chart drawn after typing 256 differs from the chart of an explorer opened at 256"
    assert page.locator(".widget-output img").count() == 1, "more than one chart in the explorer's output"
    assert not page.errors, f"browser console errors: {page.errors}"


def test_an_exported_lecture_shows_every_output_with_no_network(tmp_path, page):
    """The HTML copy `make lectures` writes, opened in Chromium with every network request refused."""
    from helpers.course.notebooks import execute_notebook

    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("from helpers import alexnet_explorer\n\nalexnet_explorer(batch_size=64)"),
        nbformat.v4.new_code_cell("from tqdm.auto import tqdm\n\nfor _ in tqdm(range(10), desc='steps'):\n    pass"),
        nbformat.v4.new_code_cell("print('plain text output')")])
    clean(notebook)
    nbformat.write(notebook, tmp_path / "exported.ipynb")
    run = execute_notebook(tmp_path / "exported.ipynb", tmp_path / "out")
    assert run.status == "ok", run.error
    refused = []
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:") else (refused.append(route.request.url), route.abort()))
    page.goto(run.html.resolve().as_uri())
    page.wait_for_load_state("load")
    outputs = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output')].map(o => ({
        height: o.getBoundingClientRect().height, text: o.innerText.slice(0, 60),
        images: [...o.querySelectorAll('img')].map(i => i.complete && i.naturalWidth > 0)}))""")
    assert len(outputs) >= 3, f"expected the explorer, the progress bar and the print; found {outputs}"
    assert all(o["height"] > 0 for o in outputs), f"outputs drawn at height 0 offline: {[o for o in outputs if o['height'] <= 0]}"
    assert any(o["images"] and all(o["images"]) for o in outputs), "the explorer's chart did not load offline"
    shown = " ".join(o["text"] for o in outputs)
    assert "batch size" in shown and "steps" in shown and "plain text output" in shown, shown
    assert not refused, f"the exported page asked the network for {refused}"


def test_choosing_fp16_redraws_both_charts_in_half_precision(lab_url, page):
    """The explorer's left chart (working set per layer) changes with the precision, as its table does."""
    from PIL import Image

    from helpers.hardware import profile_layer_alexnet
    from helpers.hardware.widgets import render_png

    root, url = lab_url
    open_notebook(page, url("explorer.ipynb"))
    page.click(".jp-Notebook .jp-Cell .cm-content")
    page.keyboard.press("Shift+Enter")
    page.wait_for_function("() => document.querySelector('.widget-output img')", timeout=120_000)
    first = shown_chart(page)
    page.get_by_role("button", name="fp16").click()
    page.wait_for_function("(first) => { const img = document.querySelector('.widget-output img');"
                           " return img && img.getAttribute('src') !== first; }", arg=first, timeout=120_000)
    time.sleep(1)
    shown = base64.b64decode(shown_chart(page).partition(",")[2])
    assert shown == render_png(profile_layer_alexnet(None, 128, "fp16"))
    before, after = (Image.open(io.BytesIO(png)).convert("L") for png in (base64.b64decode(first.partition(",")[2]), shown))
    half = (0, 0, before.width * 3 // 5, before.height)  # the left chart: three fifths of the figure's width
    assert before.size == after.size and before.crop(half).tobytes() != after.crop(half).tobytes(), "the layer chart did not change"
    assert not page.errors, f"browser console errors: {page.errors}"
