"""The grading sandbox: one notebook of one submission run by helpers.course.cell_runner under bubblewrap.

What the submission's code sees (bubblewrap, Debian's ``bubblewrap`` package, ``bwrap``):

* a file system of its own: the system's /usr, /etc and the Python installation read-only, the kit's
  ``helpers`` package read-only at /opt/edl-kit, and a private, size-limited tmpfs holding a copy of the student's files and
  the released support files. Not the course folder (source/, gradebook, other students) nor the rest of
  the kit's checkout;
* no network (a private loopback only: its own servers on 127.0.0.1 work, nothing outside is reachable);
* its own process namespace: when the runner ends or is stopped, everything it started ends with it;
* an unprivileged user and no capabilities. As root, each job slot runs as a uid of its own, leased for the
  grading run (``UidLease``: a lock file per uid), so two graders on one machine never share a uid: neither
  their process limits nor their processes;
* limits (util-linux ``prlimit``): CPU seconds, address space, processes and threads, file size, open files;
  wall time and output bytes are enforced by the grader.

Without bubblewrap (a TA's macOS laptop) the runner runs in a temporary folder under the same resource
limits, with no file-system, network or process isolation, and every grading command says so loudly.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import psutil

from helpers.core.paths import MODEL_CACHE_ENV, shared_model_cache
from helpers.core.procs import stop_tree
from helpers.course.cell_runner import COMMAND, cell_slack_s
from helpers.course.intake import safe_text
from helpers.course.references import REFERENCES_ENV, SANDBOX_REFERENCES

UID_BASE, UID_COUNT = 64000, 1000  # as root, sandboxes run as uids leased from this range, one per job slot
UID_LOCKS = Path("/run/lock/edl-grader-uids") if Path("/run/lock").is_dir() else Path(tempfile.gettempdir()) / "edl-grader-uids"
SANDBOX_INPUT = "/grading/in"
SCRATCH = ("/tmp", "/dev/shm", "/var/tmp")  # private, size-limited tmpfs mounts (DVC keeps its site cache in /var/tmp)
SANDBOX_KIT = "/opt/edl-kit"  # the kit's helpers package, read-only, first on the sandbox's PYTHONPATH
SANDBOX_MODELS = "/opt/edl-models"  # the kit's model caches (the language model's weights), read-only, when built
SANDBOX_HOME = "/tmp/home"
SANDBOX_WORK = "/tmp/submission"
RUNNER = COMMAND  # the runner's entry point (helpers.course.cell_runner)
REFEREE = "from helpers.course.referee import main; main()"  # for a notebook whose tests the referee runs (its job says so)


@dataclass(frozen=True)
class Limits:
    """Per-submission limits. Wall time covers the whole submission; the others apply to each notebook's sandbox."""

    wall_s: float = 1800.0
    cell_s: float = 180.0
    cpu_s: int = 1800
    memory_bytes: int = 8 * 2**30  # address space: torch (CUDA build) maps 3.1 GiB at import, so about 4.5 GiB is left to use
    processes: int = 256
    output_bytes: int = 1 * 2**20
    cell_output_bytes: int = 64 * 2**10
    disk_bytes: int = 512 * 2**20
    submission_bytes: int = 50 * 2**20

    def describe(self) -> str:
        return (f"wall {self.wall_s:g} s per submission, {self.cell_s:g} s per cell, CPU {self.cpu_s} s, memory {self.memory_bytes / 2**30:g} GiB, "
                f"{self.processes} processes, output {self.output_bytes / 2**20:g} MiB, disk {self.disk_bytes / 2**20:g} MiB")


class UidLease:
    """``count`` sandbox uids that no other grading run on this machine holds (as root; otherwise the grader's own uid).

    Each uid is held through an exclusive ``flock`` on a lock file of its own, which the kernel releases when
    this process ends however it ends; a uid that still has processes (left by a killed run) is skipped.
    """

    def __init__(self, count: int):
        self.uids: list[int] = []
        self._locks: list = []
        if os.getuid() != 0:
            self.uids = [os.getuid()] * count
            return
        UID_LOCKS.mkdir(mode=0o755, parents=True, exist_ok=True)
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            if len(self.uids) == count:
                break
            lock = open(UID_LOCKS / f"{uid}.lock", "a")
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                lock.close()
                continue
            if _process_count(uid):
                lock.close()
                continue
            self.uids.append(uid)
            self._locks.append(lock)
        if len(self.uids) < count:
            self.release()
            raise RuntimeError(f"no {count} free sandbox uids in {UID_BASE}..{UID_BASE + UID_COUNT - 1} (lock files in {UID_LOCKS})")

    def release(self) -> None:
        for lock in self._locks:
            lock.close()
        self._locks = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


