"""Other programs' share of the CPU while the kit times something: measured, used to choose a thread count that does
not stall, and noted under every table whose timings ran beside them.

"Other" means outside this process and its children: a notebook's own servers and workers are the demo, not load.
"""
from __future__ import annotations

import os
import time

import psutil

NOTE_AT = 0.5  # cores that other programs kept busy on average, from which a timed table says so
LOAD_NOTE = "Timed while other programs kept"  # how that note begins
_seen: list[float] = []  # other programs' busy cores during each timing since the last table took its note
_sample: tuple[float, float] | None = None  # (when, busy cores) of the last short sample, for free_threads


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every core, every program)."""
    times = psutil.cpu_times()
    return sum(getattr(times, field, 0.0) for field in ("user", "nice", "system", "irq", "softirq", "steal"))


def _own_seconds() -> float:
    """CPU seconds of this process, its running descendants, and every child any of them has reaped (a launcher's
    workers that ended count as the launcher's children, not as other programs)."""
    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class OtherLoad:
    """``with OtherLoad() as load: ...`` then ``load.cores``: how many cores other programs kept busy, on average."""

    def __enter__(self) -> OtherLoad:
        self._start = (time.perf_counter(), _busy_seconds(), _own_seconds())
        self.cores = 0.0
        return self

    def __exit__(self, *exc) -> None:
        wall, busy, own = time.perf_counter() - self._start[0], _busy_seconds() - self._start[1], _own_seconds() - self._start[2]
        self.cores = max(0.0, (busy - own) / wall) if wall > 0 else 0.0


def match_threads_to_load(sample_seconds: float = 0.5) -> str:
    """Lower torch's CPU threads to the cores other programs leave free now (at least one); a line saying what it set.

    A parallel region waits at its barrier for its slowest thread, and a thread that has lost its core is slow by whole
    time slices: with both cores of a 2-core machine kept busy by other programs, a lecture's training loops ran 15 to 50
    times slower on 2 threads than alone. The sample is taken once, when this is called."""
    import torch  # lazy: the rest of this module measures load without torch

    with OtherLoad() as other:
        time.sleep(sample_seconds)
    wanted, cores = torch.get_num_threads(), os.cpu_count() or 1
    threads = max(1, min(wanted, cores - round(other.cores)))
    torch.set_num_threads(threads)
    if threads < wanted:
        return (f"torch runs on {threads} CPU thread(s), not {wanted}: other programs kept about {other.cores:.1f} of this "
                f"machine's {cores} cores busy")
    return f"torch runs on {threads} CPU thread(s): other programs kept {other.cores:.1f} of this machine's {cores} cores busy"


def keep_torch_threads() -> None:
    """Give the calling thread torch's CPU thread count. ``torch.set_num_threads`` sets it for the thread that calls it:
    another thread's OpenMP starts with its default (every core), so a thread a server or benchmark starts calls this
    first, and a count set by ``--threads`` or ``match_threads_to_load`` holds there too."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:  # a thread of a program without torch has nothing to keep
        torch.set_num_threads(torch.get_num_threads())


def in_fresh_thread(work):
    """``work()`` run in a new thread, joined; its result (or its exception, raised here).

    With GNU OpenMP (torch's CPU threads on Linux) every thread that starts a parallel region keeps a team of workers
    for as long as it lives, and once the process holds more such workers than the machine has cores, every team stops
    spinning at its barriers and sleeps instead. On 2 cores a thread's matmuls then ran 1.5x slower, and the kit's
    engine stepping in a server thread 1.6x slower, as soon as the main thread had computed anything. A measurement
    that runs its systems in threads of their own (a serving engine, a batching server) therefore runs from a fresh
    thread, never the main one: the thread's team ends with it, and the next measurement starts alike."""
    import threading

    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            keep_torch_threads()
            outcome["result"] = work()
        except BaseException as error:  # handed to the caller's thread, with its traceback
            outcome["error"] = error

    thread = threading.Thread(target=run, name="measurement")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("result")


def record(cores: float) -> None:
    """Note that a timing ran while other programs kept ``cores`` cores busy (``timeit`` calls this)."""
    _seen.append(cores)


def take_load_note() -> str | None:
    """The sentence a table built from the timings since the last one carries, when other programs shared the CPU."""
    seen = max(_seen, default=0.0)
    _seen.clear()
    if seen < NOTE_AT:
        return None
    return (f"{LOAD_NOTE} about {seen:.1f} of this machine's {os.cpu_count()} cores busy: the times "
            "read high and differences between rows are less sure; rerun on a quieter machine to confirm.")


def free_threads(wanted: int) -> int:
    """``wanted`` threads, fewer where other programs keep cores busy (sampled for 50 ms, at most once a second): a
    parallel region whose threads outnumber the free cores waits at every barrier for the thread that lost its core."""
    global _sample
    now = time.perf_counter()
    if _sample is None or now - _sample[0] > 1.0:
        with OtherLoad() as load:
            time.sleep(0.05)
        _sample = (now, load.cores)
    free = (os.cpu_count() or 1) - round(_sample[1])
    return max(1, min(wanted, free))
