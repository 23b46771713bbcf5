"""Profilers, used and read: cProfile and py-spy for Python, torch.profiler for PyTorch ops (with a trace for
Perfetto or TensorBoard) tabulated from the caller's profiling loop. (Reading a profile's pattern: helpers.training.patterns.)
"""
from __future__ import annotations

import cProfile
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

# Kineto (torch.profiler's backend) prints start/stop banners and, without a GPU, a CUDA error on every run;
# level 6 keeps it quiet. It must be set before the first profiler use; set it yourself to see the messages.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity  # noqa: E402

from helpers.core.device import is_gpu, pick_device  # noqa: E402
from helpers.core.paths import build_dir, kit_root  # noqa: E402
from helpers.core.report import Report, column, format_seconds  # noqa: E402
from helpers.core.timing import range_verdict  # noqa: E402

# ---------------------------------------------------------------- cProfile


@dataclass
class FunctionCost:
    function: str = column("function")
    calls: int = column("calls", ",d")
    own_seconds: float = column("own time", format_seconds)
    total_seconds: float = column("total time (with callees)", format_seconds)
    own_share: float = column("share", ".1%")


class PythonProfile(Report):
    """cProfile's view: the functions with the most time of their own, and the time under each."""

    title = "cProfile: functions by own time"

    def __init__(self, rows, profiled_seconds: float, plain_seconds: float, profiled_rounds: list[float] | None = None,
                 plain_rounds: list[float] | None = None):
        self.profiled_seconds, self.plain_seconds = profiled_seconds, plain_seconds
        self.profiled_rounds, self.plain_rounds = profiled_rounds or [profiled_seconds], plain_rounds or [plain_seconds]
        self.overhead = profiled_seconds / plain_seconds
        super().__init__(rows, [self.overhead_sentence()])

    @property
    def overhead_verdict(self) -> str:
        """'slower' when every profiled round took longer than every plain one, 'faster' the other way round, else 'a tie'."""
        return range_verdict(self.profiled_rounds, self.plain_rounds)

    def overhead_sentence(self) -> str:
        """cProfile's overhead, judged against the spread of the rounds in which profiled and plain runs took turns."""
        def span(values):
            return f"{format_seconds(min(values))} to {format_seconds(max(values))}"
        rounds = len(self.plain_rounds)
        head = (f"{rounds} rounds, profiled and plain in turn: profiled {span(self.profiled_rounds)}, plain {span(self.plain_rounds)}; "
                f"median ratio {self.overhead:.2f}x")
        if self.overhead_verdict == "slower":
            return f"{head}: cProfile's instrumentation made the run slower in every round"
        if self.overhead_verdict == "faster":
            return f"{head}: the profiled runs were faster in every round, which instrumentation cannot cause: the machine's load changed"
        return f"{head}: a tie, the ranges overlap, so cProfile's cost on this step is inside the machine's run-to-run noise"

    def share_of(self, fragment: str) -> float:
        """Summed own-time share of the shown functions whose name contains ``fragment``."""
        return sum(r.own_share for r in self.rows if fragment in r.function)


def _function_label(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":  # a built-in: pstats names it '<built-in method ...>' or "<method 'x' of 'y' objects>"
        return name
    return f"{name} ({Path(filename).name}:{line})"


def cprofile(fn: Callable, *args, repeat: int = 3, top: int = 12, rounds: int = 3) -> PythonProfile:
    """Run ``fn(*args)`` ``repeat`` times under cProfile in each of ``rounds`` rounds, each round also timing ``repeat``
    plain calls, the two in turn; the ``top`` functions by own time (all rounds' calls), and cProfile's overhead with
    the rounds' spread."""
    fn(*args)  # warm-up, as for any measurement
    profiler = cProfile.Profile()
    plain_rounds, profiled_rounds = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(repeat):
            fn(*args)
        plain_rounds.append(time.perf_counter() - start)
        start = time.perf_counter()
        profiler.enable()
        for _ in range(repeat):
            fn(*args)
        profiler.disable()
        profiled_rounds.append(time.perf_counter() - start)
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (primitive calls, calls, own, cumulative, callers)}
    own_total = sum(v[2] for v in stats.values()) or 1.0
    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)
    rows = [FunctionCost(_function_label(key), calls, own, cumulative, own / own_total)
            for key, (_, calls, own, cumulative, _) in ranked if not key[2].startswith("<method 'disable'")][:top]
    return PythonProfile(rows, statistics.median(profiled_rounds), statistics.median(plain_rounds), profiled_rounds, plain_rounds)


