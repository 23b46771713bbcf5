"""Notebooks run two at a time by the suite, each in an interpreter of its own whose processes are watched.

Many cells wait (servers starting, Prometheus scraping, Ray, process groups forming) while a second notebook
can use the cores. The notebooks in ``alone`` (their checks compare timings) run first, one at a time, with
nothing beside them; the rest follow, ``jobs`` at a time, each with ``cores // jobs`` threads for torch and its
math libraries: two notebooks with two threads each on two cores spend most of their time waiting on threads the
other one holds (a 2-token forward pass of SmolLM2 measured 3 s that way, 0.44 s with one thread each).
``result(notebook)`` waits for that notebook's run.
"""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Collection

import psutil

from .process_watch import StartedProcesses

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_TIMEOUT_S = 900
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")  # read by torch, numpy and the kernels

# One notebook's run, in a fresh interpreter: the result as one JSON line on stdout.
RUN_ONE = """
import json, sys
from helpers.course.notebooks import execute_notebook
run = execute_notebook(sys.argv[1], sys.argv[2], parameters=json.loads(sys.argv[4]), root=sys.argv[3], html=False)
print(json.dumps({"status": run.status, "seconds": run.seconds, "error": run.error, "figures": run.figures}))
"""


def _kill_tree(pid: int) -> None:
    """Kill a process and every descendant it has now."""
    try:
        root = psutil.Process(pid)
        processes = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


class WatchedNotebookRuns:
    def __init__(self, notebooks: list[Path], out: Path, root: Path, parameters: dict | None = None,
                 alone: Collection[Path] = (), jobs: int = 2, timeout: float = NOTEBOOK_TIMEOUT_S, deadline: float | None = None):
        self.out, self.root, self.parameters, self.timeout = out, root, parameters or {}, timeout
        self.deadline = deadline  # time.monotonic() by which every run is stopped, whenever it started
        first = [nb for nb in notebooks if nb in set(alone)]
        self.shared_threads = max(1, (os.cpu_count() or 1) // jobs)  # for the runs that share the machine
        self._solo = ThreadPoolExecutor(max_workers=1)
        self._pool = ThreadPoolExecutor(max_workers=jobs)
        self._futures = {nb: self._solo.submit(self._run, nb, None) for nb in first}
        self._gate = threading.Event()  # set once the others are queued, after every notebook that runs alone
        threading.Thread(target=self._queue_others, args=(first, [nb for nb in notebooks if nb not in first]), daemon=True).start()

    def _queue_others(self, first: list[Path], others: list[Path]) -> None:
        for notebook in first:
            self._futures[notebook].exception()  # waits for it
        self._futures.update({nb: self._pool.submit(self._run, nb, self.shared_threads) for nb in others})
        self._gate.set()

    def _run(self, notebook: Path, threads: int | None) -> tuple[dict, StartedProcesses]:
        """One notebook in an interpreter of its own; ``threads`` caps torch's and the math libraries' (None: their default)."""
        command = [sys.executable, "-c", RUN_ONE, str(notebook), str(self.out), str(self.root), json.dumps(self.parameters)]
        env = {**os.environ, **({name: str(threads) for name in THREAD_VARIABLES} if threads else {})}
        process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        start, stopped = time.monotonic(), False
        with StartedProcesses(root=process.pid) as started:
            try:
                limit = self.timeout if self.deadline is None else max(1.0, min(self.timeout, self.deadline - time.monotonic()))
                stdout, stderr = process.communicate(timeout=limit)
            except subprocess.TimeoutExpired:
                _kill_tree(process.pid)  # the runner, its kernel and what the kernel started
                stdout, stderr = process.communicate()
                stopped = True
        seconds = time.monotonic() - start
        if stopped:
            return {"status": "timed out", "seconds": seconds, "error": f"stopped after {seconds:.0f} s, its time limit, while still running",
                    "figures": None}, started
        try:
            return json.loads(stdout.strip().splitlines()[-1]), started
        except (IndexError, json.JSONDecodeError):
            return {"status": "crashed", "seconds": seconds, "error": f"the runner exited with code {process.returncode}:\n{stderr[-4000:]}",
                    "figures": None}, started

    def result(self, notebook: Path) -> tuple[dict, StartedProcesses]:
        if notebook not in self._futures:
            self._gate.wait()
        return self._futures[notebook].result()

    def close(self) -> None:
        self._solo.shutdown(cancel_futures=True)
        self._pool.shutdown(cancel_futures=True)


def processes_behaved(started: StartedProcesses) -> None:
    """What every watched notebook keeps to: something ran, nothing listened beyond 127.0.0.1, nothing outlived it."""
    assert started.processes, "the watcher saw no process: not even the notebook's kernel"
    assert not started.beyond_loopback(), f"listening beyond 127.0.0.1: {started.beyond_loopback()}"
    assert not started.left_running(), f"still running after the notebook ended: {started.left_running()}"
    assert not started.folders_left(), f"Ray left its session folders behind: {started.folders_left()}"
