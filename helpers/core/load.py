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