@lru_cache(maxsize=1)
def bubblewrap() -> str | None:
    """Path of a working ``bwrap``, or None (not installed, or user namespaces are not allowed here)."""
    path = shutil.which("bwrap")
    if not path:
        return None
    probe = subprocess.run([path, "--ro-bind", "/", "/", "--unshare-pid", "--unshare-net", "true"], capture_output=True, timeout=30)
    return path if probe.returncode == 0 else None


def isolation() -> str:
    """One sentence for the TA: how submissions are isolated on this machine."""
    if bubblewrap():
        return "submissions run in a bubblewrap sandbox (own file system, no network, own processes, resource limits)"
    return ("WARNING: bubblewrap (bwrap) is not available, so submissions run WITHOUT a sandbox: their code can read and "
            "change anything this user can (the course's source/, the gradebook, other submissions). Only resource "
            "limits and a temporary folder apply. Install bubblewrap (Debian/Ubuntu: apt install bubblewrap) before grading a class.")


@dataclass
class CellEvent:
    """What the runner reported for one cell."""

    index: int
    outcome: dict | None = None  # None: the cell started but never ended
    hidden: dict | None = None  # the verdict of the cell's hidden tests, from the child that ran them
    key_sent: bool = False  # the cell's hidden part went to the runner's child


@dataclass
class SandboxRun:
    """The events of one notebook's run and how it ended."""

    cells: dict[int, CellEvent] = field(default_factory=dict)
    finished: bool = False
    stopped: str = ""  # why the grader stopped it (a limit, tampering), '' when it ended by itself
    tampered: str = ""
    refereed: bool = False  # the referee ran the tests (helpers.course.referee)
    listening: list[str] = field(default_factory=list)  # servers the notebook left listening after its last cell
    returncode: int | None = None
    seconds: float = 0.0
    log: str = ""

    @property
    def running(self) -> int | None:
        """The cell that had started but not ended when the run stopped."""
        open_cells = [i for i, e in self.cells.items() if e.outcome is None]
        return open_cells[-1] if open_cells else None


def _prlimit(limits: Limits, jobs: int, uid: int) -> list[str]:
    """Resource limits for the sandbox. The process limit counts per user: as root each job slot has its own user;
    otherwise the grader's user is shared with everything else it runs, so the limit is the count now plus jobs x limit."""
    processes = limits.processes + _process_count(uid) if uid != os.getuid() else limits.processes * max(jobs, 1) + _process_count(uid)
    return ["prlimit", f"--cpu={limits.cpu_s}:{limits.cpu_s + 5}", f"--as={limits.memory_bytes}", f"--nproc={processes}",
            f"--fsize={limits.disk_bytes}", "--nofile=1024", "--core=0", "--"]


def _process_count(uid: int) -> int:
    count = 0
    for process in psutil.process_iter(["uids"]):
        try:
            count += process.info["uids"].real == uid
        except (AttributeError, psutil.Error):
            pass
    return count


def _mount_points(paths: list[Path]) -> list[str]:
    """``--dir`` for every parent folder of the bind targets, readable by the sandbox's user."""
    parents = sorted({str(p) for path in paths for p in path.parents if str(p) not in ("/", *SCRATCH)}, key=lambda p: p.count("/"))
    args = []
    for parent in parents:
        args += ["--perms", "0755", "--dir", parent]
    return args


def _python_homes() -> list[tuple[Path, Path]]:
    """(host path, path in the sandbox) of the Python installation: each prefix resolved, and again where it is seen
    through a link (a symlinked .venv or home), since the runner is started as ``sys.executable`` reads."""
    homes = set()
    for prefix in (Path(sys.base_prefix), Path(sys.prefix), Path(sys.executable).parent.parent):
        resolved = prefix.resolve()
        homes.add((resolved, resolved))
        if Path(os.path.abspath(prefix)) != resolved:
            homes.add((resolved, Path(os.path.abspath(prefix))))
    return sorted(homes)


