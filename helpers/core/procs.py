"""Child processes that never outlive their parent: free loopback ports, process-tree stopping, served processes.

Every server or worker the kit starts (a model service, an MLflow UI, a grading
sandbox) goes through here: it listens on 127.0.0.1 on a free port, runs in its
own session so that its whole tree can be stopped, gets SIGTERM from the kernel
if its parent dies (Linux), and is stopped when its owner ends.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Mapping, Sequence

import psutil

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def die_with_parent() -> None:
    """In a child (preexec_fn): ask Linux to send SIGTERM when the parent dies. A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def redirect_output(log_path: str | Path, append: bool = True) -> None:
    """Send this process's stdout and stderr, Python's and C's, to ``log_path`` (line-buffered; ``append=False`` truncates).

    For a child process whose output belongs in a log: the descriptors 1 and 2 are re-pointed, and
    sys.stdout/sys.stderr rebound to them (the parent's may have been something else: a notebook, pytest).
    """
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(log_path, flags, 0o644)
    for stream, target in ((sys.stdout, 1), (sys.stderr, 2)):
        with contextlib.suppress(Exception):
            stream.flush()
        os.dup2(fd, target)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)


def stop_tree(pid: int, grace: float = 3.0) -> None:
    """Stop ``pid`` and every descendant: SIGTERM, then SIGKILL after ``grace`` seconds; reap what we can."""
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in family:
        try:
            proc.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(family, timeout=grace)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace)


def start_process(
    command: Sequence[str],
    *,
    log_path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
) -> subprocess.Popen:
    """Start ``command`` in its own session, its output to ``log_path`` (or discarded); it dies with us."""
    log = open(log_path, "ab") if log_path is not None else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            list(command), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env}, cwd=cwd,
            start_new_session=True, preexec_fn=die_with_parent,
        )
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def _stop_quietly(pid: int, owned_folders: tuple[Path, ...] = ()) -> None:
    stop_tree(pid, grace=2.0)
    for folder in owned_folders:  # only now: a process of the tree may write into them until it is gone
        shutil.rmtree(folder, ignore_errors=True)


class ServedProcess:
    """A server process on 127.0.0.1:``port``; ``with`` stops it, and so does its owner's exit or garbage collection.

    ``health_path`` is polled over HTTP until it answers 200 (or ``startup_timeout``
    passes, which raises with the end of the server's log). ``owned_folders`` (scratch space the server
    writes) are removed once its whole process tree has stopped.
    """

    def __init__(self, command: Sequence[str], port: int, *, health_path: str = "/health",
                 log_path: str | Path, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 startup_timeout: float = 60.0, owned_folders: Sequence[str | Path] = ()):
        self.port = port
        self.url = f"http://{LOOPBACK}:{port}"
        self.log_path = Path(log_path)
        self.process = start_process(command, log_path=self.log_path, env=env, cwd=cwd)
        self.pid = self.process.pid
        self._finalizer = weakref.finalize(self, _stop_quietly, self.pid, tuple(map(Path, owned_folders)))
        self._wait_healthy(health_path, startup_timeout)

    def _wait_healthy(self, health_path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.process.returncode} before it was healthy; "
                                   f"its log ({self.log_path}) ends with:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + health_path, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the server on port {self.port} was not healthy within {timeout:.0f} s; "
                           f"its log ends with:\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        """Stop the server and everything it started; safe to call twice."""
        self._finalizer()
        self.process.poll()

    def __enter__(self) -> "ServedProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<ServedProcess pid={self.pid} {self.url} {state}>"
