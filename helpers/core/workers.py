"""Run a function on N worker processes that share a real torch.distributed process group, and collect the results.

``launch(fn, world_size)`` is what a notebook cell or a test calls instead of ``torchrun``:

* ``fn`` may be defined in the notebook itself: it travels to the workers by value (cloudpickle), so the
  workers need not import it, which ``spawn``-style start methods otherwise require;
* workers are forked from a clean ``forkserver`` process that has already imported torch, so a launch
  costs a fork, not an interpreter start, and never forks a multi-threaded Jupyter kernel;
* the rendezvous port is chosen by the operating system (the parent's TCPStore binds port 0): no race;
* a worker's exception comes back with its rank and traceback, a hung run ends at ``timeout``, and no
  worker outlives the call: not after success, failure, timeout or Ctrl-C, nor after the parent is killed.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
import socket
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Sequence

import cloudpickle
import psutil
import torch
import torch.distributed as dist

from helpers.core.procs import available_cores, redirect_output  # noqa: F401  (available_cores re-exported)
from helpers.core.torch_adapters.dispatch import FIRST_USE_IMPORTS

HOST = "127.0.0.1"
# What the forkserver imports before it forks workers. Nothing here may initialise CUDA: a child forked
# from a process that did cannot use the GPU ("Cannot re-initialize CUDA in forked subprocess").
# (torch.utils.benchmark, for one, asks the CUDA driver for a device count at import time.)
# FIRST_USE_IMPORTS (torch's compiler front end): torch imports it on the first operation under a dispatch mode (count_traffic, FlopCounterMode),
# seconds per worker otherwise.
_PRELOAD = ["torch", "torch.distributed", FIRST_USE_IMPORTS, "helpers.core.workers"]


class WorkerError(RuntimeError):
    """A worker raised: ``rank``, the exception's type name, its message and the worker's ``traceback``."""

    def __init__(self, rank: int, world_size: int, exc_type: str, message: str, worker_traceback: str, output: str = ""):
        self.rank, self.world_size, self.exc_type, self.message = rank, world_size, exc_type, message
        self.traceback, self.output = worker_traceback, output
        text = f"rank {rank} of {world_size} raised {exc_type}: {message}\n\n--- traceback in rank {rank} ---\n{worker_traceback.rstrip()}"
        if output.strip():
            text += f"\n--- output of rank {rank} (last lines) ---\n{_tail(output)}"
        super().__init__(text)


class WorkerTimeout(TimeoutError):
    """The run did not finish within ``timeout`` seconds; ``unfinished`` lists the ranks still running."""

    def __init__(self, timeout: float, unfinished: Sequence[int], outputs: dict[int, str]):
        self.timeout, self.unfinished = timeout, list(unfinished)
        lines = [f"ranks {self.unfinished} did not finish within {timeout:g} s; all workers were stopped. "
                 "A collective that some rank never reaches (or a send without a matching recv) hangs like this; "
                 "raise `timeout=` only if the work is simply slow."]
        lines += [f"--- output of rank {r} (last lines) ---\n{_tail(outputs[r])}" for r in self.unfinished if outputs.get(r, "").strip()]
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class RankPlan:
    """Where the ranks of one group run: the process-group ``backend`` and each rank's ``devices``, and why."""

    backend: str
    devices: tuple[str, ...]
    reason: str

    def device(self, rank: int) -> torch.device:
        return torch.device(self.devices[rank])


def plan_ranks(world_size: int, gpus: int | None = None) -> RankPlan:
    """NCCL with one GPU per rank when there are at least ``world_size`` GPUs, otherwise gloo on the CPU.

    ``gpus`` defaults to the visible CUDA devices (counted through NVML where torch can, so that the
    caller's CUDA state is left untouched). Two ranks never share a GPU: NCCL refuses it, and a demo
    that silently time-shared one card would teach the wrong speed-up.
    """
    if gpus is None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= world_size and dist.is_nccl_available():
        return RankPlan("cpu:gloo,cuda:nccl", tuple(f"cuda:{r}" for r in range(world_size)),
                        f"{world_size} ranks on NCCL, one GPU each ({gpus} visible)")
    why = "no GPU" if gpus == 0 else f"{gpus} GPU{'s' if gpus > 1 else ''} for {world_size} ranks"
    if gpus and not dist.is_nccl_available():
        why = "this torch build has no NCCL"
    return RankPlan("gloo", ("cpu",) * world_size, f"{world_size} ranks on gloo, CPU tensors ({why})")


