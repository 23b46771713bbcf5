"""The referee: a notebook's tests run in a process where no student code ever runs, and drive the student's code
across the process boundary.

Where a notebook's tests run in the process that runs the student's cells (helpers.course.cell_runner), that code
can reach everything the tests hold: the checker's counters, the objects a test reads its verdict from, and the
grader's own channel. For a notebook that ``assignment.toml`` declares under ``[referee]``, the grader starts this
module instead. The referee reads the job, copies the submission, imports the support modules, makes itself
unreadable to other processes of its user (``PR_SET_DUMPABLE``), and only then starts the notebook's runner as a
fresh interpreter, its child, holding none of the grader's pipes: the runner talks to the referee alone.

* Student and setup cells run in the runner, as before; the referee relays their reports to the grader (and runs
  the instructor's setup cells itself too, so its tests have the same helpers).
* Test cells, visible and hidden parts, run in the referee. The names the declaration lists (``names``: the classes
  and functions the tests call) are stand-ins there: calling one, or a method of what it returned, is a message to
  the runner, which runs the student's code and answers with the value. Plain data (numbers, strings, lists, tuples,
  dicts), bytes and tensors travel by value; the student's other objects stay in the runner and travel as handles.
* The referee hands the student's code an object of its own only when its class lists ``REMOTE_VIEW`` (the attributes
  the student may read); the runner sees those values and may call the object, nothing else of it.

The verdicts go to the grader from the referee only; a runner that sends the referee anything it did not ask for
(forged events, a reply to no question) has its notebook scored as tampered with.
"""
from __future__ import annotations

import base64
import builtins
import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from helpers.course import cell_runner
from helpers.course.cell_runner import CellTimeoutError, CpuLimitError, Runner

MAX_MESSAGE = 64 * 2**20  # bytes in one line (a step's logits for 64 sequences are 17 MB of base64)
MAX_DEPTH = 32  # nesting of a value that crosses the boundary
MESSAGE_CHARS = 2000  # of an exception's message that crosses the boundary
TENSOR_DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
PR_SET_DUMPABLE = 4
REFEREE_FAILED = 75  # the referee's own exit status when it fails; a runner's exit with it is reported as 1


class Tampered(Exception):
    """The runner sent something the protocol does not allow: the submission's code wrote to the referee's pipe."""


class RemoteError(RuntimeError):
    """The student's code raised an exception whose class the tests do not know; the message says which."""


class RunnerGone(Exception):
    """The runner's process ended (the student's code ended it, or it crashed)."""


# ---------------------------------------------------------------- the wire: one JSON object per line