# ---------------------------------------------------------------- py-spy


@dataclass
class SampledFunction:
    function: str = column("function")
    own_share: float = column("own", ".1%")
    total_share: float = column("on the stack", ".1%")


class SampledProfile(Report):
    """py-spy's view of a running process: the share of samples in which each function was running (own) or on the stack."""

    title = "py-spy: sampled functions"

    def __init__(self, rows, status: str, samples: int = 0, output: Path | None = None, notes: Sequence[str] = (), top: int = 10):
        super().__init__(rows[:top], notes)
        self.functions = list(rows)  # every sampled function; the table shows the first ``top``
        self.status, self.samples, self.output = status, samples, output

    def share_of(self, fragment: str, which: str = "total_share") -> float:
        """The largest share (on the stack, or ``which='own_share'``) of a sampled function whose name contains ``fragment``."""
        return max((getattr(r, which) for r in self.functions if fragment in r.function), default=0.0)


PTRACE_HELP = (
    "py-spy reads another process's memory, which needs ptrace permission. On Linux: run as root, or allow it with "
    "`sudo sysctl kernel.yama.ptrace_scope=0` (or 1, which lets py-spy profile the programs it starts); in Docker, "
    "start the container with `--cap-add SYS_PTRACE`. On macOS py-spy always needs `sudo`."
)


def find_py_spy() -> str | None:
    """The py-spy executable beside this Python (a venv's bin/), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def ptrace_scope() -> int | None:
    """Linux's Yama ptrace policy (0: any process of the same user, 1: only descendants, 2: admin only, 3: none), if set."""
    try:
        return int(Path("/proc/sys/kernel/yama/ptrace_scope").read_text())
    except (OSError, ValueError):
        return None


def explain_py_spy_failure(returncode: int, stderr: str) -> tuple[str, str]:
    """Classify a failed py-spy run: ('cannot attach', how to allow it) for permission errors, else ('failed', its message)."""
    text = stderr.lower()
    if any(s in text for s in ("permission denied", "operation not permitted", "ptrace", "elevated permissions", "sudo")):
        scope = ptrace_scope()
        policy = f" This machine's kernel.yama.ptrace_scope is {scope}." if scope is not None else ""
        first = stderr.strip().splitlines()[0] if stderr.strip() else "permission denied"
        return "cannot attach", f"py-spy could not attach to the process ({first}).{policy} {PTRACE_HELP}"
    tail = " ".join(stderr.strip().splitlines()[-3:]) or f"exit status {returncode}"
    return "failed", f"py-spy failed ({tail})."


def parse_collapsed_stacks(text: str, within: str | None = None) -> tuple[list[SampledFunction], int]:
    """Shares from py-spy's raw (collapsed-stack) output: lines 'frame;frame;...;frame count'.

    With ``within``, only samples whose stack holds a frame whose name starts
    with it count (e.g. the workload's loop, not the interpreter's start-up).
    """
    own: dict[str, int] = {}
    total: dict[str, int] = {}
    samples = 0
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.strip().isdigit():
            continue
        frames = [f.strip() for f in stack.split(";") if f.strip()]
        if within and not any(f.startswith(within) for f in frames):
            continue
        n = int(count)
        samples += n
        own[frames[-1]] = own.get(frames[-1], 0) + n
        for frame in set(frames):
            total[frame] = total.get(frame, 0) + n
    rows = [SampledFunction(f, own.get(f, 0) / samples, total[f] / samples) for f in total] if samples else []
    rows.sort(key=lambda r: (r.own_share, r.total_share), reverse=True)
    return rows, samples


