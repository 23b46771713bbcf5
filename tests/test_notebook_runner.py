"""helpers.course.notebooks: the runner behind `make lectures` reports failures usefully and keeps notebooks clean."""
from __future__ import annotations

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from helpers.course.notebooks import execute_notebook, has_outputs, main, parse_parameters, strip_outputs

pytestmark = pytest.mark.notebooks


def write_notebook(path, *sources, parameters=None):
    cells = []
    if parameters is not None:
        cells.append(new_code_cell(parameters, metadata={"tags": ["parameters"]}))
    cells += [new_code_cell(s) for s in sources]
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, path)
    return path


def test_a_failing_cell_is_reported_with_its_source_and_error(tmp_path):
    notebook = write_notebook(tmp_path / "broken.ipynb", "x = 1", "y = x / 0  # the bad cell")
    run = execute_notebook(notebook, tmp_path / "out", html=False)
    assert run.status == "failed"
    assert "ZeroDivisionError" in run.error and "the bad cell" in run.error and "cell 1" in run.error
    assert run.output.exists()  # the partly executed notebook is kept for inspection


def test_parameters_are_injected_and_html_exported(tmp_path):
    notebook = write_notebook(tmp_path / "p.ipynb", "assert quick is True and size == 3", parameters="quick = False\nsize = 1")
    run = execute_notebook(notebook, tmp_path / "out", parameters={"quick": True, "size": 3})
    assert run.status == "ok", run.error
    assert run.html is not None and "<html" in run.html.read_text()[:500].lower()


def test_strip_removes_outputs_and_counts(tmp_path):
    notebook = write_notebook(tmp_path / "s.ipynb", "print('hello')")
    run = execute_notebook(notebook, tmp_path / "out", html=False)
    assert has_outputs(run.output)
    assert strip_outputs(run.output) is True
    assert not has_outputs(run.output)
    assert strip_outputs(run.output) is False  # already clean


def test_cli_exits_non_zero_when_a_notebook_fails(tmp_path, capsys):
    (tmp_path / "nbs").mkdir()
    write_notebook(tmp_path / "nbs" / "ok.ipynb", "1 + 1")
    write_notebook(tmp_path / "nbs" / "bad.ipynb", "raise RuntimeError('planted')")
    assert main(["run", str(tmp_path / "nbs"), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "planted" in captured.err
    table = captured.out
    assert "bad.ipynb" in table and "failed" in table and "ok.ipynb" in table


def test_parameters_parse_as_python_literals():
    assert parse_parameters(["quick=True", "n=3", "device=cpu"]) == {"quick": True, "n": 3, "device": "cpu"}


def test_a_mistyped_device_is_refused_up_front_and_the_last_good_build_stays(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("EDL_DEVICE", raising=False)
    (tmp_path / "nbs").mkdir()
    write_notebook(tmp_path / "nbs" / "ok.ipynb", "print(device)", parameters="device = None")
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "nbs"), "--out", str(out), "-p", "device=CPU"]) == 0  # CPU is read as cpu
    good = sorted(p.name for p in out.iterdir())
    assert main(["run", str(tmp_path / "nbs"), "--out", str(out), "-p", "device=gpu"]) == 2
    err = capsys.readouterr().err
    assert "nothing was run" in err and "DEVICE=" in err and err.count("'gpu'") == 1
    monkeypatch.setenv("EDL_DEVICE", "tpu")
    assert main(["run", str(tmp_path / "nbs"), "--out", str(out)]) == 2
    assert "EDL_DEVICE" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == good


def test_a_failing_run_keeps_the_last_good_build_and_says_where_the_new_one_is(tmp_path, capsys):
    (tmp_path / "nbs").mkdir()
    notebook = write_notebook(tmp_path / "nbs" / "flip.ipynb", "1 + 1")
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "nbs"), "--out", str(out)]) == 0
    before = (out / "flip.ipynb").read_text()
    write_notebook(notebook, "raise RuntimeError('planted')")
    assert main(["run", str(tmp_path / "nbs"), "--out", str(out)]) == 1
    assert (out / "flip.ipynb").read_text() == before
    assert "untouched" in capsys.readouterr().err and (tmp_path / "out.failed" / "flip.ipynb").exists()