class Link:
    """One end of the referee-runner pipe: requests, replies and the objects each side lends the other.

    ``side`` is "referee" or "runner". Each side keeps the objects it has lent (``lent``) by number; the other side
    holds stand-ins: the referee a ``Remote`` for each student object, the runner a ``View`` for each referee object.
    """

    def __init__(self, read_fd: int, write_fd: int, side: str, support: tuple[str, ...] = (), write=os.write):
        self.read_fd, self.buffer, self.scanned = read_fd, bytearray(), 0
        self.write_fd, self.side, self.support, self.write = write_fd, side, tuple(support), write
        self.lent: dict[int, object] = {}
        self.ids: dict[int, int] = {}  # id(object) -> its number in lent
        self.next_request = 0
        self.namespace: dict | None = None  # the runner's notebook namespace, where a name is looked up
        self.ended: dict | None = None  # the runner's report of a test cell that it ended before the referee did
        self.tampered = ""  # the first protocol breach seen, whatever the code that saw it did with the exception
        self.over = False  # (runner) the referee said the test cell is over while the student's code still called it

    # -- messages

    def send(self, message: dict) -> None:
        """One line, written whole: a time limit's signal waits until it is out (a half line would break the pipe)."""
        data = (json.dumps(message, allow_nan=True) + "\n").encode()
        view = memoryview(data)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM, signal.SIGXCPU})
        try:
            while view:
                view = view[self.write(self.write_fd, view):]
        except BrokenPipeError:
            raise RunnerGone("the notebook's process ended") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    def receive(self) -> dict:
        """The next line. Bytes read are kept until their line is whole, so a signal that interrupts a read loses none."""
        while (end := self.buffer.find(b"\n", self.scanned)) < 0:
            self.scanned = len(self.buffer)
            if self.scanned > MAX_MESSAGE:
                raise Tampered(f"sent a message longer than {MAX_MESSAGE} bytes")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RunnerGone("the notebook's process ended")
            self.buffer += chunk
        line = bytes(self.buffer[:end + 1])
        del self.buffer[:end + 1]
        self.scanned = 0
        try:
            message = json.loads(line)
        except ValueError:
            raise Tampered("sent a line that is not JSON to the referee") from None
        if not isinstance(message, dict):
            raise Tampered("sent the referee something other than a message")
        return message

    def request(self, message: dict):
        """Send a request and answer the other side's requests until its reply comes; the reply's value (or error).

        A Tampered raised here is also kept in ``tampered``: the test's code may catch exceptions, the referee still knows."""
        try:
            return self._request(message)
        except Tampered as error:
            self.tampered = self.tampered or str(error)
            raise

    def _request(self, message: dict):
        self.next_request += 1
        number = self.next_request
        self.send({**message, "id": number})
        while True:
            incoming = self.receive()
            if self.side == "runner" and incoming.get("op") == "over":
                self.over = True  # the referee gave up on the call that made this one (its time limit)
                raise RuntimeError("the test is over (its time limit): this call was not answered")
            if "event" in incoming and self.side == "referee" and incoming.get("event") == "end":
                self.ended = incoming  # the runner ended the cell on its own (a limit in its process)
                raise RemoteError("the notebook's process ended the test cell before the tests did (it hit a limit)")
            if "re" in incoming:
                if incoming["re"] != number:
                    raise Tampered(f"answered question {str(incoming['re'])[:20]}, which was not asked")
                if "error" in incoming:
                    raise self.error_from(incoming["error"])
                return self.unpack(incoming.get("value"))
            self.answer(incoming)

    def answer(self, message: dict) -> None:
        """Carry out one request of the other side and send the reply."""
        op, number = message.get("op"), message.get("id")
        if op not in ("call", "getattr") or not isinstance(number, int):
            raise Tampered(f"sent the referee a message it did not expect ({str(op)[:40]!r})")
        try:
            value = self.carry_out(op, message)
            reply = {"re": number, "value": self.pack(value)}
        except (CellTimeoutError, CpuLimitError, Tampered, RunnerGone):
            if self.side == "referee":
                raise  # the test's own limit, or the runner's fault: not an answer
            reply = {"re": number, "error": {"type": "RuntimeError", "message": "your code was interrupted at the test's time limit"}}
        except Exception as error:  # noqa: BLE001 - the caller's code gets the exception, as in one process
            reply = {"re": number, "error": self.error_to_wire(error)}
        except BaseException as error:  # noqa: BLE001 - SystemExit or KeyboardInterrupt in the student's code
            if self.side == "referee":
                raise
            reply = {"re": number, "error": self.error_to_wire(error)}
        self.send(reply)

    def carry_out(self, op: str, message: dict):
        if self.side == "referee":  # the runner may only call what the referee lent it
            if op != "call":
                raise Tampered("asked the referee for an attribute; the values it may read came with the object")
            target = self.own(message.get("ref"))
        elif "name" in message:
            name = str(message["name"])
            if name not in self.namespace:
                raise NameError(f"name {name!r} is not defined: run the cell that defines it before the tests")
            target = self.namespace[name]
        else:
            target = self.own(message.get("ref"))
        if op == "getattr":
            return getattr(target, str(message.get("attr")))
        args = self.unpack(message.get("args", {"list": []}))
        kwargs = self.unpack(message.get("kwargs", {"dict": []}))
        if not isinstance(args, list) or not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
            raise Tampered("sent call arguments of the wrong shape")
        return target(*args, **kwargs)

    def own(self, number):
        if not isinstance(number, int) or number not in self.lent:
            raise Tampered(f"named an object ({str(number)[:20]}) that was never lent to it")
        return self.lent[number]

    # -- values

    def lend(self, value) -> int:
        number = self.ids.get(id(value))
        if number is None or self.lent.get(number) is not value:
            number = len(self.lent) + 1
            self.lent[number], self.ids[id(value)] = value, number
        return number

    def pack(self, value, depth: int = 0):
        if depth > MAX_DEPTH:
            raise ValueError(f"a value nested more than {MAX_DEPTH} deep cannot cross to the tests' process")
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)
        if isinstance(value, float):
            return {"float": repr(float(value))}
        if isinstance(value, (list, tuple)):
            return {"list" if isinstance(value, list) else "tuple": [self.pack(v, depth + 1) for v in value]}
        if isinstance(value, dict):
            return {"dict": [[self.pack(k, depth + 1), self.pack(v, depth + 1)] for k, v in value.items()]}
        if isinstance(value, (bytes, bytearray)):
            return {"bytes": base64.b64encode(bytes(value)).decode()}
        torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")
        if torch is not None and isinstance(value, torch.Tensor):
            return _pack_tensor(value)
        if numpy is not None and isinstance(value, numpy.generic):  # a numpy scalar arrives as the Python number
            return self.pack(value.item(), depth + 1)
        if numpy is not None and isinstance(value, numpy.ndarray) and torch is not None:
            return {**_pack_tensor(torch.from_numpy(numpy.ascontiguousarray(value))), "numpy": True}
        if isinstance(value, Remote) and value._link is self:
            return {"yours": value._number}
        if isinstance(value, View) and value._link is self:
            return {"yours": value._number}
        if self.side == "runner":
            return {"handle": self.lend(value)}
        names = getattr(type(value), "REMOTE_VIEW", None)
        if names is None:
            raise TypeError(f"the tests cannot hand a {type(value).__name__} to your code across the process boundary")
        return {"view": self.lend(value), "type": type(value).__name__,
                "attrs": {name: self.pack(getattr(value, name), depth + 1) for name in names}}

    def unpack(self, data, depth: int = 0):
        if depth > MAX_DEPTH:
            raise Tampered("sent a value nested too deep")
        if data is None or isinstance(data, (bool, str, int)):
            return data
        if not isinstance(data, dict) or len(data) < 1:
            raise Tampered("sent a value the protocol does not have")
        if "float" in data:
            return float(data["float"])
        if "list" in data or "tuple" in data:
            items = data.get("list", data.get("tuple"))
            if not isinstance(items, list):
                raise Tampered("sent a list that is not one")
            values = [self.unpack(v, depth + 1) for v in items]
            return values if "list" in data else tuple(values)
        if "dict" in data:
            pairs = data["dict"]
            if not isinstance(pairs, list) or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
                raise Tampered("sent a dict that is not one")
            result = {}
            for key, value in pairs:
                key = self.unpack(key, depth + 1)
                try:
                    result[key] = self.unpack(value, depth + 1)
                except TypeError:
                    raise Tampered("sent a dict key that cannot be one") from None
            return result
        if "bytes" in data:
            return base64.b64decode(str(data["bytes"]), validate=True)
        if "tensor" in data:
            tensor = _unpack_tensor(data)
            return tensor.numpy() if data.get("numpy") is True else tensor
        if "yours" in data:
            return self.own(data["yours"])
        if "handle" in data and self.side == "referee":
            number = data["handle"]
            if not isinstance(number, int):
                raise Tampered("sent a handle that is not a number")
            return Remote(self, number)
        if "view" in data and self.side == "runner":
            attrs = {str(k): self.unpack(v, depth + 1) for k, v in data.get("attrs", {}).items()}
            return View(self, int(data["view"]), str(data.get("type", "object")), attrs)
        raise Tampered("sent a value the protocol does not have")

    # -- exceptions

    def error_to_wire(self, error: BaseException) -> dict:
        cls = type(error)
        name = cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        try:
            message = str(error)
        except Exception:  # noqa: BLE001 - a broken __str__ still reports the class
            message = ""
        return {"type": name[:200], "message": message[:MESSAGE_CHARS]}

    def error_from(self, wire) -> BaseException:
        """The exception to raise on this side: a builtin class, or a support module's, by name; else RemoteError."""
        if not isinstance(wire, dict):
            raise Tampered("sent an error that is not one")
        name, message = str(wire.get("type", "")), str(wire.get("message", ""))[:MESSAGE_CHARS]
        cls = _known_exception(name, self.support)
        if cls is None:
            return RemoteError(f"{name.rsplit('.', 1)[-1][:100]}: {message}" if name else message)
        try:
            return cls(message)
        except Exception:  # noqa: BLE001 - a class that needs other arguments
            return RemoteError(f"{cls.__name__}: {message}")


