"""Processes, threads and the GIL, measured: what Lecture 2 shows about running Python work in parallel.

* ``start_costs``: how long it takes to start a thread, a forkserver process and a spawned process;
* ``gil_demo``: the same tasks run serially, on threads and on processes, for each workload a cell wrote
  (pure-Python work holds the GIL, torch kernels release it);
* ``shared_memory_demo``: handing a tensor to another process through shared memory vs by copying it;
* ``dataloader_demo``: a cell's data set (with Python-heavy decoding) read by a DataLoader with 0 workers, by
  threads, and by worker processes.

Functions and data sets written in a notebook reach the worker processes by value (``by_value``, cloudpickle).
"""
from __future__ import annotations

import multiprocessing as mp
import pickle
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import cloudpickle
import torch
from torch.utils.data import DataLoader, Dataset

from helpers.core import load, plots
from helpers.core.device import cpu_threads
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.workers import available_cores, worker_context

# ---------------------------------------------------------------- starting a thread or a process


@dataclass
class StartCost:
    what: str = column("started")
    seconds: float = column("time", format_seconds)


class StartCosts(Report):
    title = "Time to start a thread or a process that does nothing and ends"


def _nothing() -> None:
    return None


def start_costs(include_spawn: bool = True) -> StartCosts:
    """Start and join one thread, forkserver processes and (optionally) one spawned process; time each.

    A child runs its target only after importing the target's module. The forkserver rows differ in that alone:
    ``torch.get_num_threads`` lives in torch, which the server imported before forking; this module's ``_nothing``
    does not, so every child forked for it first imports this module and all it imports.
    """
    def timed(start: Callable[[], None]) -> float:
        begin = time.perf_counter()
        start()
        return time.perf_counter() - begin

    def thread() -> None:
        t = threading.Thread(target=_nothing)
        t.start()
        t.join()

    def process(method: str, target: Callable[[], Any] = torch.get_num_threads) -> Callable[[], None]:
        def run() -> None:
            # the launcher never forks (see worker_context); fork is timed here with a child that touches nothing
            context = mp.get_context("fork") if method == "fork" else worker_context(method)
            p = context.Process(target=target)
            p.start()
            p.join()
        return run

    rows = [StartCost("thread", min(timed(thread) for _ in range(5)))]
    notes = ["Each row: start, then wait for the end; the best of a few tries (spawn: one try)."]
    if "forkserver" in __import__("multiprocessing").get_all_start_methods():
        timed(process("forkserver"))  # the first call starts the server itself (it imports torch once)
        rows.append(StartCost("process (fork from a server that imported torch)", min(timed(process("forkserver")) for _ in range(3))))
        rows.append(StartCost(f"the same, target from a module the server did not import ({__name__})",
                              min(timed(process("forkserver", _nothing)) for _ in range(3))))
        notes.append(f"Target: torch.get_num_threads (torch is already imported in the server); in the second forkserver row, {__name__}._nothing: "
                     "each child first imports that module, and what it imports. Workers start fast only when their code is preloaded or sent by value.")
    if include_spawn:
        rows.append(StartCost("process (spawn: a new interpreter imports torch)", timed(process("spawn"))))
    return StartCosts(rows, notes)


# ---------------------------------------------------------------- the GIL


class _ByValue:
    """Pickles as the object itself, by value: a notebook's function or data set unpickles in another process."""

    def __init__(self, obj: Any):
        self.obj = obj

    def __call__(self, *args):
        return self.obj(*args)

    def __reduce__(self):
        return cloudpickle.loads, (cloudpickle.dumps(self.obj),)


@dataclass
class GilRun:
    work: str = column("work")
    method: str = column("method")
    tasks: int = column("tasks")
    seconds: float = column("fastest", format_seconds)
    slowest: float = column("slowest", format_seconds)
    speedup: float = column("speedup vs serial", ".2f")


class GilDemo(Report):
    """The same tasks serially, on threads and on processes: only processes escape the GIL for Python code."""

    title = "Threads vs processes on Python work and on torch work"

    def plot(self, ax=None):
        works = list(dict.fromkeys(r.work for r in self.rows))
        methods = list(dict.fromkeys(r.method for r in self.rows))
        groups = {m: [self.find(work=w, method=m).speedup for w in works] for m in methods}
        ax = plots.grouped_bars(works, groups, ax, title="Speedup over running the tasks one after another", ylabel="speedup (x)")
        plots.horizontal_line(ax, 1.0, "serial")
        return ax