def default_backend(world_size: int) -> str:
    """The process-group backend ``plan_ranks`` chooses for ``world_size`` ranks on this machine."""
    return plan_ranks(world_size).backend


def default_threads(world_size: int) -> int:
    """torch threads per worker: the cores shared out between the workers, at least one each."""
    return max(1, available_cores() // world_size)


def loopback_store(timeout: float, port: int = 0) -> dist.TCPStore:
    """A TCPStore server listening on 127.0.0.1 only, at ``port`` (0: a port the operating system picks).

    A TCPStore server alone listens on every interface, whatever host it is given; here the socket is bound to the
    loopback address first and handed over (``master_listen_fd``; the store then owns and closes it).
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.bind((HOST, port))
        listener.listen(128)
        store = dist.TCPStore(HOST, listener.getsockname()[1], None, True, timeout=timedelta(seconds=timeout),
                              wait_for_workers=False, master_listen_fd=listener.fileno(), use_libuv=True)
    except BaseException:
        listener.close()
        raise
    listener.detach()
    return store


def launch(
    fn: Callable[..., Any],
    world_size: int = 2,
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    backend: str | None = None,
    timeout: float = 60.0,
    threads: int | None = None,
    echo: bool = True,
    start_method: str | None = None,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` workers in one process group; return the results by rank.

    Inside ``fn``, ``torch.distributed`` is initialised: use ``dist.get_rank()``, ``dist.all_reduce`` and so on.
    Worker output is printed afterwards, each line prefixed with its rank (``echo=False`` keeps it quiet).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    if backend is None:
        plan = plan_ranks(world_size)
        backend = plan.backend
        if echo and torch.cuda.is_available():  # on a GPU box, say whether the ranks got GPUs
            print(f"launch: {plan.reason}")
    elif "nccl" in backend and (torch.cuda.device_count() if torch.cuda.is_available() else 0) < world_size:
        raise ValueError(f"backend {backend!r} needs one GPU per rank: {world_size} ranks, "
                         f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} GPUs visible. "
                         "Leave backend=None to fall back to gloo on the CPU, or launch fewer ranks.")
    threads = threads or default_threads(world_size)
    payload = _pickle_by_value(fn, tuple(args), dict(kwargs or {}))
    context = worker_context(start_method)
    store = loopback_store(timeout)
    logs = Path(tempfile.mkdtemp(prefix="edl-launch-"))
    procs: list[mp.process.BaseProcess] = []
    conns = []
    try:
        for rank in range(world_size):
            receiver, sender = context.Pipe(duplex=False)
            spec = _WorkerSpec(payload, rank, world_size, store.port, backend, threads, timeout, str(logs / f"rank{rank}.log"), os.getpid())
            proc = context.Process(target=_worker_main, args=(spec, sender), name=f"edl-worker-{rank}", daemon=True)
            proc.start()
            sender.close()
            procs.append(proc)
            conns.append(receiver)
        results = _collect(procs, conns, world_size, timeout, logs)
    finally:
        _stop(procs)
        for conn in conns:
            conn.close()
        outputs = _read_logs(logs, world_size)
        shutil.rmtree(logs, ignore_errors=True)
        del store
        if echo:
            _echo(outputs)
    return results


# ---------------------------------------------------------------- parent side


def _pickle_by_value(fn: Callable, args: tuple, kwargs: dict) -> bytes:
    """cloudpickle the call, so that notebook-defined functions (module ``__main__``) reach the workers."""
    if not callable(fn):
        raise TypeError(f"launch() needs a function to run on each worker, got {type(fn).__name__}")
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as err:  # noqa: BLE001 - say what could not be sent, whatever pickle raised
        raise TypeError(
            f"could not send {getattr(fn, '__name__', fn)!r} and its arguments to the workers ({type(err).__name__}: {err}). "
            "Pass tensors, numbers and plain objects; create open files, locks or sockets inside the worker function."
        ) from err


def worker_context(start_method: str | None = None) -> mp.context.BaseContext:
    """A multiprocessing context for worker processes: forkserver preloaded with torch where the OS has one, else spawn.

    Children fork from a clean, single-threaded server that has already imported torch: quick to start,
    and never a fork of a multi-threaded notebook kernel. Use it for process pools and DataLoaders too.
    """
    method = start_method or ("forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn")
    if method == "fork":
        raise ValueError("workers are never forked from the caller: once the caller has used CUDA (a notebook kernel "
                         "always has), a forked child cannot. Use 'forkserver' or 'spawn'.")
    # torch.cuda.is_available() then counts devices through NVML instead of initialising the CUDA driver,
    # in this process and in the forkserver it starts, so a later fork stays usable.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    context = mp.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(_PRELOAD)
    return context


def _collect(procs, conns, world_size: int, timeout: float, logs: Path) -> list[Any]:
    """Wait for every rank's message; raise the first failure, or WorkerTimeout at the deadline."""
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout
    while len(results) < world_size:
        pending = [r for r in range(world_size) if r not in results]
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerTimeout(timeout, pending, _read_logs(logs, world_size))
        ready = wait([conns[r] for r in pending] + [procs[r].sentinel for r in pending], timeout=remaining)
        for rank in pending:
            if conns[rank] in ready or (procs[rank].sentinel in ready and conns[rank].poll()):
                try:
                    results[rank] = _receive(conns[rank], procs[rank], rank, world_size, logs)
                except WorkerError as failure:
                    died = _silent_death_among(procs, conns, [r for r in pending if r != rank], world_size, logs)
                    if died is None:
                        raise
                    died.add_note(f"meanwhile rank {failure.rank} raised {failure.exc_type}: {failure.message}")
                    raise died from None
            elif procs[rank].sentinel in ready:
                raise _died(procs[rank], rank, world_size, logs)
    return [results[r] for r in range(world_size)]


SILENT_DEATH_GRACE = 2.0  # seconds a reported failure waits for a peer's death without a traceback, its likely cause


def _silent_death_among(procs, conns, ranks: list[int], world_size: int, logs: Path) -> WorkerError | None:
    """A rank of ``ranks`` that died without a word within SILENT_DEATH_GRACE seconds, else None. Once one process is
    gone, a collective fails in every other rank ("Connection reset by peer"), often before the parent sees the death:
    the death is what to report."""
    ready = wait([procs[r].sentinel for r in ranks], timeout=SILENT_DEATH_GRACE) if ranks else []
    for rank in ranks:
        if procs[rank].sentinel in ready:
            try:
                _receive(conns[rank], procs[rank], rank, world_size, logs)
            except WorkerError as error:
                if error.exc_type == "WorkerDied":
                    return error
    return None


def _died(proc, rank: int, world_size: int, logs: Path) -> WorkerError:
    proc.join(5)
    return WorkerError(rank, world_size, "WorkerDied", f"the process exited with code {proc.exitcode} before returning a result",
                       "(no Python traceback: the process was killed or crashed)", _read_log(logs, rank))


def _receive(conn, proc, rank: int, world_size: int, logs: Path) -> Any:
    """Unpack one worker's message: its result, or its failure raised here as WorkerError."""
    try:
        status, body = pickle.loads(conn.recv_bytes())
    except EOFError:
        raise _died(proc, rank, world_size, logs) from None
    if status == "ok":
        return cloudpickle.loads(body)
    exc_type, message, worker_traceback, original = body
    error = WorkerError(rank, world_size, exc_type, message, worker_traceback, _read_log(logs, rank))
    error.exception = _unpickle_or_none(original)
    raise error from error.exception


def _unpickle_or_none(blob: bytes | None) -> BaseException | None:
    try:
        return pickle.loads(blob) if blob else None
    except Exception:  # noqa: BLE001 - an exception class the parent cannot rebuild is reported by name only
        return None


def _stop(procs: Sequence[mp.process.BaseProcess], grace: float = 1.0, settle: float = 0.3) -> None:
    """Let finished workers exit by themselves, terminate the rest, kill those that ignore it, and reap them all."""
    deadline = time.monotonic() + settle
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + grace
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()


def _read_log(logs: Path, rank: int) -> str:
    try:
        return (logs / f"rank{rank}.log").read_text(errors="replace")
    except OSError:
        return ""


def _read_logs(logs: Path, world_size: int) -> dict[int, str]:
    return {rank: _read_log(logs, rank) for rank in range(world_size)}


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _echo(outputs: dict[int, str]) -> None:
    for rank, text in outputs.items():
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


# ---------------------------------------------------------------- worker side


class _WorkerSpec:
    """Everything a worker needs, in one picklable object."""

    def __init__(self, payload, rank, world_size, port, backend, threads, timeout, log_path, launcher_pid):
        self.payload, self.rank, self.world_size, self.port = payload, rank, world_size, port
        self.backend, self.threads, self.timeout = backend, threads, timeout
        self.log_path, self.launcher_pid = log_path, launcher_pid


def _worker_main(spec: _WorkerSpec, conn) -> None:
    """Entry point of a worker process: join the group, run the function, send back its result or failure."""
    _exit_when_orphaned(spec.launcher_pid)
    redirect_output(spec.log_path)
    torch.set_num_threads(spec.threads)
    if "GLOO_SOCKET_IFNAME" not in os.environ and (loopback := loopback_interface()):
        os.environ["GLOO_SOCKET_IFNAME"] = loopback  # one machine: talk over loopback, whatever the hostname resolves to
    try:
        fn, args, kwargs = cloudpickle.loads(spec.payload)
        _join_group(spec)
        result = fn(*args, **kwargs)
        dist.barrier()  # nobody tears down while a peer still reads from it
        message = ("ok", cloudpickle.dumps(result))
    except BaseException as err:  # noqa: BLE001 - everything, KeyboardInterrupt included, goes back to the parent
        message = ("error", (type(err).__name__, str(err), traceback.format_exc(), _pickle_or_none(err)))
    sys.stdout.flush()
    sys.stderr.flush()
    conn.send_bytes(pickle.dumps(message))
    conn.close()
    if message[0] == "ok" and dist.is_initialized():
        dist.destroy_process_group()


def _join_group(spec: _WorkerSpec) -> None:
    store = dist.TCPStore(HOST, spec.port, None, False, timeout=timedelta(seconds=spec.timeout))
    if "nccl" in spec.backend:
        torch.cuda.set_device(spec.rank)  # plan_ranks gave every rank its own GPU
    dist.init_process_group(spec.backend, store=store, rank=spec.rank, world_size=spec.world_size, timeout=timedelta(seconds=spec.timeout))


def _pickle_or_none(err: BaseException) -> bytes | None:
    try:
        return pickle.dumps(err)
    except Exception:  # noqa: BLE001
        return None


def _exit_when_orphaned(launcher_pid: int, poll_s: float = 0.2) -> None:
    """Exit as soon as the launching process is gone, even if it was killed outright.

    The launcher's pid is watched directly: a forkserver child's parent is the forkserver, and the
    forkserver itself stays alive for as long as any of its children do.
    """
    try:
        launcher = psutil.Process(launcher_pid)
    except psutil.NoSuchProcess:
        os._exit(70)

    def gone() -> bool:
        try:
            return not launcher.is_running() or launcher.status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    def watch() -> None:
        while not gone():
            time.sleep(poll_s)
        os._exit(70)

    threading.Thread(target=watch, name="edl-orphan-watch", daemon=True).start()


def loopback_interface() -> str | None:
    """The name of the network interface holding 127.0.0.1 ('lo' on Linux, 'lo0' on macOS)."""
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == HOST for a in addresses):
            return name
    return None