def _known_exception(name: str, support: tuple[str, ...]) -> type | None:
    if "." not in name:
        cls = getattr(builtins, name, None)
        ok = isinstance(cls, type) and issubclass(cls, Exception)
        return cls if ok else None
    module_name, _, qualname = name.partition(".")
    if module_name not in support or "." in qualname:
        return None
    cls = getattr(sys.modules.get(module_name), qualname, None)
    return cls if isinstance(cls, type) and issubclass(cls, Exception) else None


def _pack_tensor(tensor) -> dict:
    tensor = tensor.detach().cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.")
    if dtype not in TENSOR_DTYPES:
        raise TypeError(f"a tensor of dtype {dtype} cannot cross to the tests' process")
    data = tensor.reshape(-1).view(sys.modules["torch"].uint8).numpy().tobytes()
    return {"tensor": base64.b64encode(data).decode(), "dtype": dtype, "shape": list(tensor.shape)}


def _unpack_tensor(data: dict):
    import torch

    dtype, shape = data.get("dtype"), data.get("shape")
    if dtype not in TENSOR_DTYPES or not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise Tampered("sent a tensor the protocol does not have")
    raw = base64.b64decode(str(data["tensor"]), validate=True)
    element = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    count = 1
    for size in shape:
        count *= size
    if count * element != len(raw):
        raise Tampered("sent a tensor whose bytes do not match its shape")
    if not raw:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)