def _run_serial(fn, args, tasks: int) -> float:
    start = time.perf_counter()
    for _ in range(tasks):
        fn(*args)
    return time.perf_counter() - start


def _run_pool(pool, fn, args, tasks: int) -> float:
    start = time.perf_counter()
    list(pool.map(fn, *[[a] * tasks for a in args]))
    return time.perf_counter() - start


def gil_demo(workloads: dict[str, tuple[Callable, tuple]], tasks: int | None = None, repeats: int = 3) -> GilDemo:
    """Run ``tasks`` equal tasks (default: one per core) serially, on threads and on processes, for each ``{name: (fn, args)}``.

    torch gets one intra-op thread in every thread and process, so that only the pool provides parallelism (each pool
    thread is given it: ``torch.set_num_threads`` holds only in the thread that calls it). The three
    ways take turns ``repeats`` times; each row gives the fastest and the slowest time, the speedup from the fastest.
    """
    tasks = tasks or max(2, available_cores())
    rows = []
    with cpu_threads(1), load.OtherLoad() as other:
        with ThreadPoolExecutor(tasks, initializer=load.keep_torch_threads) as threads, \
                ProcessPoolExecutor(tasks, mp_context=worker_context(), initializer=torch.set_num_threads, initargs=(1,)) as processes:
            list(processes.map(_nothing_arg, range(tasks)))  # start the processes before timing
            for name, (fn, args) in workloads.items():
                fn(*args)  # warm-up
                ways = {"serial (one thread)": lambda fn=fn, args=args: _run_serial(fn, args, tasks),
                        f"{tasks} threads": lambda fn=fn, args=args: _run_pool(threads, fn, args, tasks),
                        f"{tasks} processes": lambda fn=fn, args=args: _run_pool(processes, _ByValue(fn), args, tasks)}
                times: dict[str, list[float]] = {method: [] for method in ways}
                for _ in range(repeats):
                    for method, run in ways.items():  # the ways take turns: a busy moment of the machine hits them alike
                        times[method].append(run())
                serial = min(times["serial (one thread)"])
                rows += [GilRun(name, method, tasks, min(t), max(t), serial / min(t)) for method, t in times.items()]
    load.record(other.cores)
    return GilDemo(rows, [f"{available_cores()} CPU cores here; the ideal speedup with {tasks} tasks is {min(tasks, available_cores())}x.",
                          f"Each way ran {repeats} times, taking turns; the speedup compares fastest times."])


def _nothing_arg(_):
    return None


# ---------------------------------------------------------------- shared memory between processes


def _tensor_server(conn) -> None:
    """Child process: receive tensors two ways, add one to every element in place, and acknowledge."""
    while True:
        kind, payload = conn.recv()
        if kind == "stop":
            return
        tensor = pickle.loads(payload) if kind == "copy" else payload
        tensor.add_(1)
        conn.send(float(tensor[0]))


@dataclass
class HandOff:
    method: str = column("method")
    tensor_bytes: int = column("tensor", format_bytes)
    pickled_bytes: int = column("bytes through the pipe", format_bytes)
    seconds: float = column("round trip, fastest", format_seconds)
    slowest: float = column("slowest", format_seconds)
    parent_sees_change: bool = column("parent sees the child's in-place add")


class SharedMemoryDemo(Report):
    title = "Handing a tensor to another process: a shared-memory handle vs a copy"


