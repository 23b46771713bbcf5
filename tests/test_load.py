"""Other programs' share of the CPU: measured apart from this process's own children, and noted under timed tables."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time

import pytest

from helpers.core import load
from helpers.core.report import Report
from helpers.core.timing import timeit

BUSY = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass\n"


@pytest.fixture
def stranger():
    """A busy loop that is not this process's descendant (its parent shell exits at once), for about 3 s."""
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -c '{BUSY.format(seconds=3)}' >/dev/null 2>&1 & echo $!"],
                           capture_output=True, text=True, check=True)
    pid = int(shell.stdout.strip())
    time.sleep(0.3)
    yield pid
    subprocess.run(["kill", str(pid)], capture_output=True)


def test_a_busy_program_outside_this_process_counts_and_a_busy_child_does_not(stranger):
    with load.OtherLoad() as other:
        time.sleep(1.0)
    assert other.cores > 0.5, other.cores  # someone else kept (at least) about a core busy
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start, busy = time.perf_counter(), load._busy_seconds()
    with load.OtherLoad() as mine:
        subprocess.run([sys.executable, "-c", BUSY.format(seconds=1.5)], check=True)
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    everything = (load._busy_seconds() - busy) / wall  # the whole machine, the child included
    child = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / wall  # however much of a core it got
    assert child > 0.05 and mine.cores <= everything - 0.8 * child, (everything, mine.cores, child)  # the child is the demo, not other work


LAUNCHER = ("import subprocess, sys, time\n"
            "subprocess.run([sys.executable, '-c', {busy!r}], check=True)\n"  # a worker that ends, reaped by the launcher
            "print('reaped', flush=True)\n"
            "time.sleep(30)\n")


def test_a_worker_that_ended_under_a_launcher_still_counts_as_this_process_s_own():
    start = load._own_seconds()
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER.format(busy=BUSY.format(seconds=0.6))], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline().strip() == "reaped"
        own = load._own_seconds() - start  # the launcher is alive; its worker is gone, its CPU in the launcher's children
    finally:
        launcher.kill()
        launcher.wait()
    assert own >= 0.4, own  # counted the worker's busy loop (however long the machine kept it waiting)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores: one busy, one free")
def test_timing_beside_a_busy_program_uses_the_free_cores_and_the_table_says_so(stranger):
    load._sample = None
    assert load.free_threads(os.cpu_count()) <= os.cpu_count() - 1
    load.take_load_note()  # nothing left from earlier timings
    timeit(lambda: sum(range(2000)), min_run_time=0.3)
    report = Report([])
    assert any(note.startswith(load.LOAD_NOTE) for note in report.notes), report.notes
    assert not any(note.startswith(load.LOAD_NOTE) for note in Report([]).notes)  # taken once, by the table that follows


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores: one busy, one free")
def test_a_lecture_lowers_torchs_threads_to_the_cores_a_busy_program_leaves_free(stranger):
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(os.cpu_count())
        said = load.match_threads_to_load(sample_seconds=0.5)
        assert torch.get_num_threads() <= os.cpu_count() - 1, said  # the stranger's core is left to it
        assert f"not {os.cpu_count()}" in said and "other programs kept" in said
    finally:
        torch.set_num_threads(before)


def test_a_quiet_timing_leaves_no_note():
    load._seen.clear()
    load.record(0.1)
    assert load.take_load_note() is None and load._seen == []
    load.record(1.2)
    assert "1.2 of this machine's" in load.take_load_note()


def test_in_fresh_thread_returns_the_result_and_raises_the_error_of_work_run_off_the_main_thread():
    import threading

    assert load.in_fresh_thread(lambda: threading.current_thread() is threading.main_thread()) is False
    with pytest.raises(KeyError, match="missing"):
        load.in_fresh_thread(lambda: {}["missing"])


# A parallel region leaves an OpenMP team (worker threads) on the thread that started it, for as long as that thread
# lives: in the main thread for good, in a fresh thread only until it ends.
OPENMP_TEAMS = """
import torch
from helpers.core.load import in_fresh_thread
from tests.openmp_probe import settle, threads
torch.set_num_threads(2)
a = torch.randn(512, 512)
before = threads()
in_fresh_thread(lambda: [a @ a for _ in range(20)])
after_fresh = settle(before)
[a @ a for _ in range(20)]
print(before, after_fresh, threads())
"""


def test_a_fresh_thread_s_openmp_team_ends_with_it_and_the_main_thread_s_stays():
    run = subprocess.run([sys.executable, "-c", OPENMP_TEAMS], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr
    before, after_fresh, after_main = map(int, run.stdout.split())
    assert after_fresh == before          # the fresh thread's team went with it
    assert after_main > before            # the main thread's team stays: what in_fresh_thread keeps benchmarks from


# torch.set_num_threads sets the calling thread's OpenMP: a new thread would start with OpenMP's default instead.
KEPT_THREADS = """
import threading, torch
from helpers.core.load import in_fresh_thread
from tests.openmp_probe import settle, threads
torch.set_num_threads(1)
a = torch.randn(1024, 1024)

def workers_added():  # an OpenMP team's workers live as long as this thread
    before = threads()
    [a @ a for _ in range(5)]     # MKL's matmul threads by the calling thread's OpenMP setting
    return threads() - before

start = threads()
plain = threading.Thread(target=lambda: print(workers_added()))
plain.start()
plain.join()
settle(start)
print(in_fresh_thread(workers_added))
"""


def test_a_fresh_thread_keeps_the_thread_count_torch_was_given():
    run = subprocess.run([sys.executable, "-c", KEPT_THREADS], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"})
    assert run.returncode == 0, run.stderr
    plain, kept = map(int, run.stdout.split())
    assert plain >= 1       # a plain thread ran OpenMP's default of 2 threads, not the 1 torch was given
    assert kept == 0        # in_fresh_thread keeps torch's 1: no team at all