class Remote:
    """In the referee: the student's object (or a name of the notebook), in the runner's process."""

    __slots__ = ("_link", "_number", "_name")

    def __init__(self, link: Link, number: int | None = None, name: str | None = None):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_name", name)

    def _target(self) -> dict:
        return {"name": self._name} if self._name is not None else {"ref": self._number}

    def __call__(self, *args, **kwargs):
        link = self._link
        return link.request({"op": "call", **self._target(), "args": link.pack(list(args)), "kwargs": link.pack(kwargs)})

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        if self._name is not None:
            raise AttributeError(f"{self._name} is used by calling it")
        return self._link.request({"op": "getattr", "ref": self._number, "attr": attr})

    def __setattr__(self, attr, value):
        raise AttributeError("the tests cannot set attributes of your objects")

    def __repr__(self) -> str:
        return f"<your {self._name}>" if self._name else f"<your object #{self._number}>"


class View:
    """In the runner: an object of the tests (the model an engine runs on), seen through its class's REMOTE_VIEW."""

    def __init__(self, link: Link, number: int, kind: str, attrs: dict):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_number", number)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_attrs", attrs)

    def __getattr__(self, attr: str):
        attrs = object.__getattribute__(self, "_attrs")
        if attr in attrs:
            return attrs[attr]
        raise AttributeError(f"the {self._kind} your code is given has only {', '.join(sorted(attrs))} and can be "
                             f"called; it has no {attr!r}")

    def __call__(self, *args, **kwargs):
        link = self._link
        return link.request({"op": "call", "ref": self._number, "args": link.pack(list(args)), "kwargs": link.pack(kwargs)})

    def __repr__(self) -> str:
        return f"<the tests' {self._kind}>"