def shared_memory_demo(mib: int = 64, repeats: int = 3) -> SharedMemoryDemo:
    """Send a ``mib`` MiB tensor to a child that adds 1 in place: by copying its bytes, and through shared memory.

    The two ways take turns ``repeats`` times; each row gives the fastest and the slowest round trip.
    """
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the reductions that pass tensors as shared-memory handles)

    context = worker_context()
    parent_end, child_end = context.Pipe()
    child = context.Process(target=_tensor_server, args=(child_end,), daemon=True)
    child.start()
    methods = ("copy (pickle the data)", "shared memory (torch.multiprocessing)")
    times: dict[str, list[float]] = {method: [] for method in methods}
    seen: dict[str, tuple[int, bool]] = {}
    try:
        with load.OtherLoad() as other:
            for _ in range(repeats):
                for method in methods:  # the two ways take turns: a busy moment of the machine hits both alike
                    tensor = torch.zeros(mib * 2**20 // 4)
                    if method.startswith("shared"):
                        tensor.share_memory_()
                        sent = bytes(ForkingPickler.dumps(tensor))  # what actually travels: a handle, not the data
                        message = ("shared", tensor)
                    else:
                        sent = pickle.dumps(tensor)
                        message = ("copy", sent)
                    start = time.perf_counter()
                    parent_end.send(message)
                    parent_end.recv()
                    times[method].append(time.perf_counter() - start)
                    seen[method] = (len(sent), bool(tensor[0] == 1))
        load.record(other.cores)
        parent_end.send(("stop", None))
        child.join(10)
    finally:
        if child.is_alive():
            child.kill()
            child.join()
    rows = [HandOff(method, mib * 2**20, seen[method][0], min(times[method]), max(times[method]), seen[method][1]) for method in methods]
    return SharedMemoryDemo(rows, ["Shared memory sends a file-descriptor handle; both processes then map the same pages.",
                                   f"{repeats} round trips each, taking turns."])


# ---------------------------------------------------------------- why data loaders are processes


class _PortableDataset(Dataset):
    """A data set that reaches DataLoader worker processes by value, even when a notebook defined its class."""

    def __init__(self, dataset: Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return self.dataset[index]

    def __reduce__(self):
        return cloudpickle.loads, (cloudpickle.dumps(self.dataset),)


@dataclass
class LoaderRun:
    loader: str = column("loader")
    seconds: float = column("one epoch, fastest", format_seconds)
    slowest: float = column("slowest", format_seconds)
    items_per_s: float = column("items/s", ",.0f")
    speedup: float = column("speedup", ".2f")
    items: int = column("items per epoch", ",d")  # counted in the batches the loader gave


class LoaderDemo(Report):
    title = "Reading a data set with Python-heavy decoding"

    def plot(self, ax=None):
        return plots.grouped_bars([r.loader for r in self.rows], {"items/s": [r.items_per_s for r in self.rows]}, ax,
                                  title=self.title, ylabel="items per second")


class _ThreadedLoader:
    """Batches whose items are decoded by a pool of threads (what a loader built on threads would do)."""

    def __init__(self, dataset: Dataset, batch_size: int, threads: int):
        self.dataset, self.batch_size, self.pool = dataset, batch_size, ThreadPoolExecutor(threads, initializer=load.keep_torch_threads)

    def __iter__(self):
        for start in range(0, len(self.dataset), self.batch_size):
            indices = range(start, min(start + self.batch_size, len(self.dataset)))
            yield torch.stack(list(self.pool.map(self.dataset.__getitem__, indices)))


def _epoch(loader) -> tuple[float, int]:
    """One pass over ``loader``: its seconds and the items its batches held."""
    start, items = time.perf_counter(), 0
    for batch in loader:
        items += len(batch)
    return time.perf_counter() - start, items


def dataloader_demo(dataset: Dataset, batch_size: int = 32, workers: int | None = None, repeats: int = 3) -> LoaderDemo:
    """Epochs of a map-style ``dataset`` through DataLoader(num_workers=0), a thread pool, and DataLoader(num_workers=N),
    taking turns ``repeats`` times; each row gives the fastest and the slowest epoch, the speedup from the fastest."""
    workers = workers or max(2, available_cores())
    length = len(dataset)
    threaded = _ThreadedLoader(dataset, batch_size, workers)
    processes_loader = DataLoader(_PortableDataset(dataset), batch_size=batch_size, num_workers=workers, persistent_workers=True,
                                  multiprocessing_context=worker_context())
    loaders = {"DataLoader, num_workers=0": DataLoader(dataset, batch_size=batch_size), f"{workers} threads": threaded,
               f"DataLoader, num_workers={workers} (processes)": processes_loader}
    times: dict[str, list[float]] = {name: [] for name in loaders}
    items: dict[str, set[int]] = {name: set() for name in loaders}
    try:
        _epoch(processes_loader)  # the first epoch starts the worker processes
        with load.OtherLoad() as other:
            for _ in range(repeats):
                for name, loader in loaders.items():  # the loaders take turns: a busy moment of the machine hits them alike
                    seconds, count = _epoch(loader)
                    times[name].append(seconds)
                    items[name].add(count)
        load.record(other.cores)
    finally:
        threaded.pool.shutdown()
        del processes_loader, loaders
    serial = min(times["DataLoader, num_workers=0"])
    rows = [LoaderRun(name, min(t), max(t), min(items[name]) / min(t), serial / min(t), min(items[name])) for name, t in times.items()]
    return LoaderDemo(rows, [f"{length} items, {format_seconds(serial / length)} each to read at best; {available_cores()} CPU cores. "
                             f"{repeats} epochs each, taking turns; the process loader's workers were started before timing."])