def py_spy(workload: str = "input_pipeline", seconds: float = 2.0, rate: int = 100, top: int = 10, timeout: float = 120) -> SampledProfile:
    """Sample ``python -m helpers.training.workloads <workload>`` with py-spy; never raises, explains what went wrong instead.

    py-spy starts the program itself (so ptrace_scope=1, the Ubuntu default, is
    enough), samples its stacks ``rate`` times a second without modifying it, and
    writes collapsed stacks, which are read back into shares per function.
    """
    exe = find_py_spy()
    if exe is None:
        return SampledProfile([], "not installed", notes=["py-spy is not installed here: `pip install py-spy` (the kit pins it in pyproject.toml)."])
    output = build_dir("profiles") / f"py-spy-{workload}.txt"
    output.unlink(missing_ok=True)
    command = [exe, "record", "--rate", str(rate), "--format", "raw", "--output", str(output), "--",
               sys.executable, "-m", "helpers.training.workloads", workload, "--seconds", str(seconds)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=kit_root() or Path.cwd())
    except subprocess.TimeoutExpired:
        return SampledProfile([], "failed", notes=[f"py-spy did not finish within {timeout:.0f} s."])
    except OSError as err:  # e.g. a py-spy binary for another platform
        return SampledProfile([], "failed", notes=[f"py-spy could not be started: {err}"])
    if done.returncode != 0 or not output.exists():
        status, why = explain_py_spy_failure(done.returncode, done.stderr + done.stdout)
        return SampledProfile([], status, notes=[why])
    rows, samples = parse_collapsed_stacks(output.read_text(), within="_run_for")
    return SampledProfile(rows, "ok", samples, output, [f"{samples} samples at {rate} Hz over the workload's loop; raw stacks: {output}"], top)


# ---------------------------------------------------------------- torch.profiler


def profiler_activities(device: torch.device) -> list[ProfilerActivity]:
    """What torch.profiler should record on ``device``: CPU ops, plus CUDA kernels on a GPU."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if is_gpu(device) else [])


@dataclass
class OpCost:
    op: str = column("op")
    calls: int = column("calls", ",d")
    self_seconds: float = column("self time", format_seconds)
    total_seconds: float = column("total time", format_seconds)
    self_share: float = column("share", ".1%")


class OpProfile(Report):
    """torch.profiler's op table (self time: the op's own work, without the ops it calls) and where its trace is."""

    title = "torch.profiler: ops by self time"

    def __init__(self, rows, trace: Path | None, device: torch.device, steps: int):
        notes = [f"{steps} profiled steps on {device}; times are "
                 + ("the GPU time of the kernels each op launched, shares of all kernel time" if is_gpu(device) else "CPU time")]
        if trace:
            notes.append(f"trace written to {trace}: open it at ui.perfetto.dev (or chrome://tracing), "
                         f"or run `tensorboard --logdir {trace.parent}` with the torch-tb-profiler plugin")
        super().__init__(rows, notes)
        self.trace, self.device, self.steps = trace, device, steps


def op_table(prof, device: str | torch.device | None = None, steps: int | None = None, trace_folder: str | Path | None = None,
             top: int = 10) -> OpProfile:
    """The ops of a finished ``torch.profiler.profile`` run ranked by self time, and the newest trace under ``trace_folder``.

    The profiling loop is the caller's (Lecture 5b writes it, with a schedule and
    ``record_function``); this tabulates what it recorded.
    """
    device = pick_device(device)
    traces = sorted(Path(trace_folder).glob("*.pt.trace.json"), key=lambda p: p.stat().st_mtime) if trace_folder else []
    steps = steps or sum(1 for e in prof.events() if e.name.startswith("ProfilerStep")) or 1
    return OpProfile(op_costs(prof.key_averages(), is_gpu(device), top), traces[-1] if traces else None, device, steps)


def is_gpu_kernel(average) -> bool:
    """Whether a row of ``key_averages()`` is GPU work (a kernel, copy or fill) and not the GPU-side copy of a
    ``record_function`` range (Optimizer.step#SGD.step, say), whose span covers the kernels inside it a second time."""
    return average.device_type == DeviceType.CUDA and not average.is_user_annotation


def op_costs(averages, on_gpu: bool, top: int = 10) -> list[OpCost]:
    """The ``top`` ops of a profile by self time, each with its share.

    On a GPU the ops are the CPU-side ones, ranked by the GPU time of the
    kernels each launched, as a share of all kernel time; the kernel rows are
    left out, since listing them beside their ops would count each kernel twice.
    """
    averages = [a for a in averages if not a.key.startswith("ProfilerStep")]
    if on_gpu:
        ops = [a for a in averages if a.device_type == DeviceType.CPU]
        whole = sum(a.self_device_time_total for a in averages if is_gpu_kernel(a))
        self_time, total_time = (lambda a: a.self_device_time_total), (lambda a: a.device_time_total)
    else:
        ops = averages
        whole = sum(a.self_cpu_time_total for a in ops)
        self_time, total_time = (lambda a: a.self_cpu_time_total), (lambda a: a.cpu_time_total)
    ranked = sorted(ops, key=self_time, reverse=True)[:top]
    return [OpCost(a.key, a.count, self_time(a) / 1e6, total_time(a) / 1e6, self_time(a) / (whole or 1.0)) for a in ranked]