# ---------------------------------------------------------------- the runner's side


def serve_cell(link: Link, namespace: dict) -> None:
    """In the runner, for a test cell the referee runs: answer its requests until it says the cell is over."""
    link.namespace, link.over = namespace, False
    while not link.over:
        message = link.receive()
        if message.get("op") == "over":
            return
        if "re" not in message:  # an answer to a call the referee abandoned at its time limit is dropped
            link.answer(message)


# ---------------------------------------------------------------- the referee's side


class Referee(Runner):
    """Runs the test cells itself and relays the other cells' reports from the runner (its child)."""

    def __init__(self, job: dict, channel: int, grader_in: int):
        super().__init__(job, channel, grader_in)  # imports the support modules: before the runner exists
        self.link: Link | None = None
        self.child = 0

    def attach(self, link: Link, child: int) -> None:
        """The runner is started: the declared names become stand-ins that call into it."""
        self.link, self.child = link, child
        for name in self.job["referee"]["names"]:
            self.main.__dict__[name] = Remote(link, name=name)

    def run(self) -> None:
        try:
            for cell in self.job["cells"]:
                index = cell["index"]
                self.expect_event("start", index)
                self.send(event="start", cell=index)
                if cell["role"] == "test":
                    outcome = self.run_cell(cell)
                    if self.link.tampered:
                        raise Tampered(self.link.tampered)
                    theirs = self.finish_test(index)
                    outcome = _with_runners_writes(outcome, theirs)
                elif cell["role"] == "instructor":
                    own = self.run_cell(cell)
                    theirs = self.expect_event("end", index)
                    outcome = own if own.get("error") else theirs
                else:
                    outcome = self.expect_event("end", index)
                self.send_message({**outcome, "event": "end", "cell": index})  # the runner's keys are data, never arguments
            done = self.expect_event("done", None)
            self.send(event="done", listening=done.get("listening", []))  # the sandbox bounds and checks it
        except Tampered as error:
            self.send(event="tampered", reason=str(error)[:300])
            _stop(self.child)
        except RunnerGone:
            _exit_as_child(self.child)

    def expect_event(self, kind: str, index) -> dict:
        message = self.link.receive()
        if message.get("event") != kind or message.get("cell") != index:
            raise Tampered(f"sent {str(message.get('event'))[:40]!r} for cell {str(message.get('cell'))[:20]} where the "
                           f"referee waited for {kind!r}" + (f" of cell {index}" if index is not None else ""))
        return message

    def finish_test(self, index: int) -> dict:
        """Tell the runner the test is over and read its report; a runner still busy gets interrupted first."""
        if self.link.ended is not None:
            ended, self.link.ended = self.link.ended, None
            if ended.get("cell") != index:
                raise Tampered(f"ended cell {str(ended.get('cell'))[:20]} while the tests of cell {index} ran")
            return ended
        self.link.send({"op": "over"})
        grace = cell_runner.cell_slack_s(float(self.limits["cell_s"])) / 3  # then the student's code is interrupted
        signal.signal(signal.SIGALRM, _on_grace)
        signal.setitimer(signal.ITIMER_REAL, grace)
        try:
            while True:
                try:
                    message = self.link.receive()
                except _Grace:
                    os.kill(self.child, signal.SIGALRM)  # the runner's handler raises its time limit in the student's code
                    signal.setitimer(signal.ITIMER_REAL, grace)
                    continue
                if "re" in message:
                    continue  # the answer to a question the time limit abandoned
                if "op" in message:
                    self.link.send({"re": message.get("id"), "error": {"type": "RuntimeError", "message": "the test is over"}})
                    continue
                if message.get("event") == "end" and message.get("cell") == index:
                    return message
                raise Tampered(f"sent {str(message.get('event'))[:40]!r} while the referee waited for the end of cell {index}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


class _Grace(Exception):
    pass


def _on_grace(signum, frame):
    raise _Grace()


def _with_runners_writes(outcome: dict, theirs: dict) -> dict:
    """The test cell's report: the referee's, plus what the student's code wrote to stderr and the warnings it raised
    while the test drove it (nbgrader's rule: a write to stderr fails the test; a warning is a note)."""
    stderr = str(theirs.get("stderr", ""))
    if stderr:
        outcome = {**outcome, "stderr": (outcome.get("stderr", "") + stderr)[:64 * 2**10]}
    warnings = theirs.get("warnings")
    if isinstance(warnings, list) and warnings:
        outcome = {**outcome, "warnings": (outcome.get("warnings", []) + warnings)[:cell_runner.MAX_WARNINGS],
                   "warnings_raised": outcome.get("warnings_raised", 0) + int(theirs.get("warnings_raised", len(warnings)))}
    return outcome


def _stop(child: int) -> None:
    try:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def _exit_as_child(child: int) -> None:
    """The runner ended: the referee ends with its exit status, as the grader would have seen it without a referee."""
    try:
        _, status = os.waitpid(child, 0)
    except ChildProcessError:
        os._exit(0)
    code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    os._exit(1 if code == REFEREE_FAILED else code)


def runner_job(job: dict) -> dict:
    """The runner's job: the same cells, test cells served for the referee (no hidden part), the files already copied."""
    cells = [{**{k: v for k, v in c.items() if k != "hidden"}, "role": "serve" if c["role"] == "test" else c["role"]}
             for c in job["cells"]]
    return {**{k: v for k, v in job.items() if k != "referee"}, "cells": cells, "input": "/nonexistent/referee-copied-it"}


def _not_dumpable() -> None:
    """Other processes of this user (the runner) can neither trace this one nor read its memory or descriptors."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE) failed")


def _start_runner(log: int) -> tuple[int, int, int]:
    """Fork and exec the runner with pipes to the referee on its stdin and stdout; (pid, to runner, from runner)."""
    to_runner_r, to_runner_w = os.pipe()
    from_runner_r, from_runner_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.dup2(to_runner_r, 0)
            os.dup2(from_runner_w, 1)
            os.dup2(log, 2)
            os.closerange(3, 1 << 16)
            os.execv(sys.executable, [sys.executable, "-c", cell_runner.COMMAND])
        finally:
            os._exit(71)
    os.close(to_runner_r)
    os.close(from_runner_w)
    for fd in (to_runner_w, from_runner_r):
        os.set_inheritable(fd, False)
    return pid, to_runner_w, from_runner_r


def main() -> None:
    """Entry point inside the sandbox, in place of the runner's: job on stdin, events on the original stdout."""
    grader_in, channel, log = os.dup(0), os.dup(1), os.dup(2)
    for fd in (grader_in, channel, log):
        os.set_inheritable(fd, False)
    try:
        job = cell_runner.read_job(grader_in)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        Path(os.environ.get("HOME", "/tmp/home")).mkdir(parents=True, exist_ok=True)
        cell_runner.copy_input(Path(job.get("input", cell_runner.INPUT)), Path(job["workdir"]))
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        referee = Referee(job, channel, grader_in)
        cwd = os.getcwd()
        sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]  # nothing the runner can write is importable here
        _not_dumpable()
        child, to_runner, from_runner = _start_runner(log)
        link = Link(from_runner, to_runner, "referee", tuple(job.get("support_modules", ())))
        link.send(runner_job(job))
        referee.attach(link, child)
        spill = os.open(os.devnull, os.O_WRONLY)
        os.dup2(spill, 1)
        os.dup2(spill, 2)
        sys.__stdout__ = sys.__stderr__ = open(1, "w", buffering=1, closefd=False)
        referee.run()
    except BaseException:  # noqa: BLE001 - the referee's own failure goes to the grader's log
        import traceback

        os.write(log, traceback.format_exc().encode())
        os._exit(REFEREE_FAILED)  # the grader's failure, not the student's (helpers.course.autograde.grader_fault)
    os._exit(0)