def bwrap_command(input_dir: Path, limits: Limits, jobs: int, env: dict[str, str], uid: int | None = None,
                  references: Path | None = None, entry: str = RUNNER) -> list[str]:
    """The full command line: prlimit, bwrap with its mounts and namespaces, the runner (as root: dropping to ``uid``)."""
    import helpers

    kit_package = Path(helpers.__file__).resolve().parent
    read_only = [(Path(p), Path(p)) for p in ("/usr", "/etc", "/sys") if Path(p).exists()]
    for host, inside in _python_homes():  # a link inside a folder bound whole is there already, and resolves inside
        if host == inside or not any(inside.is_relative_to(bound) for _, bound in read_only if _ == bound):
            read_only.append((host, inside))
    args = [bubblewrap(), "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    # Scratch space first: the read-only binds come after, so a kit or venv that lives under /tmp stays visible.
    args += ["--proc", "/proc", "--dev", "/dev"]
    for scratch in SCRATCH:
        args += ["--size", str(limits.disk_bytes), "--perms", "1777", "--tmpfs", scratch]
    models = shared_model_cache()
    args += _mount_points([inside for _, inside in read_only if inside.parent != Path("/")] + [Path(SANDBOX_INPUT), Path(SANDBOX_KIT) / "helpers"]
                          + ([Path(SANDBOX_MODELS)] if models else []) + ([Path(SANDBOX_REFERENCES)] if references else []))
    for host, inside in read_only:
        args += ["--ro-bind", str(host), str(inside)]
    args += ["--ro-bind", str(kit_package), f"{SANDBOX_KIT}/helpers"]  # the kit's package only, not its checkout
    if models:  # weights a notebook may load, too large to write inside the sandbox's disk limit
        args += ["--ro-bind", str(models), SANDBOX_MODELS]
    if references:  # the instructors' files for later tasks' tests (helpers.course.references)
        args += ["--ro-bind", str(references), SANDBOX_REFERENCES]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = Path("/") / link
        if target.is_symlink():
            args += ["--symlink", os.readlink(target), str(target)]
        elif target.exists():
            args += ["--ro-bind", str(target), str(target)]
    args += ["--ro-bind", str(input_dir), SANDBOX_INPUT, "--chdir", "/tmp", "--clearenv"]
    for key, value in {**env, **({MODEL_CACHE_ENV: SANDBOX_MODELS} if models else {}),
                       **({REFERENCES_ENV: SANDBOX_REFERENCES} if references else {})}.items():
        args += ["--setenv", key, value]
    command = [sys.executable, "-c", entry]
    if os.getuid() == 0:  # become an unprivileged user inside, so the process limit applies and nothing is writable
        if uid is None or uid == 0:
            raise ValueError("as root, a sandbox needs a leased uid (UidLease)")
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--inh-caps=-all", "--no-new-privs", *command]
    else:
        uid = os.getuid()
    return _prlimit(limits, jobs, uid) + args + ["--", *command]


def sandbox_environment(threads: int) -> dict[str, str]:
    """The runner's environment: nothing of the grader's, a private home, one thread count, no GPU."""
    return {
        "PYTHONPATH": SANDBOX_KIT,
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": SANDBOX_HOME, "USER": "student", "LOGNAME": "student", "TMPDIR": "/tmp", "LANG": "C.UTF-8", "MPLBACKEND": "Agg", "MPLCONFIGDIR": "/tmp/home/.matplotlib",
        "EDL_BUILD_DIR": "/tmp/home/build", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0", "MALLOC_ARENA_MAX": "2",
        "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": "",
        "PYTORCH_NVML_BASED_CUDA_CHECK": "1",
        # Outside Jupyter, tqdm's progress bars (MLflow's artifact downloads...) write to stderr, which fails a test
        # cell under nbgrader's rule; in a notebook they are widgets. Graded runs show none.
        "TQDM_DISABLE": "1",
        # gRPC's core logs routine connection events on stderr at random (a GOAWAY when a test stops its own server
        # while the client's connection closes): that would fail a gRPC test cell for the tests' own teardown.
        "GRPC_VERBOSITY": "ERROR",
    }


SCRATCH_KINDS = ("edl-grade-", "edl-sandbox-", "edl-references-")  # the grader's folders under the temporary directory


def scratch_prefix(kind: str) -> str:
    """A temporary folder's name prefix that names this process, so that a later grader can tell it was left behind."""
    return f"{kind}{os.getpid()}-"


def sweep_scratch(folder: Path | None = None) -> int:
    """Remove the scratch folders of graders that are gone (a grader killed mid-run skips its own cleanup); their
    count. A folder whose process still runs, or whose name names no process, is kept."""
    removed = 0
    for kind in SCRATCH_KINDS:
        for path in Path(folder or tempfile.gettempdir()).glob(f"{kind}*-*"):
            pid = path.name[len(kind):].split("-", 1)[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
    return removed


def run_notebook(files: dict[str, Path], job: dict, limits: Limits, deadline: float, jobs: int = 1, threads: int = 2, uid: int | None = None,
                 hidden: dict[int, str] | None = None, references: Path | None = None) -> SandboxRun:
    """Run one notebook's job in a fresh sandbox holding ``files`` (name -> host path); stop it at ``deadline``.

    ``job`` is the runner's job (cells and limits; it never touches the disk, so the hidden tests are
    not readable from the sandbox's files). ``hidden``: the hidden part of each test cell (by cell index), which
    never enters the job: it is sent, encrypted with a pad the runner's child makes, only when that child asks
    (see helpers.course.cell_runner). Each file is read as a regular file (never through a link), bounded
    by the submission limit. ``uid``: the sandbox's user as root (a one-off lease when None). ``references``: a folder
    of the instructors' files the notebook reads read-only (helpers.course.references), or None.
    Returns the events as the runner reported them.
    """
    from helpers.course import intake

    staging = Path(tempfile.mkdtemp(prefix=scratch_prefix("edl-grade-")))
    lease = UidLease(1) if uid is None and os.getuid() == 0 else None
    try:
        staging.chmod(0o755)
        for name, path in files.items():
            (staging / name).write_bytes(intake.read_regular(path, limits.submission_bytes))
            (staging / name).chmod(0o644)
        return _run(staging, job, limits, deadline, jobs, threads, lease.uids[0] if lease else uid, hidden or {}, references)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if lease:
            lease.release()


def _run(staging: Path, job: dict, limits: Limits, deadline: float, jobs: int, threads: int, uid: int | None, hidden: dict[int, str],
         references: Path | None = None) -> SandboxRun:
    job = {**job, "limits": dataclasses.asdict(limits)}
    env = sandbox_environment(threads)
    entry = REFEREE if job.get("referee") else RUNNER
    if bubblewrap():
        command = bwrap_command(staging, limits, jobs, env, uid, references, entry)
        job.update(workdir=SANDBOX_WORK, input=SANDBOX_INPUT, spill="/tmp/.fd-output", own_network=True)
        cwd, start_new_session = None, False
    else:
        private = Path(tempfile.mkdtemp(prefix=scratch_prefix("edl-sandbox-")))
        env.update(HOME=str(private / "home"), TMPDIR=str(private), MPLCONFIGDIR=str(private / "home" / ".mpl"),
                   EDL_BUILD_DIR=str(private / "home" / "build"), PYTHONPATH=str(Path(__file__).resolve().parents[2]))
        models = shared_model_cache()
        if models:
            env[MODEL_CACHE_ENV] = str(models)
        if references:
            env[REFERENCES_ENV] = str(references)
        command = _prlimit(limits, jobs, os.getuid())[:-1] if shutil.which("prlimit") else []
        command = (command + ["--"] if command else []) + [sys.executable, "-c", entry]
        job.update(workdir=str(private / "submission"), input=str(staging), spill=str(private / ".fd-output"))
        cwd, start_new_session = private, True
    started = time.monotonic()
    process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                               cwd=cwd, start_new_session=start_new_session)
    run = SandboxRun(refereed=entry == REFEREE)
    try:
        process.stdin.write(json.dumps(job).encode() + b"\n")
        process.stdin.flush()
    except BrokenPipeError:
        pass
    events: queue.Queue = queue.Queue()
    reader = threading.Thread(target=_read_events, args=(process.stdout, events, limits.output_bytes * 4 + 2**20), daemon=True)
    reader.start()
    errors: list[bytes] = []
    threading.Thread(target=lambda: errors.append(process.stderr.read(64 * 2**10)), daemon=True).start()
    try:
        _follow(run, job, events, limits, deadline, hidden, process.stdin)
    finally:
        try:
            process.stdin.close()
        except OSError:
            pass
        try:
            process.wait(timeout=5 if run.finished else 0.1)
        except subprocess.TimeoutExpired:
            stop_tree(process.pid, grace=0)  # bubblewrap takes its process namespace with it; the fallback needs the tree
        run.returncode = process.wait()
        reader.join(timeout=5)
        run.seconds = time.monotonic() - started
        run.log = b"".join(errors).decode(errors="replace")
        if not bubblewrap():
            shutil.rmtree(cwd, ignore_errors=True)
    return run


def _read_events(stream, events: queue.Queue, max_line: int) -> None:
    while True:
        line = stream.readline(max_line)
        if not line:
            events.put(None)
            return
        if not line.endswith(b"\n"):
            events.put(("oversized", len(line)))
            events.put(None)
            return
        try:
            events.put(json.loads(line))
        except ValueError:
            events.put(("garbled", line[:200]))


def _follow(run: SandboxRun, job: dict, events: queue.Queue, limits: Limits, deadline: float, hidden: dict[int, str], to_runner) -> None:
    """Read the runner's events in the order the job defines; stop at the wall limit, a stuck cell or tampering.

    Within a test cell, a ``key`` event (once) gets the cell's hidden part back, encrypted with the pad it
    carries, and a ``hidden`` event (once, after the key) is the verdict of the hidden tests.
    """
    expected = [c["index"] for c in job["cells"]]
    position, in_cell, cell_started = 0, False, time.monotonic()
    while True:
        now = time.monotonic()
        cell_deadline = cell_started + limits.cell_s + cell_slack_s(limits.cell_s) if in_cell else deadline
        wait = min(deadline, cell_deadline) - now
        if wait <= 0:
            if now >= deadline:
                run.stopped = f"wall-time limit ({limits.wall_s:g} s for the submission)"
            else:
                run.stopped = f"per-cell time limit ({limits.cell_s:g} s): the cell ignored the interrupt and was stopped"
            return
        try:
            event = events.get(timeout=min(wait, 1.0))
        except queue.Empty:
            continue
        if event is None:
            return
        if isinstance(event, tuple):
            run.tampered = f"wrote {event[0]} data to the grader's channel"
            return
        kind, index = event.get("event"), event.get("cell")
        if kind == "tampered":  # the referee's word: the notebook's process wrote to its pipe what it never asked for
            run.tampered = f"wrote to the tests' pipe what they never asked for ({safe_text(event.get('reason'), 300)})"
            return
        if kind == "done" and position == len(expected) and not in_cell:
            run.finished = True
            listening = event.get("listening")
            run.listening = [safe_text(str(a), 60) for a in listening[:10]] if isinstance(listening, list) else []
            return
        wanted = expected[position] if position < len(expected) else None
        current = run.cells.get(index) if in_cell and index == wanted else None
        if kind == "key" and current is not None and index in hidden and not current.key_sent:
            secret = hidden[index].encode()
            try:
                pad = bytes.fromhex(str(event.get("pad", "")))
            except ValueError:
                pad = b""
            if len(pad) != len(secret):
                run.tampered = f"asked for the hidden tests of cell {index} with a key of the wrong size"
                return
            current.key_sent = True
            try:
                to_runner.write(bytes(a ^ b for a, b in zip(secret, pad)))
                to_runner.flush()
            except OSError:
                pass
        elif kind == "hidden" and current is not None and current.key_sent and current.hidden is None:
            current.hidden = event
        elif kind == "start" and not in_cell and index == wanted:
            run.cells[index] = CellEvent(index)
            in_cell, cell_started = True, time.monotonic()
        elif kind == "end" and in_cell and index == wanted:
            run.cells[index].outcome = event
            in_cell, position = False, position + 1
        else:
            run.tampered = f"sent a message the grader did not expect ({kind!r} for cell {index!r} while waiting for cell {wanted})"
            return
