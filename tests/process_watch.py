"""What the processes started during a block of a test do: where they listen, and whether any outlives the block.

    with StartedProcesses() as started:
        run_the_notebook()
    assert started.beyond_loopback() == [] and started.left_running() == []

A thread samples the descendants of ``root`` (a process id; this process when None) every ``interval`` seconds
while the block runs: each one's listening TCP sockets, and the session folders of the unix sockets it has open
(Ray keeps them under ``…/session_*/sockets/``). Processes that were already running when the block began are not
counted; those recorded stay tracked by pid and start time after ``root`` has ended.
"""
from __future__ import annotations

import ipaddress
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from helpers.core.procs import listening_tcp


def is_loopback(ip: str) -> bool:
    """127.0.0.1, also as a dual-stack socket writes it (::ffff:127.0.0.1); not 0.0.0.0, :: or a real address."""
    address = ipaddress.ip_address(ip)
    return (getattr(address, "ipv4_mapped", None) or address) == ipaddress.ip_address("127.0.0.1")


@dataclass
class StartedProcesses:
    root: int | None = None
    interval: float = 0.3
    grace: float = 15.0  # how long a process may take to end after the block before it counts as left running
    processes: dict[tuple[int, float], str] = field(default_factory=dict)  # (pid, start time) -> name, every descendant seen
    listening: set[tuple[str, int, str]] = field(default_factory=set)  # (ip, port, process name)
    session_folders: set[Path] = field(default_factory=set)

    def __enter__(self) -> StartedProcesses:
        self._before = set() if self.root is not None else {p.pid for p in self._descendants()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def _descendants(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.root)
            return [root, *root.children(recursive=True)] if self.root is not None else root.children(recursive=True)
        except psutil.Error:
            return []

    def _sample(self) -> None:
        """One look: each new process's name, then the sockets of all of them from one read of the kernel's tables
        (asking psutil per process re-reads every table for each one: a third of a core for Ray's dozen)."""
        watched = {}
        for process in self._descendants():
            if process.pid in self._before:
                continue
            try:
                key = (process.pid, process.create_time())
                if key not in self.processes:
                    self.processes[key] = " ".join(process.cmdline()[:3])[:120] or process.name()
            except psutil.Error:
                continue
            watched[process.pid] = self.processes[key]
        if not watched:
            return
        listening, unix = listening_tcp(), _unix_socket_paths()
        for pid, name in watched.items():
            for inode in _socket_inodes(pid):
                if inode in listening:
                    self.listening.add((*listening[inode], name))
                elif "/sockets/" in unix.get(inode, ""):
                    self.session_folders.add(Path(unix[inode]).parent.parent)

    def beyond_loopback(self) -> list[tuple[str, int, str]]:
        return sorted(entry for entry in self.listening if not is_loopback(entry[0]))

    def left_running(self) -> list[str]:
        """Processes started in the block still running ``grace`` seconds after it (zombies count as ended)."""
        deadline = time.monotonic() + self.grace
        while True:
            alive = [f"{pid} {name}" for (pid, started), name in sorted(self.processes.items()) if _running(pid, started)]
            if not alive or time.monotonic() > deadline:
                return alive
            time.sleep(0.5)

    def folders_left(self) -> list[Path]:
        return sorted(folder for folder in self.session_folders if folder.exists())


def _running(pid: int, started: float) -> bool:
    """Whether that process (not a later one given the same pid) still runs."""
    try:
        process = psutil.Process(pid)
        return process.create_time() == started and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _unix_socket_paths() -> dict[int, str]:
    """Socket inode -> path of every bound unix socket (/proc/net/unix)."""
    found = {}
    try:
        lines = Path("/proc/net/unix").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) > 7:
            found[int(fields[6])] = fields[7]
    return found


def _socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets a process holds open (its /proc/<pid>/fd links read 'socket:[inode]')."""
    inodes = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes
