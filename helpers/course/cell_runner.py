"""Run one notebook inside the grading sandbox, cell by cell, and report every cell to the grader.

The grader (helpers.course.autograde) starts this in a sandbox (helpers.course.sandbox) as
``python -c 'from helpers.course.cell_runner import main; main()'`` and writes the job, one JSON
line, to its stdin: the cells in order (source, role) and the limits. The runner copies the
submission's files from ``/grading/in`` into its working folder, runs the cells, and writes one
JSON line per event to the grader: ``start`` before a cell, ``end`` after it (outputs, error, notes),
``done`` at the end (with the servers still listening then, where the sandbox has a network of its own).
Everything the submission writes to file descriptors 1 and 2 goes to a file in the sandbox instead, so that
only the runner talks to the grader.

**Hidden tests never enter the student's process.** The job holds only the visible part of each test
cell and the length of its hidden part. When the visible part has passed, the runner forks: the child
makes a one-time pad, sends it to the grader and receives the hidden part encrypted with it on stdin,
runs it, sends its verdict (passed, an exception class name, a limit, and the message of an assertion that
instructor code raised) straight to the grader and exits.
The process that goes on running the notebook never holds the hidden source (a read of the pipe gets
only ciphertext), the hidden code is never put in ``linecache``, and nothing the child did to the
namespace survives it.

What a submission can no longer do here, compared with a Jupyter kernel:

* register IPython input transformers or a custom exception handler: cells are compiled and run by
  the runner (IPython's own transformer, a private instance), never by the shell the student can reach;
* rebind a name an instructor cell defined, or replace a function of torch, numpy, math, time, the
  kit or the assignment's support module that the tests call, or a method, property or attribute of a
  class the support module defines: before every test cell the runner puts back what was there before the
  first student cell ran, and a test during which such a function was replaced again fails, with the name
  in the reason (what an object the tests hand to the submission holds is the submission's to reach);
* leave a trace or profile hook, an exception hook or an audit hook in place for the tests;
* give a test partial credit through its last expression: test cells show no result value.

For a notebook whose tests the referee runs (helpers.course.referee), the runner is the referee's child and talks
to it alone: its test cells have the role ``serve``, in which it answers the referee's calls into the notebook's
names until the referee says the cell is over.

The grade of a test cell is the runner's verdict (no exception and nothing written to stderr,
nbgrader's rule, except Python warnings: they are recorded and shown as notes under the verdict, since
a warning a library raises is no failure of the student's), sent over the grader's channel; a message the grader did not expect on that
channel makes the notebook score 0 (see helpers.course.autograde).
"""
from __future__ import annotations

import ast
import builtins
import contextlib
import errno
import io
import json
import linecache
import os
import shutil
import signal
import sys
import threading
import time
import traceback
import types
import warnings
from pathlib import Path

from helpers.core.procs import listening_tcp
from helpers.course import kit_use

INPUT = Path("/grading/in")
COMMAND = "from helpers.course.cell_runner import main; main()"  # how the sandbox (or the referee) starts the runner
HIDDEN_FILENAME = "<hidden tests>"  # what tracebacks of the hidden part name as their file
MESSAGE_CHARS = 500  # of an instructor's assertion message in a hidden test's verdict
# torch._dynamo rebinds torch.manual_seed when imported: load it before the snapshot so that is not taken for tampering.
PRELOADED = ("math", "time", "random", "json", "numpy", "numpy.testing", "torch", "torch.nn", "torch.nn.functional", "torch.testing", "torch._dynamo")
PROTECTED_PACKAGES = ("builtins", "sys", "os", "json", "signal", "math", "time", "random", "numpy", "torch", "helpers", "onnxruntime", "importlib")
TRACEBACK_LINES = 60


def cell_slack_s(cell_s: float) -> float:
    """How long past the per-cell limit the grader waits for a cell's end before it stops the sandbox."""
    return min(30.0, max(2.0, cell_s / 2))


class CellTimeoutError(Exception):
    """A cell ran past the per-cell time limit and was interrupted."""


class CpuLimitError(Exception):
    """The process used up its CPU-time limit."""


class BoundedText(io.TextIOBase):
    """A write-only text stream that keeps the first ``limit`` bytes and counts what it dropped."""

    def __init__(self, limit: int, name: str):
        self.limit, self.name = limit, name
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text) -> int:
        text = str(text)
        size = len(text.encode("utf-8", "replace"))
        room = self.limit - self.kept
        if size <= room:
            self.parts.append(text)
            self.kept += size
        else:
            if room > 0:
                head = text.encode("utf-8", "replace")[:room].decode("utf-8", "ignore")
                self.parts.append(head)
                self.kept += len(head.encode())
            self.dropped += size - max(room, 0)
        return len(text)

    def value(self) -> str:
        return "".join(self.parts)


class Guard:
    """What the tests rely on, as it was before any student code ran, and the means to put it back."""

    def __init__(self, support_modules: list[str]):
        for name in (*PRELOADED, *support_modules):
            try:
                __import__(name)
            except Exception:  # noqa: BLE001 - a support module that fails to import fails the tests that use it
                pass
        self.packages = PROTECTED_PACKAGES + tuple(support_modules)
        self.support = tuple(support_modules)
        self.modules: dict[str, types.ModuleType] = {}
        self.attributes: dict[str, dict[str, object]] = {}
        self.class_bodies: dict[str, tuple[type, dict[str, object]]] = {}  # support modules' classes: their own attributes
        self.add_new_modules()
        self.bindings: dict[str, object] = {}  # names the instructor's cells defined in the notebook
        self.excepthook = sys.excepthook
        self.meta_path = list(sys.meta_path)

    def support_files(self) -> set[str]:
        """The files of the assignment's support modules, as their code objects name them."""
        return {getattr(sys.modules.get(name), "__file__", None) for name in self.support} - {None}

    def add_new_modules(self) -> None:
        """Record the protected modules imported since the last call (at start, and after each instructor cell)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # deprecated torch attributes warn when looked at
            for name, module in list(sys.modules.items()):
                if name not in self.modules and module is not None and self._protected(name):
                    self.modules[name] = module
                    self.attributes[name] = self._callables(module)
                    if name.split(".")[0] in self.support:
                        self.class_bodies.update(self._class_bodies(name, module))

    def _class_bodies(self, name: str, module) -> dict[str, tuple[type, dict[str, object]]]:
        """Each class the module defines, with a copy of its own attributes (methods, properties, constants).

        Only classes built from the support modules' own classes (and builtins): a subclass of a library's class is
        left out, since libraries patch their classes at run time (torch wraps an optimizer class's ``step`` the
        first time one is made)."""
        def own(cls: type) -> bool:
            return all(base.__module__ == "builtins" or base.__module__.split(".")[0] in self.support for base in cls.__mro__)

        return {f"{name}.{cls.__qualname__}": (cls, dict(vars(cls))) for cls in vars(module).values()
                if isinstance(cls, type) and cls.__module__ == name and own(cls)}

    def _protected(self, name: str) -> bool:
        top = name.split(".")[0]
        if top not in self.packages:
            return False
        return top in ("helpers",) or name.count(".") <= 2 or top not in ("torch", "numpy")

    @staticmethod
    def _callables(module) -> dict[str, object]:
        try:
            items = list(vars(module).items())
        except TypeError:
            return {}
        return {k: v for k, v in items if callable(v)}  # functions and classes; submodules are swapped by lazy loaders

    def changes(self, namespace: dict) -> list[str]:
        """Every protected name whose value is not the one recorded (module attributes, sys.modules, instructor names)."""
        changed = []
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                changed.append(f"sys.modules[{name!r}]")
            current = getattr(module, "__dict__", {})
            changed += [f"{name}.{attr}" for attr, value in self.attributes[name].items() if current.get(attr, value) is not value]
        for label, (cls, body) in self.class_bodies.items():
            now = vars(cls)
            changed += [f"{label}.{attr}" for attr in sorted(set(now) | set(body)) if now.get(attr, _MISSING) is not body.get(attr, _MISSING)]
        changed += [name for name, value in self.bindings.items() if namespace.get(name) is not value]
        return changed

    def restore(self, namespace: dict) -> list[str]:
        """Put every protected name back and remove hooks; returns the names that had been changed."""
        changed = self.changes(namespace)
        for name, module in self.modules.items():
            sys.modules[name] = module
            current = getattr(module, "__dict__", {})
            for attr, value in self.attributes[name].items():
                if current.get(attr, value) is not value:
                    try:
                        setattr(module, attr, value)
                    except (AttributeError, TypeError):
                        pass
        for cls, body in self.class_bodies.values():
            for attr in set(vars(cls)) | set(body):
                if vars(cls).get(attr, _MISSING) is not body.get(attr, _MISSING):
                    try:
                        if attr in body:
                            setattr(cls, attr, body[attr])
                        else:
                            delattr(cls, attr)
                    except (AttributeError, TypeError):
                        pass
        for name, value in self.bindings.items():
            namespace[name] = value
        sys.settrace(None)
        sys.setprofile(None)
        threading.settrace(None)
        threading.setprofile(None)
        sys.excepthook = self.excepthook
        sys.meta_path[:] = self.meta_path
        return changed

    def record_bindings(self, namespace: dict, before: dict) -> None:
        """After an instructor cell: the names it bound (or rebound) are protected from now on."""
        for name, value in namespace.items():
            protectable = callable(value) or isinstance(value, types.ModuleType)
            if protectable and not name.startswith("__") and before.get(name, _MISSING) is not value:
                self.bindings[name] = value


_MISSING = object()
MAX_WARNINGS = 5  # per test cell, reported as notes


def _warning_note(caught: warnings.WarningMessage) -> dict:
    """One warning a test cell raised: its category's name, its message (bounded) and where it came from."""
    return {"category": getattr(caught.category, "__name__", "Warning")[:100], "message": str(caught.message)[:300],
            "where": f"{os.path.basename(str(caught.filename))[:100]}:{caught.lineno}"}


def _block_new_audit_hooks(event: str, args) -> None:
    if event == "sys.addaudithook":
        raise RuntimeError("audit hooks are not allowed while a submission is graded")


def _classify(error: BaseException, limits: dict) -> str:
    """The limit an error came from, in words, or '' when it is an ordinary error."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, MemoryError) or "can't allocate memory" in text or "Cannot allocate memory" in text:
        return f"memory limit ({limits['memory_bytes'] / 2**30:g} GiB of address space)"
    if isinstance(error, CellTimeoutError):
        return f"per-cell time limit ({limits['cell_s']:g} s)"
    if isinstance(error, CpuLimitError):
        return f"CPU-time limit ({limits['cpu_s']:g} s)"
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
        return f"disk limit ({limits['disk_bytes'] / 2**20:g} MiB)"
    if (isinstance(error, OSError) and error.errno == errno.EAGAIN) or "can't start new thread" in text:
        return f"process limit ({limits['processes']} processes and threads)"
    return ""


def _error_output(error: BaseException, limits: dict) -> dict:
    limit = _classify(error, limits)
    evalue = str(error)
    if limit:
        evalue = f"{evalue} [hit the {limit}]" if evalue else f"[hit the {limit}]"
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    lines = [line for line in lines if "helpers/course/cell_runner.py" not in line and "cell_runner.py" not in line]
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith("<cell-")]
    return {"ename": type(error).__name__, "evalue": evalue[:4000], "traceback": lines[-TRACEBACK_LINES:], "limit": limit,
            "line": frames[0].lineno if frames else None}


class Runner:
    """Runs the cells of one notebook in a fresh ``__main__`` namespace and reports them on ``channel``."""

    def __init__(self, job: dict, channel: int, grader_in: int = -1):
        self.job, self.channel, self.limits = job, channel, job["limits"]
        self.grader_in = grader_in
        self.write = os.write  # the runner's own reference: rebinding os.write does not reach it
        self.main = types.ModuleType("__main__")
        self.main.__dict__["__builtins__"] = builtins
        sys.modules["__main__"] = self.main
        from IPython.core.inputtransformer2 import TransformerManager

        self.transformer = TransformerManager()
        self.shell = self._shell()
        # The assignment's declared part of the kit (assignment.toml), before any cell runs: the guard then protects the hook.
        kit_use.install(job.get("assignment", "this assignment"), job.get("kit"), os.getcwd(), job.get("support_modules", []))
        self.guard = Guard(job.get("support_modules", []))
        self.used_output = 0
        self.cells_run = 0
        self.running_role = ""
        self.instructor_code: set[types.CodeType] = set()  # code of test and setup cells, and of hidden parts
        self.referee_link = None  # to the referee (helpers.course.referee), for the test cells it runs

    def _shell(self):
        """An IPython shell for ``get_ipython()`` and magics in student code; it never runs a cell itself."""
        from IPython.core.interactiveshell import InteractiveShell

        return InteractiveShell.instance(user_module=self.main, user_ns=self.main.__dict__)

    def send(self, **message) -> None:
        self.send_message(message)

    def send_message(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        view = memoryview(data)
        while view:
            view = view[self.write(self.channel, view):]

    def run(self) -> None:
        for cell in self.job["cells"]:
            self.send(event="start", cell=cell["index"])
            self.send(event="end", cell=cell["index"], **self.run_cell(cell))
        self.send(event="done", listening=servers_left_listening() if self.job.get("own_network") else [])

    def run_cell(self, cell: dict) -> dict:
        namespace = self.main.__dict__
        role = cell["role"]
        self.running_role = role
        notes = []
        if role == "test":
            changed = self.guard.restore(namespace)
            if changed:
                notes.append("put back before the tests ran (the submission had replaced them): " + ", ".join(sorted(changed)[:12]))
        before = dict(namespace) if role == "instructor" else {}
        budget = max(0, self.limits["cell_output_bytes"])
        room = max(0, min(budget, self.limits["output_bytes"] - self.used_output))
        stdout, stderr = BoundedText(room, "stdout"), BoundedText(max(room // 4, 1024), "stderr")
        sys.stdout, sys.stderr = stdout, stderr
        start = time.perf_counter()
        error, result = None, None
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.signal(signal.SIGXCPU, _on_cpu_limit)
        signal.setitimer(signal.ITIMER_REAL, float(self.limits["cell_s"]))
        hidden, in_hidden = None, False
        # In a test cell a Python warning is a note, not a write to stderr (which fails the test): torch.tensor() of a
        # tensor warns, and that passes in Jupyter. The hidden part's warnings (in its child) are neither.
        caught = warnings.catch_warnings(record=True) if role in ("test", "serve") else contextlib.nullcontext([])
        if role == "serve":
            # the referee's limit comes first; then it interrupts us (at a third of the slack), then this (two thirds)
            signal.setitimer(signal.ITIMER_REAL, float(self.limits["cell_s"]) + 2 * cell_slack_s(float(self.limits["cell_s"])) / 3)
        with caught as raised:
            try:
                if role == "serve":  # the referee runs this test cell and calls into this notebook's code
                    self.serve_referee(namespace)
                else:
                    result = self.execute(cell["source"], namespace, show_result=role != "test")
                if role == "test" and cell.get("hidden") and not stderr.kept:
                    in_hidden = True
                    hidden = self.run_hidden(cell, namespace)
                    in_hidden = False
            except BaseException as err:  # noqa: BLE001 - every error, even SystemExit, is the cell's outcome
                error = err
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        seconds = time.perf_counter() - start
        if role == "instructor" and error is None:
            self.guard.record_bindings(namespace, before)
            self.guard.add_new_modules()
        if role == "test":
            changed = self.guard.changes(namespace)
            if changed and error is None:
                error = RuntimeError("the code under test replaced " + ", ".join(sorted(changed)[:12]) + " while the tests ran; the test does not count")
            self.guard.restore(namespace)
        for stream in (stdout, stderr):
            if stream.dropped:
                notes.append(f"{stream.dropped:,} bytes of {stream.name} dropped at the output limit ({self.limits['output_bytes']:,} bytes per notebook)")
        self.used_output += stdout.kept + stderr.kept
        outcome = {"stdout": stdout.value(), "stderr": stderr.value(), "seconds": round(seconds, 3), "notes": notes}
        if hidden is not None:
            outcome["hidden_status"] = hidden
        if in_hidden:
            outcome["hidden_interrupted"] = True  # the error (a limit) came while the hidden tests ran
        if raised:
            outcome["warnings"] = [_warning_note(w) for w in raised[:MAX_WARNINGS]]
            outcome["warnings_raised"] = len(raised)
        if result is not None:
            outcome["result"] = _bounded_repr(result)
        if error is not None:
            outcome["error"] = _error_output(error, self.limits)
        return outcome

    def serve_referee(self, namespace: dict) -> None:
        """Answer the referee's calls into the notebook's names until it says the test cell is over."""
        from helpers.course import referee

        if self.referee_link is None:
            self.referee_link = referee.Link(self.grader_in, self.channel, "runner", tuple(self.job.get("support_modules", ())), self.write)
        referee.serve_cell(self.referee_link, namespace)

    def run_hidden(self, cell: dict, namespace: dict) -> int:
        """Run the test cell's hidden part in a child process (see the module's docstring); returns the child's exit status.

        The verdict goes from the child to the grader; the parent only waits (its per-cell alarm still applies).
        """
        left = signal.getitimer(signal.ITIMER_REAL)[0]
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            verdict = {"passed": False, "ename": "RunnerError", "limit": "", "line": None}
            try:
                signal.setitimer(signal.ITIMER_REAL, max(left, 0.01))
                _share_parents_forkserver()
                _one_openmp_thread()
                verdict = self._hidden_verdict(cell, namespace)
            except BaseException as err:  # noqa: BLE001 - a timeout while receiving or running is a verdict too
                verdict = {"passed": False, "ename": type(err).__name__, "limit": _classify(err, self.limits), "line": None}
            finally:
                try:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    self.send(event="hidden", cell=cell["index"], **verdict)
                finally:
                    os._exit(0)
        try:
            _, status = os.waitpid(pid, 0)
            pid = 0
            return status
        finally:
            if pid:  # interrupted (the per-cell limit): the child goes with the cell
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)

    def _hidden_verdict(self, cell: dict, namespace: dict) -> dict:
        size = int(cell["hidden"])
        pad = os.urandom(size)
        self.send(event="key", cell=cell["index"], pad=pad.hex())
        data = bytearray()
        while len(data) < size:
            chunk = os.read(self.grader_in, size - len(data))
            if not chunk:
                raise EOFError("the grader sent no hidden tests")
            data += chunk
        code = compile(bytes(a ^ b for a, b in zip(data, pad)).decode(), HIDDEN_FILENAME, "exec", dont_inherit=True)
        del data, pad
        self.instructor_code.update(_code_objects(code))
        quiet, errors = BoundedText(0, "stdout"), BoundedText(0, "stderr")
        sys.stdout, sys.stderr = quiet, errors
        error = None
        try:
            exec(code, namespace)  # noqa: S102
        except BaseException as err:  # noqa: BLE001
            error = err
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        del code
        changed = self.guard.changes(namespace)
        wrote_stderr = errors.dropped > 0
        if error is None and changed:
            return {"passed": False, "ename": "RuntimeError", "limit": "", "line": None, "replaced": sorted(changed)[:12]}
        if error is None and not wrote_stderr:
            return {"passed": True, "ename": "", "limit": "", "line": None}
        verdict = {"passed": False, "ename": type(error).__name__ if error else "stderr", "limit": _classify(error, self.limits) if error else "", "line": None}
        message = self._instructors_message(error)
        if message:
            verdict["message"] = message
        return verdict

    def _instructors_message(self, error: BaseException | None) -> str:
        """An AssertionError's message when instructor code raised it (the hidden part, a test or setup cell's function,
        the support module): which property failed and by how much. Never the submission's own text, nor hidden source."""
        if not isinstance(error, AssertionError) or not error.args:
            return ""
        frame = error.__traceback__
        while frame is not None and frame.tb_next is not None:
            frame = frame.tb_next
        if frame is None:
            return ""
        code = frame.tb_frame.f_code
        if code not in self.instructor_code and code.co_filename not in self.guard.support_files():
            return ""
        return str(error.args[0])[:MESSAGE_CHARS]

    def execute(self, source: str, namespace: dict, show_result: bool):
        """Compile with IPython's transformer (magics work) and run; the value of a last expression is returned."""
        code = self.transformer.transform_cell(source)
        self.cells_run += 1
        filename = f"<cell-{self.cells_run}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)  # inspect.getsource works, as in Jupyter
        tree = ast.parse(code, filename=filename)
        last = tree.body.pop() if show_result and tree.body and isinstance(tree.body[-1], ast.Expr) else None
        # dont_inherit: the runner's own `from __future__ import annotations` must not turn the student's annotations into strings
        compiled = compile(tree, filename, "exec", dont_inherit=True)
        if self.running_role in ("test", "instructor"):
            self.instructor_code.update(_code_objects(compiled))
        exec(compiled, namespace)  # noqa: S102 - running the student's notebook is the job
        if last is not None:
            value = eval(compile(ast.Expression(last.value), filename, "eval", dont_inherit=True), namespace)  # noqa: S307
            if value is not None:
                namespace["_"] = value
            return value
        return None