def test_html_copies_show_widgets_and_progress_with_no_network(tmp_path):
    """The AlexNet explorer and a tqdm bar, exported: frozen to what they showed, no widget renderer, nothing from the network."""
    import re

    notebook = write_notebook(tmp_path / "w.ipynb", "from helpers import alexnet_explorer\nalexnet_explorer(batch_size=64)",
                              "from tqdm.auto import tqdm\nfor _ in tqdm(range(10), desc='steps'):\n    pass")
    run = execute_notebook(notebook, tmp_path / "out")
    assert run.status == "ok", run.error
    page = run.html.read_text()
    assert "application/vnd.jupyter.widget" not in page and "@*" not in page, "the page still needs the widget renderer"
    assert "<b>batch size</b>: 64" in page, "the explorer's controls are shown as their setting"
    assert page.count("data:image/png;base64") >= 1, "the explorer's chart is embedded as an image"
    assert re.search(r"steps:\s*100%.*10/10", page, re.S), "the progress bar is shown as text"
    fetched = re.findall(r'<(?:script|link|img)[^>]+(?:src|href)="((?:https?:)?//[^"]+)"', page) + re.findall(r'import\(\s*["\'](https?://[^"\']+)', page)
    assert not fetched, f"the page fetches {fetched} from the network: an exported lecture must read offline"


def test_lesson_figures_come_back_and_the_runners_cell_leaves_no_trace(tmp_path):
    notebook = write_notebook(tmp_path / "f.ipynb", "import numpy as np\nspeedup = np.float64(2.5)",
                              "lesson_figures = {'speedup': speedup, 'rows': [1, 2], 'device': 'cpu'}")
    run = execute_notebook(notebook, tmp_path / "out")
    assert run.status == "ok" and run.figures == {"speedup": 2.5, "rows": [1, 2], "device": "cpu"}
    executed = nbformat.read(run.output, as_version=4)
    assert len(executed.cells) == 2
    assert "edl-lesson-figures" not in nbformat.writes(executed) and "edl-lesson-figures" not in run.html.read_text()
    plain = execute_notebook(write_notebook(tmp_path / "g.ipynb", "x = 1"), tmp_path / "out", html=False)
    assert plain.figures is None


def test_a_kernel_is_shut_down_without_the_interrupt_jupyter_client_sends_first():
    """jupyter_client sends SIGINT before a shutdown request; a kernel still finishing its last message then logs
    "KeyboardInterrupt caught in kernel." into `make lectures`' table. The runner's kernels get the request alone."""
    import signal

    from helpers.course.notebooks import LocalKernelManager

    class Recording(LocalKernelManager):
        sent: list = []

        async def _async_signal_kernel(self, signum):
            self.sent.append(signum)
            await super()._async_signal_kernel(signum)

    manager = Recording(kernel_name="python3")
    manager.start_kernel()
    try:
        manager.interrupt_kernel()  # an interrupt asked for while it runs still goes through
    finally:
        manager.shutdown_kernel()
    assert manager.sent.count(signal.SIGINT) == 1 and not manager.has_kernel



def test_the_kernels_sockets_stay_out_of_the_notebooks_folder(tmp_path):
    """The kernel's Unix sockets live in a private folder under /tmp: a kernel that dies cannot litter (and break copies of) the course."""
    notebook = write_notebook(tmp_path / "look.ipynb", "import os\nhere = sorted(os.listdir('.'))\nassert here == ['look.ipynb', 'out'], here")
    run = execute_notebook(notebook, tmp_path / "out", html=False)
    assert run.status == "ok", run.error
    assert sorted(p.name for p in tmp_path.iterdir()) == ["look.ipynb", "out"]


WATCHED_CHILD = """
import socket, sys, time
from pathlib import Path
sockets = Path(sys.argv[1]) / "session_1" / "sockets"
sockets.mkdir(parents=True)
unix = socket.socket(socket.AF_UNIX)
unix.bind(str(sockets / "raylet"))
kept = [socket.create_server(("0.0.0.0", 0)), socket.create_server(("127.0.0.1", 0)), unix]
print(kept[0].getsockname()[1], flush=True)
time.sleep(3)
"""


def test_the_process_watcher_sees_where_children_listen_and_the_session_folders_they_use(tmp_path):
    """What the lecture runs are checked with: a listener beyond 127.0.0.1 is named, loopback is not, Ray-like session
    folders are found from the unix sockets, and a child that ended does not count as left running."""
    import subprocess
    import sys

    from tests.process_watch import StartedProcesses

    with StartedProcesses(grace=5) as started:
        child = subprocess.run([sys.executable, "-c", WATCHED_CHILD, str(tmp_path)], capture_output=True, text=True, timeout=60)
    open_port = int(child.stdout.split()[0])
    assert [(ip, port) for ip, port, _ in started.beyond_loopback()] == [("0.0.0.0", open_port)]
    assert len(started.listening) == 2 and started.session_folders == {tmp_path / "session_1"}
    assert started.left_running() == []
