"""Naive against tiled matrix-product kernels, checked against torch.matmul and timed against the vendor library.

Kernels (``kernel_matmul(a, b, kernel)``):

* on a GPU, in Triton (``triton_kernels``): ``"triton naive"`` (one program per
  output element, no reuse) and ``"triton tiled"`` (one program per tile, blocks of
  A and B reused through ``tl.dot``), against cuBLAS (``torch.matmul``);
* on a CPU, compiled by numba (``cpu_kernels``): ``"naive"`` (i-j-k loop),
  ``"reordered"`` (i-k-j: contiguous, SIMD) and ``"blocked"`` (i-k-j over panels of B
  sized to stay in L2), against oneDNN/MKL (``torch.matmul``), all on one core.

``matmul_kernels(sizes, device)`` times them into a report; without a GPU the Triton
kernels are checked by ``triton_check()`` in Triton's interpreter (never timed).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import types
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

import torch

from helpers.core import plots
from helpers.core.device import cpu_threads, gpu_notice, is_gpu, pick_device
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import timeit
from helpers.hardware.matmuls import matmul_precision
from helpers.hardware.workingset import memory_levels

CPU_KERNELS = ("naive", "reordered", "blocked")
GPU_KERNELS = ("triton naive", "triton tiled")
LIBRARY = "torch.matmul"
TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
LONG_CALL_S = 0.25  # a call this long is timed in one round only
NOTICEABLE = 1.15  # a ratio closer to 1 than this is called "within noise" on a busy machine
DEFAULT_PANEL_L2_BYTES = 256 * 2**10  # L2 size assumed where the OS does not tell (not Linux)
TILE_SIZES = ("BLOCK_M", "BLOCK_N", "BLOCK_K")  # the tiled Triton kernel's block sizes


def triton_available() -> tuple[bool, str]:
    """(True, version) when triton imports, else (False, why not)."""
    try:
        import triton
    except ImportError as err:  # torch's CPU-only and macOS wheels come without it
        return False, f"triton is not installed ({err}); torch's CUDA wheels for Linux ship it"
    return True, triton.__version__


# ---------------------------------------------------------------- running one kernel


def triton_for(device: str | torch.device | None = None):
    """``(triton, triton.language)`` for kernels written in a notebook: compiled on a GPU, interpreted on a CPU.

    Without a GPU, Triton's interpreter (numpy, one program instance after another) must be
    switched on before triton is first imported, as its own library functions are decorated
    at import; this sets TRITON_INTERPRET=1 first and says so. Where triton is not installed
    (torch's macOS and CPU-only wheels), it returns stand-ins that let the kernels be defined,
    and ``triton_check`` reports them as not run, with the reason.
    """
    device = pick_device(device)
    if not is_gpu(device):
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("triton was imported in this process before its interpreter was switched on, so kernels "
                               "cannot run on the CPU here: restart the kernel and call triton_for() before importing triton")
        os.environ["TRITON_INTERPRET"] = "1"
    ok, why_not = triton_available()
    if not ok:
        print(f"Triton kernels can be read here but not run: {why_not}.")
        language = types.SimpleNamespace(constexpr=int)
        return types.SimpleNamespace(jit=lambda fn: fn, cdiv=lambda a, b: -(-a // b), language=language), language
    import triton
    import triton.language as tl

    print(f"Triton {triton.__version__}: kernels " + ("compiled for the GPU." if is_gpu(device)
          else "run in Triton's interpreter on the CPU (TRITON_INTERPRET=1): a check of what they compute, not of speed."))
    return triton, tl


def triton_interpreting() -> bool:
    """True when this process's Triton kernels are interpreted (TRITON_INTERPRET=1 was set before triton was imported)."""
    from helpers.hardware import triton_kernels

    return type(triton_kernels.naive_matmul_kernel).__name__ == "InterpretedFunction"


def check_operands(a: torch.Tensor, b: torch.Tensor, kernel: str) -> None:
    """Clear errors for what the kernels cannot take: not tensors, not 2-D, shapes that do not chain, dtype, device."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{kernel}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{kernel}: {name} must be a 2-D matrix, got shape {tuple(t.shape)}; for a batch, loop over it or use torch.matmul")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{kernel}: cannot multiply {tuple(a.shape)} by {tuple(b.shape)}: a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})")
    if a.dtype != b.dtype:
        raise TypeError(f"{kernel}: a is {a.dtype} but b is {b.dtype}; convert both to one dtype")
    if a.device != b.device:
        raise ValueError(f"{kernel}: a is on {a.device} but b is on {b.device}; move both to one device")
    if kernel in CPU_KERNELS:
        if a.dtype != torch.float32:
            raise TypeError(f"{kernel}: the CPU kernels take torch.float32, got {a.dtype}; use a.float()")
        if a.device.type != "cpu":
            raise ValueError(f"{kernel}: the CPU kernels take CPU tensors, got {a.device}; use a.cpu() (or a 'triton ...' kernel on a GPU)")
    elif kernel in GPU_KERNELS:
        if a.dtype not in TRITON_DTYPES:
            raise TypeError(f"{kernel}: the Triton kernels take {', '.join(map(str, TRITON_DTYPES))}, got {a.dtype}")
        if a.device.type != "cuda" and not triton_interpreting():
            raise ValueError(f"{kernel}: compiled Triton kernels run on a CUDA GPU, got {a.device} tensors; "
                             "without a GPU, triton_check() runs them in Triton's interpreter")
    else:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of {', '.join(CPU_KERNELS + GPU_KERNELS)}")


@lru_cache(maxsize=1)
def cpu_l2_bytes() -> int:
    """This CPU's L2 size from the OS (read once: it takes a millisecond), else DEFAULT_PANEL_L2_BYTES."""
    l2 = [lv.bytes for lv in memory_levels(torch.device("cpu")) if lv.name.startswith("L2")]
    return l2[0] if l2 else DEFAULT_PANEL_L2_BYTES


def panel_rows_for(n_columns: int, l2_bytes: int | None = None) -> int:
    """Rows of B per panel in the blocked kernel: a panel of float32 rows filling half of L2 (at least 8 rows)."""
    l2_bytes = l2_bytes or cpu_l2_bytes()
    return max(8, l2_bytes // 2 // (4 * max(n_columns, 1)))


def kernel_matmul(a: torch.Tensor, b: torch.Tensor, kernel: str = "blocked", panel_rows: int | None = None,
                  blocks: dict[str, int] | None = None) -> torch.Tensor:
    """a @ b computed by one of the teaching kernels (``CPU_KERNELS`` on CPU float32, ``GPU_KERNELS`` on CUDA).

    ``panel_rows``: rows of B per panel of the blocked CPU loop (default: half of L2);
    ``blocks``: tile sizes of the tiled Triton kernel, e.g. {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}.
    """
    check_operands(a, b, kernel)
    if kernel in GPU_KERNELS:
        from helpers.hardware import triton_kernels

        unknown = set(blocks or {}) - set(TILE_SIZES)
        if unknown:
            raise ValueError(f"{kernel}: unknown block sizes {sorted(unknown)}; use {sorted(TILE_SIZES)}")
        if kernel == "triton naive":
            return triton_kernels.naive_matmul(a.contiguous(), b.contiguous())
        return triton_kernels.tiled_matmul(a.contiguous(), b.contiguous(), **(blocks or {}))
    from helpers.hardware import cpu_kernels

    a_np, b_np = a.detach().contiguous().numpy(), b.detach().contiguous().numpy()
    out = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32)
    if kernel == "naive":
        cpu_kernels.naive_ijk(a_np, b_np, out.numpy())
    elif kernel == "reordered":
        cpu_kernels.reordered_ikj(a_np, b_np, out.numpy())
    else:
        rows = panel_rows or panel_rows_for(b.shape[1])
        if rows < 1:
            raise ValueError(f"blocked: panel_rows must be at least 1, got {rows}")
        cpu_kernels.blocked_ikj(a_np, b_np, out.numpy(), rows)
    return out


# ---------------------------------------------------------------- correctness of the Triton kernels


@dataclass
class KernelCheck:
    kernel: str = column("kernel")
    shape: str = column("A x B")
    mode: str = column("ran as")
    max_error: float | None = column("max |error| vs torch.matmul", ".1e")
    agrees: bool | None = column("agrees")


class TritonCheck(Report):
    """Do the Triton kernels compute a @ b? Compiled on a GPU, interpreted on a CPU."""

    title = "Triton kernels against torch.matmul"


def triton_check(kernels: dict[str, Callable] | None = None, m: int = 37, n: int = 29, k: int = 45,
                 device: str | torch.device | None = None, timeout: float = 300) -> TritonCheck:
    """Run each Triton matmul on random m x k and k x n matrices (sizes that are no multiple of any block) and compare.

    ``kernels``: name -> function(a, b) returning a @ b, such as a notebook's launches
    (defined after ``triton_for(device)``); they run in this process, compiled on a GPU,
    interpreted on a CPU. None: the kit's own pair (``triton_kernels``), which without a
    GPU runs in Triton's interpreter in a fresh Python process, because the interpreter
    must be switched on before triton is first imported.
    """
    for name, value in (("m", m), ("n", n), ("k", k)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"triton_check: {name} must be a positive integer, got {value!r}")
    device = pick_device(device)
    ok, version = triton_available()
    shape = f"{m}x{k} @ {k}x{n}"
    names = list(kernels) if kernels else list(GPU_KERNELS)
    if not ok:
        return TritonCheck([KernelCheck(kernel, shape, "not run", None, None) for kernel in names], [version])
    mode = f"compiled for {torch.cuda.get_device_name(device)} (triton {version})" if is_gpu(device) else f"interpreter on the CPU (triton {version})"
    if kernels or is_gpu(device):
        generator = torch.Generator().manual_seed(0)
        a, b = (torch.randn(*s, generator=generator).to(device) for s in ((m, k), (k, n)))
        expected = a @ b
        run = kernels or {kernel: lambda a, b, kernel=kernel: kernel_matmul(a, b, kernel) for kernel in GPU_KERNELS}
        errors = {name: (_run_triton(name, fn, a, b, device) - expected).abs().max().item() for name, fn in run.items()}
    else:
        errors = {f"triton {name}": error for name, error in _interpreted_errors(m, n, k, timeout).items()}
    tolerance = 1e-4 * k ** 0.5 + 1e-5  # fp32 rounding grows with the length of each dot product
    rows = [KernelCheck(kernel, shape, mode, errors[kernel], errors[kernel] <= tolerance) for kernel in names]
    notes = [f"Agrees: max |error| <= {tolerance:.1e} (float32 rounding over sums of {k} products)."]
    if not is_gpu(device):
        notes.append("The interpreter executes each program instance in numpy, one after another: it checks what a kernel computes, and says nothing about its speed.")
    return TritonCheck(rows, notes)


def interpreter_hint(error: str) -> str | None:
    """What to do about a failure of Triton's interpreter that comes from the installed versions, not the kernel."""
    if "only 0-dimensional arrays can be converted to Python scalars" in error:
        import numpy

        return (f"Triton {triton_available()[1]}'s interpreter turns a one-element array into an int, which NumPy {numpy.__version__} "
                "refuses (NumPy 2.5 removed it); Triton 3.8, the kit's version, squeezes the array first. Use the kit's "
                "environment (make setup), or numpy<2.5 with this Triton.")
    return None


def _run_triton(name: str, fn: Callable, a: torch.Tensor, b: torch.Tensor, device: torch.device) -> torch.Tensor:
    """One kernel's result, with the likely cause named when a compiled kernel met CPU tensors."""
    try:
        return fn(a, b)
    except Exception as err:
        hint = interpreter_hint(str(err))
        if hint:
            raise RuntimeError(f"{name} failed in Triton's interpreter: {hint}") from err
        if is_gpu(device) or os.environ.get("TRITON_INTERPRET") == "1":
            raise
        raise RuntimeError(f"{name} failed on CPU tensors ({type(err).__name__}: {err}); without a GPU, get triton from "
                           "triton_for(device) before defining the kernels, so that they run in Triton's interpreter") from err


def _interpreted_errors(m: int, n: int, k: int, timeout: float) -> dict[str, float]:
    """Max errors of both kernels from ``python -m helpers.hardware.triton_kernels`` run with TRITON_INTERPRET=1."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])}
    command = [sys.executable, "-m", "helpers.hardware.triton_kernels", "--m", str(m), "--n", str(n), "--k", str(k)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        hint = interpreter_hint(done.stderr)
        raise RuntimeError(f"the Triton kernels failed in the interpreter (exit {done.returncode}):\n{done.stderr[-3000:]}"
                           + (f"\n{hint}" if hint else ""))
    return json.loads(done.stdout.strip().splitlines()[-1])["max_error"]


# ---------------------------------------------------------------- timing against the library


@dataclass
class KernelPoint:
    kernel: str = column("kernel")
    m: int = column("m", ",")
    n: int = column("n", ",")
    seconds: float = column("time", format_seconds)
    gflops: float = column("GFLOP/s", ",.2f")
    pct_of_library: float = column("% of library", ".1f")
    max_error: float = column("max |error| vs torch", ".1e")
    b_fits_in: str = column("B fits in")
    b_bytes: int = 0
    spread: float = 1.0  # median block over the fastest block, across all rounds: how much other work disturbed the timing


class KernelTimings(Report):
    """Seconds and GFLOP/s of each kernel at each size (m x n times n x n), against the library."""

    def __init__(self, rows: Sequence[KernelPoint], device: torch.device, library: str, threads: int | None, notes: Sequence[str], naive_up_to: int | None,
                 same_loop_at: Sequence[int] = ()):
        self.device, self.library, self.threads, self.naive_up_to = device, library, threads, naive_up_to
        self.same_loop_at = sorted(set(same_loop_at))  # sizes where the blocked kernel runs exactly the reordered loop
        where = torch.cuda.get_device_name(device) if is_gpu(device) else f"CPU, {threads} thread{'s' if threads != 1 else ''}" if threads else "not run: no GPU"
        self.title = f"Matrix-product kernels against {library} ({where})"
        super().__init__(rows, notes)
        self.notes = [*self.notes, *self.conclusions()]

    @property
    def kernels(self) -> list[str]:
        return list(dict.fromkeys(r.kernel for r in self.rows))

    def speedup(self, faster: str, slower: str, n: int) -> float | None:
        """How many times less time ``faster`` took than ``slower`` at size n (None where either was not run)."""
        found = {r.kernel: r for r in self.rows if r.n == n}
        if faster not in found or slower not in found:
            return None
        return found[slower].seconds / found[faster].seconds

    def conclusions(self) -> list[str]:
        """Sentences drawn from the measured numbers (ratios at the largest size where both kernels ran)."""
        if not self.rows:
            return []
        steps = list(zip(self.kernels[:-1], self.kernels[1:]))
        out = []
        for slower, faster in steps:
            sizes = [r.n for r in self.rows if r.kernel == slower and self.speedup(faster, slower, r.n) is not None]
            if not sizes:
                continue
            n = max(sizes)
            ratio = self.speedup(faster, slower, n)
            fits = self.find(kernel=faster, n=n).b_fits_in
            out.append(f"At n={n:,} (B: {format_bytes(self.find(kernel=faster, n=n).b_bytes)}, fits in {fits}): {_compare(faster, slower, ratio)}.")
        verdicts = {"paid off": [], "made no clear difference": [], "cost time": []}
        same = []
        for n in sorted({r.n for r in self.rows if r.kernel == "blocked"}):
            verdict = self.blocking_verdict(n)
            if verdict is None:
                continue
            if n in self.same_loop_at:
                same.append(f"n = {n:,} ({self.speedup('blocked', 'reordered', n):.2f}x)")
            else:
                verdicts[verdict].append(n)
        found = [f"{verdict} at n = {', '.join(f'{n:,}' for n in sizes)}" for verdict, sizes in verdicts.items() if sizes]
        if found:
            out.append("Blocking, against the reordered loop (a change counts where it exceeds both the kit's "
                       f"{NOTICEABLE - 1:.0%} and the spread of the loop's own blocks): " + "; ".join(found) + ".")
        if same:
            out.append("At " + ", ".join(same) + " one panel holds all of B, so the blocked kernel ran exactly the reordered "
                       "loop: any gap there is timing noise, not blocking.")
        return out

    def blocking_verdict(self, n: int) -> str | None:
        """"paid off", "cost time" or "made no clear difference": blocked against reordered at n, judged against the noise.

        A gain counts where it exceeds NOTICEABLE and the spread of the faster kernel's blocks (its median block still
        beat the other's fastest); None where either kernel did not run at n.
        """
        gain = self.speedup("blocked", "reordered", n)
        if gain is None:
            return None
        blocked, reordered = self.find(kernel="blocked", n=n), self.find(kernel="reordered", n=n)
        if gain > max(NOTICEABLE, blocked.spread):
            return "paid off"
        if 1 / gain > max(NOTICEABLE, reordered.spread):
            return "cost time"
        return "made no clear difference"

    def plot(self, ax=None):
        ax = plots.new_axes(ax, title=self.title, xlabel="matrix size n (log scale)", ylabel="GFLOP/s (log scale)", logx=True, logy=True)
        if not self.rows:
            ax.text(0.5, 0.5, f"nothing timed: no GPU here (device {self.device})", transform=ax.transAxes, ha="center", va="center")
            return ax
        series = {kernel: ([r.n for r in self.rows if r.kernel == kernel], [r.gflops for r in self.rows if r.kernel == kernel]) for kernel in self.kernels}
        rows_of_a = {r.m for r in self.rows}
        shape = f"A is {rows_of_a.pop():,} x n" if len(rows_of_a) == 1 else "A is n x n"
        plots.line_chart(series, ax, styles={self.library: "--"}, title=self.title, xlabel=f"n (log scale): B is n x n, {shape}", ylabel="GFLOP/s (log scale)", logx=True, logy=True)
        if not is_gpu(self.device):
            sizes = sorted({r.n for r in self.rows})
            for level in memory_levels(torch.device("cpu"))[:-1]:
                n_fill = (level.bytes / 4) ** 0.5  # B (n x n float32) fills the level
                if sizes[0] / 1.5 <= n_fill <= sizes[-1] * 1.5:
                    plots.vertical_line(ax, n_fill, f"B fills {level.name} ({format_bytes(level.bytes)})", color="#7f7f7f")
        return ax


def _compare(faster: str, slower: str, ratio: float) -> str:
    if ratio >= NOTICEABLE:
        return f"{faster} is {ratio:.1f}x faster than {slower}"
    if ratio <= 1 / NOTICEABLE:
        return f"{faster} is {1 / ratio:.1f}x SLOWER than {slower}"
    return f"{faster} and {slower} are within noise of each other ({ratio:.2f}x)"


def _fits_in(nbytes: int, device: torch.device) -> str:
    levels = memory_levels(device)
    return next((lv.name for lv in levels if nbytes <= lv.bytes), f"beyond {levels[-1].name}")


def matmul_kernels(sizes: Sequence[int], device: str | torch.device | None = None, rows: int | None = None, naive_up_to: int | None = None,
                   min_run_time: float = 0.1, dtype: torch.dtype = torch.float32, rounds: int = 3,
                   kernels: dict[str, Callable] | None = None, same_loop_at: Sequence[int] | None = None) -> KernelTimings:
    """Time each kernel on (m x n) @ (n x n) for each n in ``sizes`` against torch.matmul, and check each result.

    ``kernels``: name -> function(a, b) returning a @ b, the kernels a notebook wrote; None:
    the kit's own (the Triton pair on a GPU, the three numba loops on a CPU).
    ``same_loop_at``: the sizes at which the "blocked" kernel runs exactly the reordered loop (one panel covers all of
    B), so that a gap there is read as noise; None: worked out for the kit's own blocked loop, none for others.

    ``rows``: m, the rows of A (a batch of inputs times an n x n weight matrix, as in a
    linear layer); None: m = n, square products. B, the matrix every row of A reuses,
    is the working set that outgrows the caches as n grows.

    On a GPU: the two Triton kernels against cuBLAS. On a CPU: the three numba loops
    against oneDNN/MKL, everything on one thread (the loops use one core).
    ``naive_up_to``: the naive kernel runs only up to this n (it is slow: n^3 steps
    with a cache miss in most of them). Each kernel is timed in ``rounds`` rounds, taking
    turns with the others (a call longer than LONG_CALL_S in one round only), and the
    fastest block is kept, as other programs on a busy machine can only slow a block down.
    """
    sizes = list(sizes)
    if not sizes or any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"matmul_kernels: sizes must be positive integers, got {sizes!r}")
    if not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"matmul_kernels: rounds must be a positive integer, got {rounds!r}")
    if rows is not None and (not isinstance(rows, int) or rows < 1):
        raise ValueError(f"matmul_kernels: rows must be a positive integer or None (square), got {rows!r}")
    device = pick_device(device)
    gpu = is_gpu(device)
    if gpu and not triton_available()[0]:
        raise RuntimeError(f"matmul_kernels on {device}: {triton_available()[1]}")
    if same_loop_at is None:
        same_loop_at = [n for n in sizes if panel_rows_for(n) >= n] if kernels is None and not gpu else []
    if kernels is None:
        kernels = {kernel: lambda a, b, kernel=kernel: kernel_matmul(a, b, kernel) for kernel in (GPU_KERNELS if gpu else CPU_KERNELS)}
    dtype = dtype if gpu else torch.float32
    threads = None if gpu else 1
    library = f"{LIBRARY} ({'cuBLAS' if gpu else 'oneDNN/MKL'})"
    points = []
    generator = torch.Generator().manual_seed(0)
    with cpu_threads(threads), matmul_precision("fp32"):  # fp32 on a GPU: IEEE products in cuBLAS too, no TF32
        for n in sorted(sizes):
            m = rows or n
            a = torch.randn(m, n, generator=generator).to(device=device, dtype=dtype)
            b = torch.randn(n, n, generator=generator).to(device=device, dtype=dtype)
            expected = torch.matmul(a, b)
            b_bytes = b.numel() * b.element_size()
            timed = {LIBRARY: lambda a=a, b=b: torch.matmul(a, b)}
            for kernel, fn in kernels.items():
                if kernel.endswith("naive") and naive_up_to is not None and n > naive_up_to:
                    continue
                timed[kernel] = lambda a=a, b=b, fn=fn: fn(a, b)
            errors = {kernel: 0.0 if kernel == LIBRARY else (fn().float() - expected.float()).abs().max().item() for kernel, fn in timed.items()}
            blocks = {kernel: [] for kernel in timed}
            for round_ in range(rounds):  # the kernels take turns, so a burst of other work cannot fall on one of them only
                for kernel, fn in timed.items():
                    if round_ and min(blocks[kernel]) > LONG_CALL_S:
                        continue  # one long call already averages over bursts; repeating it would only cost time
                    measured = timeit(fn, device=device, min_run_time=min_run_time, num_threads=threads or torch.get_num_threads())
                    blocks[kernel] += list(measured.times)
            best = {kernel: min(times) for kernel, times in blocks.items()}
            library_seconds = best[LIBRARY]
            for kernel in (*[k for k in kernels if k in timed], LIBRARY):
                seconds, error = best[kernel], errors[kernel]
                name = library if kernel == LIBRARY else kernel
                points.append(KernelPoint(name, m, n, seconds, 2 * m * n * n / seconds / 1e9, 100 * library_seconds / seconds, error,
                                          _fits_in(b_bytes, device), b_bytes, statistics.median(blocks[kernel]) / seconds))
    notes = []
    if gpu:
        precision = "float32 on both sides, TF32 off (IEEE products)" if dtype == torch.float32 else f"{dtype} inputs, float32 sums in the Triton kernels"
        notes.append(f"{precision}. Times are the fastest block after a warm-up call (which compiles the Triton kernels).")
    else:
        notes.append("Every kernel and the library ran on ONE core (torch limited to 1 thread), so the comparison is per core; "
                     "the blocked kernel walks B in panels of rows filling half of L2.")
        notes += _naive_extrapolation(points, naive_up_to, max(sizes))
    return KernelTimings(points, device, library, threads, notes, naive_up_to, same_loop_at)


def _naive_extrapolation(points: Sequence[KernelPoint], naive_up_to: int | None, largest: int) -> list[str]:
    """Why the naive kernel has no row at the largest sizes (its rate there is not extrapolated: B outgrows the caches)."""
    naive = [p for p in points if p.kernel.endswith("naive")]
    if naive_up_to is None or largest <= naive_up_to or not naive:
        return []
    last = max(naive, key=lambda p: p.n)
    return [f"The naive kernel ran only up to n={naive_up_to:,} (too slow beyond); its {last.gflops:.2f} GFLOP/s at n={last.n:,} "
            f"says nothing about n={largest:,}, where B no longer fits in the same cache (not run)."]


def gpu_kernel_timings(sizes: Sequence[int], device: str | torch.device | None = None, **options) -> KernelTimings:
    """The Triton kernels against cuBLAS on a GPU; without one, an empty report whose note says so (the CPU loops are the CPU side)."""
    device = pick_device(device)
    if is_gpu(device):
        return matmul_kernels(sizes, device, **options)
    notice = gpu_notice("compiled Triton kernels timed against cuBLAS; the numba loops are the CPU side", device, echo=False)
    return KernelTimings([], device, f"{LIBRARY} (cuBLAS)", None, [notice], None)


# ---------------------------------------------------------------- what each launch asks of memory


@dataclass
class LaunchPlan:
    kernel: str = column("kernel")
    n: int = column("n", ",")
    programs: int = column("programs (thread blocks)", ",")
    outputs_per_program: int = column("outputs per program", ",")
    loads_from_global: int = column("values loaded from global memory", ",")
    loads_per_multiply_add: float = column("loads per multiply-add", ".3f")


class LaunchPlans(Report):
    """Derived, not measured: how many programs each Triton kernel launches and how much it reads from global memory."""

    title = "The two Triton kernels' grids and global-memory reads, n x n @ n x n (derived)"


def launch_plan(sizes: Sequence[int], block_m: int = 64, block_n: int = 64) -> LaunchPlans:
    """Programs and global-memory reads of the naive and tiled kernels (``block_m`` x ``block_n`` output tiles) for each n.

    Counted as if nothing were cached: the naive program for C[i, j] reads row i of A
    and column j of B (2n values); a tiled program reads a block_m-row strip of A and a
    block_n-column strip of B (n * (block_m + block_n) values) for block_m * block_n outputs.
    """
    if any(not isinstance(n, int) or n < 1 for n in sizes) or block_m < 1 or block_n < 1:
        raise ValueError(f"launch_plan: sizes and blocks must be positive integers, got sizes={list(sizes)!r}, blocks={block_m}x{block_n}")
    rows = []
    for n in sizes:
        tiles = -(-n // block_m) * -(-n // block_n)
        rows.append(LaunchPlan("triton naive", n, n * n, 1, 2 * n**3, 2 * n**3 / n**3))
        rows.append(LaunchPlan("triton tiled", n, tiles, block_m * block_n, tiles * n * (block_m + block_n), tiles * n * (block_m + block_n) / n**3))
    notes = [f"Tiles of {block_m} x {block_n} outputs: each value the tiled kernel loads is used {block_n} (A) or {block_m} (B) times "
             "from fast on-chip memory; the naive kernel uses each once, and relies on the L2 cache to avoid going to HBM every time."]
    return LaunchPlans(rows, notes)