def _code_objects(code: types.CodeType) -> set[types.CodeType]:
    """``code`` and every function, class body and comprehension compiled inside it."""
    found = {code}
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            found |= _code_objects(constant)
    return found


def _one_openmp_thread() -> None:
    """In the hidden-test child: GNU OpenMP's thread pool does not survive a fork (the child's first parallel region
    would wait for the parent's threads forever), so torch runs the hidden tests on one thread, as DataLoader workers do."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


def _share_parents_forkserver() -> None:
    """In the hidden-test child: use the multiprocessing forkserver the notebook's process started (workers the kit
    launches come from it). Its liveness check waits on the server's pid, which only the parent may do, so the
    child would raise ChildProcessError; the server lives as long as the parent, which waits for this child."""
    forkserver = sys.modules.get("multiprocessing.forkserver")
    server = getattr(forkserver, "_forkserver", None)
    if server is not None and server._forkserver_pid is not None and server._forkserver_address is not None:
        server.ensure_running = lambda: None


def _bounded_repr(value, limit: int = 2000) -> str:
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001 - a broken __repr__ is shown, not raised
        text = f"<repr failed: {type(err).__name__}>"
    return text if len(text) <= limit else text[:limit] + " ..."


def _on_alarm(signum, frame):
    raise CellTimeoutError("the cell ran past the per-cell time limit and was interrupted")


def _on_cpu_limit(signum, frame):
    raise CpuLimitError("the process used up its CPU time")


_monotonic, _sleep = time.monotonic, time.sleep  # as they were before any student code ran


def listening_sockets() -> list[str]:
    """The TCP sockets listening in this network namespace, as "address:port" ("[address]:port" for IPv6)."""
    return sorted({f"[{host}]:{port}" if ":" in host else f"{host}:{port}" for host, port in listening_tcp().values()})


def servers_left_listening(grace_s: float = 2.0) -> list[str]:
    """The sockets still listening after the last cell (a server the notebook started and never stopped); a server
    that is shutting down gets ``grace_s`` to close its socket."""
    try:
        deadline = _monotonic() + grace_s
        while (listening := listening_sockets()) and _monotonic() < deadline:
            _sleep(0.1)
        return listening
    except Exception:  # noqa: BLE001 - a note for the student, never a reason for the run to fail
        return []


def copy_input(source: Path, destination: Path) -> None:
    """Copy the submission's files into the working folder and enter it (the runner, or the referee for it)."""
    destination.mkdir(parents=True, exist_ok=True)
    if source.exists():
        for path in source.iterdir():
            target = destination / path.name
            (shutil.copytree if path.is_dir() else shutil.copy)(path, target)
    os.chdir(destination)


