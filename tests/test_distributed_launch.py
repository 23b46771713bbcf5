"""helpers.core.workers: real gloo process groups from a test or a notebook, failures reported by rank, no worker left behind."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import cloudpickle
import nbformat
import psutil
import pytest
import torch
import torch.distributed as dist

from helpers.core.workers import WorkerError, WorkerTimeout, launch
from helpers.course.notebooks import execute_notebook

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# Send this module's worker functions by value, as a notebook's are: workers then skip importing the test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def rank_sum_and_threads(scale: float):
    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "sum": value.item() * scale,
            "threads": torch.get_num_threads(), "backend": dist.get_backend()}


def test_results_come_back_in_rank_order_from_a_real_group():
    results = launch(rank_sum_and_threads, 3, args=(2.0,), echo=False)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(r["world"] == 3 and r["sum"] == 2.0 * (0 + 1 + 2) and r["backend"] == "gloo" for r in results)


def listening_addresses_of_the_group(launcher_pid: int) -> list[str]:
    """The addresses the launching process and every worker listen on (the rendezvous store, gloo's pairs)."""
    launcher = psutil.Process(launcher_pid)
    family = [launcher, *launcher.children(recursive=True)]
    dist.barrier()  # every rank has joined before anyone looks
    return sorted({c.laddr.ip for p in family for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN})


def test_the_group_listens_on_the_loopback_address_only():
    """TCPStore alone would listen on every interface (::): the launcher binds the store's socket to 127.0.0.1."""
    seen = launch(listening_addresses_of_the_group, 2, args=(os.getpid(),), echo=False)
    assert seen[0] and all(addresses == ["127.0.0.1"] for addresses in seen), seen


def test_four_workers_on_two_cores_use_one_thread_each():
    results = launch(rank_sum_and_threads, 4, args=(1.0,), echo=False)
    assert all(r["sum"] == 6 for r in results)
    expected = max(1, len(os.sched_getaffinity(0)) // 4)
    assert {r["threads"] for r in results} == {expected}


def print_and_return():
    print(f"hello from {dist.get_rank()}")
    return dist.get_rank()


def test_worker_output_is_echoed_with_its_rank(capsys):
    assert launch(print_and_return, 2) == [0, 1]
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


def fail_on_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("rank one cannot continue")
    dist.barrier()  # rank 0 would wait here forever: the launcher must not


def test_a_worker_exception_names_its_rank_and_keeps_its_traceback():
    start = time.monotonic()
    with pytest.raises(WorkerError) as caught:
        launch(fail_on_rank_one, 3, timeout=600, echo=False)
    error = caught.value
    assert error.rank == 1 and error.exc_type == "ValueError"
    assert isinstance(error.exception, ValueError) and "rank one cannot continue" in str(error)
    assert "fail_on_rank_one" in error.traceback
    # Waiting for the timeout would take 600 s; stopping at the failure takes seconds, even on a loaded machine.
    assert time.monotonic() - start < 300, "the launcher waited for the timeout instead of stopping at the failure"


def exit_abruptly():
    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def test_a_worker_that_dies_without_a_traceback_is_reported():
    with pytest.raises(WorkerError, match="exited with code 3") as caught:
        launch(exit_abruptly, 2, timeout=60, echo=False)
    assert caught.value.rank == 0


def raise_before_a_peer_dies():
    if dist.get_rank() == 0:
        time.sleep(0.5)
        os._exit(3)
    raise RuntimeError("Connection reset by peer")  # what a collective raises once a peer has gone


def test_a_silent_death_is_reported_ahead_of_the_errors_it_causes_in_its_peers():
    """Under load the peers' errors can reach the parent before the death does: the death is still what is reported."""
    with pytest.raises(WorkerError, match="exited with code 3") as caught:
        launch(raise_before_a_peer_dies, 2, timeout=60, echo=False)
    assert caught.value.rank == 0
    assert any("rank 1 raised RuntimeError" in note for note in caught.value.__notes__)


def hang_on_rank_zero():
    if dist.get_rank() == 0:
        time.sleep(600)
    dist.barrier()


def test_a_hung_run_times_out():
    start = time.monotonic()
    with pytest.raises(WorkerTimeout) as caught:
        launch(hang_on_rank_zero, 2, timeout=3, echo=False)
    assert 0 in caught.value.unfinished
    assert time.monotonic() - start < 300, "the 3 s timeout was not enforced: the hung worker sleeps 600 s"


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="world_size"):
        launch(print_and_return, 0)
    with pytest.raises(TypeError, match="function"):
        launch("not a function", 2)
    lock = __import__("threading").Lock()
    with pytest.raises(TypeError, match="could not send"):
        launch(print_and_return, 2, args=(lock,))


def test_a_function_defined_in_a_notebook_runs_on_the_workers(tmp_path):
    """The case spawn cannot handle: a function whose module is the notebook's __main__, run by papermill."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell("import torch\nimport torch.distributed as dist\nfrom helpers.core.workers import launch\nSCALE = 3"),
        nbformat.v4.new_code_cell(textwrap.dedent("""\
            def scaled(x):
                return x * SCALE

            class Box:
                def __init__(self, value):
                    self.value = value

            def work(box):
                t = torch.tensor([float(dist.get_rank() + box.value)])
                dist.all_reduce(t)
                print("done", dist.get_rank())
                return scaled(t.item())

            results = launch(work, 4, args=(Box(1),))
            assert results == [3 * (0 + 1 + 2 + 3 + 4)] * 4, results
        """)),
    ]
    path = tmp_path / "notebook_launch.ipynb"
    nbformat.write(nb, path)
    run = execute_notebook(path, tmp_path / "out", html=False)
    assert run.status == "ok", run.error
    executed = nbformat.read(run.output, as_version=4)
    text = "".join(o.get("text", "") for o in executed.cells[1].outputs)
    assert "[rank 3] done 3" in text


# ---------------------------------------------------------------- no worker outlives a run

SCRIPT = """
import os, signal, sys, time
import torch.distributed as dist
from helpers.core.workers import launch

def record_and_hang(pid_dir):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stubborn worker: only SIGKILL stops it
    open(os.path.join(pid_dir, str(os.getpid())), "w").close()
    time.sleep(600)

if __name__ == "__main__":
    launch(record_and_hang, 3, args=(sys.argv[1],), timeout=300)
"""


def record_pid(pid_dir: str, mode: str):
    Path(pid_dir, str(os.getpid())).touch()
    dist.barrier()
    if mode == "raise" and dist.get_rank() == 2:
        raise RuntimeError("planned failure")
    if mode == "hang":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)
    dist.barrier()


def wait_for_pids(pid_dir: Path, count: int, timeout: float = 30) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [int(p.name) for p in pid_dir.iterdir()]
        if len(pids) == count:
            return [psutil.Process(pid) for pid in pids]
        time.sleep(0.05)
    raise AssertionError(f"only {len(list(pid_dir.iterdir()))} of {count} workers started")


def survivors(processes: list[psutil.Process], within: float = 10) -> list[psutil.Process]:
    """The processes still running (zombies count as gone) after waiting up to ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def descendants_besides_helpers() -> list[psutil.Process]:
    """This process's descendants, minus multiprocessing's forkserver and resource tracker (they live with us)."""
    helpers = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if not any(h in " ".join(child.cmdline()) for h in helpers) and child.status() != psutil.STATUS_ZOMBIE:
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.parametrize("mode", ["raise", "hang"])
def test_no_worker_outlives_a_failing_run(mode, tmp_path):
    with pytest.raises(WorkerError if mode == "raise" else WorkerTimeout):
        launch(record_pid, 3, args=(str(tmp_path), mode), timeout=4 if mode == "hang" else 60, echo=False)
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 3
    running = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not running, f"workers still running right after launch() returned: {running}"
    assert not descendants_besides_helpers()


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["interrupted", "killed"])
def test_no_worker_outlives_its_parent(how, tmp_path):
    """Ctrl-C (KeyboardInterrupt) stops the workers; a parent killed outright leaves none behind either."""
    script = tmp_path / "parent.py"
    script.write_text(SCRIPT)
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    # SIGINT back to its default in the child: a suite started in the background (`make test &`) passes SIGINT on
    # ignored, and a Python started that way never raises KeyboardInterrupt, whatever the code under test does.
    parent = subprocess.Popen([sys.executable, str(script), str(pid_dir)], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        workers = wait_for_pids(pid_dir, 3)
        family = psutil.Process(parent.pid).children(recursive=True)
        parent.send_signal(how)
        _, stderr = parent.communicate(timeout=30)
        if how == signal.SIGINT:
            assert "KeyboardInterrupt" in stderr
        assert not survivors(workers), f"workers outlived their parent: {[p.pid for p in workers]}"
        assert not survivors(family), "the forkserver or resource tracker outlived the parent"
    finally:
        if parent.poll() is None:
            parent.kill()
