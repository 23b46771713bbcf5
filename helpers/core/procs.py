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
import random
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
from typing import Callable, Mapping, Sequence

import psutil

LOOPBACK = "127.0.0.1"


def available_cores() -> int:
    """CPU cores this process may run on (the affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


SERVER_PORTS_FROM = 20000  # above Ray's worker ports (10002-19999) and the registered services most machines run


def outgoing_ports() -> range:
    """The ports Linux gives outgoing connections (its ephemeral range; the usual 32768-60999 elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now, chosen below the range outgoing connections are given.

    The server that will listen on it starts seconds later (a child process on a busy machine: Ray's agents, 20 s
    and more). A port from the ephemeral range can be taken meanwhile by any outgoing connection of any process,
    and stays taken while that connection waits out TIME_WAIT (a minute): a load test makes thousands, and the
    server then fails with "address already in use". The kernel gives no connection a port below its range. The
    choice is random from the OS's entropy (a notebook's ``random.seed`` must not make two runs choose alike)."""
    candidates, entropy = range(SERVER_PORTS_FROM, outgoing_ports().start), random.SystemRandom()
    for _ in range(64 if len(candidates) >= 1000 else 0):  # too narrow a range: the OS picks, as it always did
        port = entropy.choice(candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((LOOPBACK, port))  # no SO_REUSEADDR: fails while any socket, TIME_WAIT too, holds it
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def listening_tcp() -> dict[int, tuple[str, int]]:
    """Socket inode -> (address, port) of every TCP socket listening in this network namespace, from one read of
    /proc/net/tcp and tcp6 (Linux; empty elsewhere). An address reads as inet_ntop writes it: 127.0.0.1, ::1,
    ::ffff:127.0.0.1 for a dual-stack socket's IPv4 one."""
    found = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A":  # TCP_LISTEN
                address, port = fields[1].split(":")
                raw = bytes.fromhex(address)  # 32-bit words in the host's (little-endian) order
                packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found[int(fields[9])] = (socket.inet_ntop(family, packed), int(port, 16))
    return found


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


def session_members(leader: int) -> list[psutil.Process]:
    """The processes still in the session ``leader`` started (``start_process`` starts each child in its own), also
    those its exit left behind, which no longer descend from it."""
    members = []
    if leader == os.getsid(0):  # our own session: its other members are not ours to stop
        return members
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == leader and proc.pid != os.getpid():
                members.append(proc)
        except (OSError, psutil.Error):
            pass
    return members


def stop_tree(pid: int, grace: float = 3.0) -> None:
    """Stop ``pid``, every descendant and what is left of its session: SIGTERM, then SIGKILL after ``grace`` seconds;
    reap what we can."""
    family = session_members(pid)
    try:
        root = psutil.Process(pid)
        family = list({proc.pid: proc for proc in [root, *root.children(recursive=True), *family]}.values())
    except psutil.NoSuchProcess:
        pass
    if not family:
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

    ``health_path`` is polled over HTTP until it answers 200; a server that exits first raises RuntimeError, one not
    healthy within ``startup_timeout`` TimeoutError, both with the end of its log and what ``diagnose`` (called
    before anything is removed) says, and both after stopping its whole tree. ``owned_folders`` (scratch space the
    server writes) are removed once its whole process tree has stopped.
    """

    def __init__(self, command: Sequence[str], port: int, *, health_path: str = "/health",
                 log_path: str | Path, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 startup_timeout: float = 60.0, owned_folders: Sequence[str | Path] = (),
                 diagnose: Callable[[], str] | None = None):
        self.port = port
        self.url = f"http://{LOOPBACK}:{port}"
        self.log_path = Path(log_path)
        self.process = start_process(command, log_path=self.log_path, env=env, cwd=cwd)
        self.pid = self.process.pid
        self._finalizer = weakref.finalize(self, _stop_quietly, self.pid, tuple(map(Path, owned_folders)))
        self._diagnose = diagnose
        self._wait_healthy(health_path, startup_timeout)

    def _wait_healthy(self, health_path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                report = self._stop_and_report()
                raise RuntimeError(f"the server exited with code {self.process.returncode} before it was healthy; "
                                   f"its log ({self.log_path}) ends with:\n{report}")
            try:
                with urllib.request.urlopen(self.url + health_path, timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        report = self._stop_and_report()
        raise TimeoutError(f"the server on port {self.port} was not healthy within {timeout:.0f} s; "
                           f"its log ends with:\n{report}")

    def _stop_and_report(self) -> str:
        """Stop a server that did not start; the end of its log and its diagnosis, taken before its folders go."""
        report = self.log_tail()
        if self._diagnose is not None:
            report += "\n" + self._diagnose()
        self.stop()
        return report

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