def read_job(fd: int) -> dict:
    """The job: one JSON line (its writer sends nothing more until asked, so nothing after the line is read)."""
    line = bytearray()
    while not line.endswith(b"\n"):  # the grader (or referee) writes again only when asked: hidden tests, calls
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        line += chunk
    return json.loads(line)


def main() -> None:
    """Entry point inside the sandbox: job on stdin, events on the original stdout."""
    grader_in = os.dup(0)
    os.set_inheritable(grader_in, False)
    job = read_job(grader_in)
    channel, log = os.dup(1), os.dup(2)
    os.set_inheritable(channel, False)
    os.set_inheritable(log, False)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    sys.stdin = open(0, closefd=False)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file past the size limit raises EFBIG instead of killing us
    Path(os.environ.get("HOME", "/tmp/home")).mkdir(parents=True, exist_ok=True)
    copy_input(Path(job.get("input", INPUT)), Path(job["workdir"]))
    try:
        runner = Runner(job, channel, grader_in)
        spill = os.open(job.get("spill", "/tmp/.fd-output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(spill, 1)  # from here on, the submission's own writes to fd 1 and 2 land in a file of the sandbox
        os.dup2(spill, 2)
        sys.__stdout__ = sys.__stderr__ = open(1, "w", buffering=1, closefd=False)
        sys.addaudithook(_block_new_audit_hooks)
        runner.run()
    except BaseException:  # noqa: BLE001 - the runner's own failure goes to the grader's log
        os.write(log, traceback.format_exc().encode())
        os._exit(70)
    os._exit(0)  # leave no atexit handler of the submission a chance to write anything
