"""Which kernels ran, read from a torch.profiler run: each kernel (GPU) or op (CPU) put in a class by its name,
with the share of time per class and the top kernels. On a CPU, oneDNN's own log adds which implementation ran
(jit:avx512_core, brgemm, AMX...), the CPU's analogue of a GPU kernel's name.

The name patterns (``GPU_RULES``, ``CPU_RULES``) are the documentation: each rule says why it means what it means.
"""
from __future__ import annotations

import ctypes
import os
import re
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

# Kineto prints banners and, without a GPU, a CUDA error on every run; level 6 keeps it quiet (as in profiling.py).
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from helpers.core import plots  # noqa: E402
from helpers.core.device import DTYPES, cpu_threads, is_gpu, pick_device, synchronize  # noqa: E402
from helpers.core.report import Report, column, format_seconds  # noqa: E402
from helpers.core.timing import range_verdict  # noqa: E402
from helpers.training.profiling import is_gpu_kernel  # noqa: E402

# ---------------------------------------------------------------- classes and the name patterns behind them

TENSOR_CORE = "tensor-core GEMM/conv"
PLAIN_MATMUL = "GEMM/conv, no tensor-core marker"
ELEMENTWISE = "element-wise, reductions, norms"
COPIES = "copies and fills"
COMMUNICATION = "communication (NCCL)"
OTHER = "other kernels"
GPU_CLASSES = (TENSOR_CORE, PLAIN_MATMUL, ELEMENTWISE, COPIES, COMMUNICATION, OTHER)

CPU_GEMM = "GEMM (oneDNN / BLAS)"
CPU_CONV = "convolution (oneDNN)"
CPU_SLOW_CONV = "convolution, ATen fallback (no oneDNN)"
CPU_MEMORY = "copies, fills, views, allocation"
CPU_ATEN = "element-wise, reductions, other ops"
CPU_FRAMEWORK = "not an aten op (autograd, optimizer, Python)"
STEP_RANGE = "kernel_table.step"  # the profiler range around each profiled step: its wall time, not an op
CPU_CLASSES = (CPU_GEMM, CPU_CONV, CPU_SLOW_CONV, CPU_MEMORY, CPU_ATEN, CPU_FRAMEWORK)

# (class, pattern, why), first match wins. GPU kernel names are what cuBLAS, cuDNN, CUTLASS, PyTorch and Triton call them.
GPU_RULES: tuple[tuple[str, str, str], ...] = (
    (COMMUNICATION, r"nccl", "NCCL's kernels are named ncclKernel_* / ncclDevKernel_*"),
    (COPIES, r"memcpy|memset|copy_kernel|catarraybatchedcopy|fill_kernel|nchwtonhwc|nhwctonchw",
     "the profiler names copies 'Memcpy HtoD (...)' and fills 'Memset (...)'; PyTorch's copy and fill kernels and "
     "cuDNN's layout conversions (nchwToNhwcKernel) say so"),
    (TENSOR_CORE, r"hmma|imma|dmma|wmma|gmma",
     "the MMA instruction families in a name: hmma (half), imma (integer), dmma (double), wmma (the warp-level API), "
     "gmma/wgmma (Hopper's warp-group MMA)"),
    (TENSOR_CORE, r"tensorop", "CUTLASS names tensor-core kernels *_tensorop_*, its CUDA-core ones *_simt_*"),
    (TENSOR_CORE, r"(?:^|_)[hsdi]\d{3,5}(?:gemm|cudnn|conv|_|$)",
     "cuBLAS/cuDNN put the MMA shape after the type letter: h884 (Volta), s1688/h1688 (Turing), s16816, i8816, d884 "
     "(Ampere and later): the '[i|s|h](\\d)+' rule of the lecture slides"),
    (TENSOR_CORE, r"xmma.*(?:tf32|f16|e4m3|e5m2|i8|f64)",
     "NVIDIA's xmma kernels spell the data types out (sm90_xmma_gemm_bf16bf16_..., _f32f32_tf32f32_...): a 16-bit, "
     "8-bit, TF32 or FP64 type runs on tensor cores; plain f32f32_f32 is left unmarked"),
    (TENSOR_CORE, r"nvjet_(?:sm\d+_)?[a-z]*[htbeq][a-z]*_",
     "cuBLAS's nvjet kernels carry a type code (nvjet_tst_, nvjet_hsh_; cuBLAS 13 puts the architecture first: "
     "nvjet_sm90_tst_): a 16-bit or 8-bit letter means tensor cores; an all-fp32 code (sss) says nothing either way"),
    (TENSOR_CORE, r"flash_fwd|flash_bwd|flash::|fmha.*(?:f16|bf16)",
     "FlashAttention kernels exist only for fp16/bf16 and are built on tensor-core MMA instructions"),
    (PLAIN_MATMUL, r"gemm|gemv|convolve|conv2d|conv3d|convolution|winograd|wgrad|dgrad|fprop|scudnn|cublas|nvjet|cutlass"
                   r"|xmma|triton_tem|fft2d",
     "matrix products and convolutions whose name shows no tensor-core marker: sgemm, gemv, implicit_convolve_sgemm, "
     "scudnn (fp32 SIMT), CUTLASS simt, Triton templates (tl.dot may use tensor cores, the name does not say)"),
    (ELEMENTWISE, r"elementwise|reduce|triton_(?:poi|red|per)_|softmax|norm|bn_fw|bn_bw|vectorized|unrolled|at::native",
     "PyTorch's element-wise and reduction kernels and Triton's pointwise (poi), reduction (red) and persistent (per) ones"),
)

CPU_RULES: tuple[tuple[str, str, str], ...] = (
    (CPU_GEMM, r"^aten::(?:mm|addmm|bmm|baddbmm|addbmm|matmul|mv|addmv|dot|vdot|linear|_addmm_activation|mkldnn_linear"
               r"|_mkldnn_matmul|addr)$",
     "matrix products: on a CPU these call MKL or oneDNN GEMM kernels"),
    (CPU_SLOW_CONV, r"^aten::(?:_?slow_conv|thnn_conv)",
     "ATen's own convolution loops (im2col, then a GEMM), used when oneDNN has no kernel for the dtype or shape: "
     "_slow_conv2d_forward/_backward; oneDNN's log then shows no convolution primitive"),
    (CPU_CONV, r"^aten::\w*conv(?!ert)", "convolutions, forward and backward: oneDNN's (mkldnn_convolution, convolution_backward)"),
    (CPU_CONV, r"^(?:de)?convolution\b", "oneDNN's log names the primitive first: convolution, whatever its implementation"),
    (CPU_GEMM, r"^(?:matmul|inner_product)\b", "oneDNN's matrix-product primitives"),
    (CPU_MEMORY, r"^aten::(?:copy_|clone|contiguous|to|_to_copy|empty|empty_like|empty_strided|zeros|zeros_like|zero_"
                 r"|fill_|ones|ones_like|full|cat|stack|resize_|as_strided|new_empty|new_zeros|_unsafe_view|view"
                 r"|reshape|t|transpose|permute|expand|detach|detach_|select|slice|unsqueeze|squeeze|flatten|alias)$|^reorder\b",
     "moving, filling and allocating memory, or only relabelling it (views); oneDNN's reorder converts between layouts"),
    (CPU_GEMM, r"brgemm|brg:|amx|gemm", "bare oneDNN/MKL kernel names of matrix products (brgemm, AMX, gemm:jit, sgemm)"),
    (CPU_ATEN, r"^aten::|^(?:eltwise|pooling|batch_normalization|layer_normalization|group_normalization|softmax|logsoftmax"
               r"|binary|sum|concat|shuffle|resampling|reduction|lrn|prelu)\b",
     "every other ATen op (element-wise maths, reductions, losses, optimizer arithmetic) and oneDNN's other primitives"),
)


def classify_kernel(name: str, device: str | torch.device = "cuda") -> str:
    """The class of a kernel (``device`` a GPU) or an op or oneDNN implementation name (a CPU), by ``GPU_RULES``/``CPU_RULES``."""
    gpu = is_gpu(device)
    lowered = name.lower() if gpu else name
    for kernel_class, pattern, _ in GPU_RULES if gpu else CPU_RULES:
        if re.search(pattern, lowered):
            return kernel_class
    return OTHER if gpu else CPU_FRAMEWORK


# ---------------------------------------------------------------- the profiled step


def cnn_training_step(device: str | torch.device | None = None, batch: int = 16, channels: int = 16, image: int = 32,
                      dtype: str | None = None) -> Callable[[], None]:
    """One SGD step of a small CNN (two convolutions, ReLU, pooling, a linear layer) on random images, optionally
    under autocast to ``dtype`` ('bf16' or 'fp16'), for the profiler to take apart."""
    if dtype not in (None, "bf16", "fp16"):
        raise ValueError(f"cnn_training_step: dtype={dtype!r}; use None (fp32), 'bf16' or 'fp16'.")
    device = pick_device(device)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.ReLU(), nn.Conv2d(channels, channels, 3, padding=1),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(channels * (image // 2) ** 2, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, 3, image, image, device=device), torch.randint(0, 10, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=DTYPES[dtype] if dtype else None, enabled=dtype is not None):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# ---------------------------------------------------------------- oneDNN's log: which CPU implementation ran


def _flush_c_stdout() -> None:
    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):  # no C library to reach (e.g. Windows): nothing buffered there to lose
        pass


def onednn_log(step: Callable[[], object]) -> str:
    """Run ``step`` once with oneDNN's verbose mode on and return what oneDNN printed (one line per primitive run).

    oneDNN writes to the process's standard output (file descriptor 1) from C,
    so the descriptor is pointed at a temporary file for the call and restored.
    A PyTorch built without oneDNN gives an empty log (the step is not run).
    """
    if not torch.backends.mkldnn.is_available():
        return ""
    sys.stdout.flush()
    _flush_c_stdout()
    saved = os.dup(1)
    with tempfile.TemporaryFile(mode="w+") as log:
        os.dup2(log.fileno(), 1)
        try:
            with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
                step()
        finally:
            _flush_c_stdout()
            os.dup2(saved, 1)
            os.close(saved)
        log.seek(0)
        return log.read()


def parse_onednn_log(text: str) -> list[tuple[str, str, str, float]]:
    """(primitive, implementation, propagation kind, milliseconds) for each 'exec' line of a oneDNN verbose log."""
    runs = []
    for line in text.splitlines():
        fields = line.strip().split(",")
        if not fields or fields[0] != "onednn_verbose" or "exec" not in fields:
            continue
        at = fields.index("exec")
        if len(fields) < at + 6:
            continue
        try:
            milliseconds = float(fields[-1])
        except ValueError:
            continue
        runs.append((fields[at + 2], fields[at + 3], fields[at + 4], milliseconds))
    return runs


# ---------------------------------------------------------------- the report


@dataclass
class KernelTime:
    name: str = column("kernel")
    kernel_class: str = column("class")
    calls: int = column("calls", ",d")
    seconds: float = column("time", format_seconds)
    share: float = column("share", ".1%")


class KernelList(Report):
    """The kernels (or ops) with the most time, each with its class."""

    title = "Top kernels"


class OneDNNPrimitives(KernelList):
    """The oneDNN primitives one step ran on a CPU, named by implementation, each with its class."""

    title = "oneDNN primitives that ran"


@dataclass
class ClassShare:
    kernel_class: str = column("class")
    kernels: int = column("distinct kernels", ",d")
    calls: int = column("calls", ",d")
    seconds: float = column("time", format_seconds)
    share: float = column("share", ".1%")


class KernelTable(Report):
    """Time per class of kernel (or, on a CPU, of op), the top kernels, and on a CPU oneDNN's implementations."""

    title = "Which kernels ran: time by class"

    def __init__(self, rows, kernels: KernelList, onednn: OneDNNPrimitives | None, device: torch.device, label: str, notes,
                 step_seconds: list[float] | None = None):
        super().__init__(rows, notes)
        self.kernels, self.onednn, self.device, self.label = kernels, onednn, device, label
        self.step_seconds = list(step_seconds or [])  # wall time of each profiled step (profiler on)

    def compare_steps(self, other: "KernelTable") -> str:
        """How this step's profiled wall time compares with ``other``'s: a ratio of the medians, judged by the ranges."""
        mine, theirs = self.step_seconds, other.step_seconds
        if not mine or not theirs:
            return "no step times recorded"
        ratio = statistics.median(mine) / statistics.median(theirs)
        ranges = (f"{self.label} {format_seconds(min(mine))} to {format_seconds(max(mine))} a step, {other.label} "
                  f"{format_seconds(min(theirs))} to {format_seconds(max(theirs))}")
        outcome = range_verdict(mine, theirs)
        verdict = "a tie: the ranges overlap" if outcome == "a tie" else f"{outcome} in every step"
        return f"{self.label} took {ratio:.2f}x the time of {other.label} ({ranges}): {verdict}"

    def table(self) -> str:
        parts = [super().table(), self.kernels.table()]
        return "\n\n".join(parts + ([self.onednn.table()] if self.onednn is not None else []))

    def _repr_html_(self) -> str:
        parts = [super()._repr_html_(), self.kernels._repr_html_()]
        return "".join(parts + ([self.onednn._repr_html_()] if self.onednn is not None else []))

    @property
    def matrix_share(self) -> float:
        """The share of time in matrix products and convolutions (every GEMM/conv class)."""
        classes = (TENSOR_CORE, PLAIN_MATMUL) if is_gpu(self.device) else (CPU_GEMM, CPU_CONV, CPU_SLOW_CONV)
        return sum(r.share for r in self.rows if r.kernel_class in classes)

    def conclusions(self) -> list[str]:
        """Sentences drawn from the measured shares and names."""
        top = self.kernels.rows[0] if self.kernels.rows else None
        lines = [f"{self.label}: {self.matrix_share:.0%} of the {'kernel' if is_gpu(self.device) else 'op'} time went to "
                 f"matrix products and convolutions, {1 - self.matrix_share:.0%} to everything else"
                 + (f"; the largest single entry is {top.name[:60]} ({top.share:.0%}, {top.kernel_class})." if top else ".")]
        slow = None if is_gpu(self.device) else self.find(kernel_class=CPU_SLOW_CONV)
        if slow is not None and slow.seconds > 0:
            lines.append(f"{slow.share:.0%} of it went to ATen's fallback convolutions (_slow_conv2d: im2col and a GEMM), not "
                         "oneDNN's: for this dtype on this CPU, PyTorch chose no oneDNN convolution.")
        if is_gpu(self.device):
            tc, plain = self.find(kernel_class=TENSOR_CORE), self.find(kernel_class=PLAIN_MATMUL)
            lines.append(f"Tensor cores (by kernel name): {tc.share:.0%} of GPU time in {tc.kernels} kernels; GEMM/conv kernels "
                         f"whose name shows no tensor-core marker: {plain.share:.0%}.")
        elif self.onednn is not None and self.onednn.rows:
            implementations = sorted({r.name.split()[1] for r in self.onednn.rows if r.kernel_class in (CPU_GEMM, CPU_CONV)})
            lines.append("oneDNN implementations of its convolutions and matrix products: " + (", ".join(implementations) or "none")
                         + ("; 'brg' names are oneDNN's batch-reduce GEMM kernels" if any("brg" in i for i in implementations) else "")
                         + ("; 'amx' ones use the AMX matrix unit, the CPU's tensor core" if any("amx" in i for i in implementations) else "") + ".")
        return lines

    def plot(self, ax=None):
        shown = [r for r in self.rows if r.seconds > 0]
        return plots.horizontal_bars([r.kernel_class for r in shown], [100 * r.share for r in shown], ax,
                                     title=f"{self.label}: time by class", xlabel="% of kernel time" if is_gpu(self.device) else "% of op time")


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[: width - 3] + "..."


def _class_rows(timed: list[tuple[str, int, float]], device: torch.device, classes: tuple[str, ...]) -> tuple[list[ClassShare], list[KernelTime]]:
    whole = sum(t for _, _, t in timed) or 1.0
    kernels = sorted((KernelTime(_short(name), classify_kernel(name, device), calls, seconds, seconds / whole)
                      for name, calls, seconds in timed), key=lambda k: k.seconds, reverse=True)
    grouped: dict[str, list[KernelTime]] = defaultdict(list)
    for k in kernels:
        grouped[k.kernel_class].append(k)
    rows = [ClassShare(c, len(grouped[c]), sum(k.calls for k in grouped[c]), sum(k.seconds for k in grouped[c]),
                       sum(k.seconds for k in grouped[c]) / whole) for c in classes]
    return rows, kernels


def _robust_cpu_times(events) -> list[tuple[str, int, float]]:
    """(op, calls, seconds) per op name, the seconds being calls x the median self time of one call."""
    calls: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if event.device_type == DeviceType.CPU and not event.name.startswith("ProfilerStep") and event.name != STEP_RANGE:
            calls[event.name].append(event.self_cpu_time_total / 1e6)
    return [(name, len(times), len(times) * statistics.median(times)) for name, times in calls.items() if statistics.median(times) > 0]


def gpu_kernel_times(averages) -> list[tuple[str, int, float]]:
    """(kernel, calls, seconds) of every GPU kernel, copy and fill in ``key_averages()``, by GPU time; the GPU-side
    copies of record_function ranges (the optimizer's step, say) are left out, as they span kernels already counted."""
    return [(a.key, a.count, a.self_device_time_total / 1e6) for a in averages if is_gpu_kernel(a) and a.self_device_time_total > 0]


def kernels_by_class(step: Callable[[], object], steps: int = 5, device: str | torch.device | None = None, top: int = 8,
                     label: str = "step", onednn: bool = True, threads: int | None = None) -> KernelTable:
    """Profile ``steps`` calls of ``step`` (after one warm-up call) and sort what ran into classes by name.

    On a GPU the entries are the CUDA kernels, copies and fills, by GPU time;
    on a CPU they are the ATen ops by self CPU time (the profiler does not see
    inside oneDNN), and, with ``onednn``, one more step runs with oneDNN's log
    on, which names the implementation of every convolution, matrix product
    and layout reorder it ran (jit:avx512_core, brgemm:avx512_core_amx, ...).
    ``threads`` runs a CPU step on that many threads (None: leave the setting):
    a small step gains nothing from more, and on a busy machine each op would
    wait for its slowest thread.
    """
    device = pick_device(device)
    gpu = is_gpu(device)
    on_threads = None if gpu else threads
    with cpu_threads(on_threads):
        step()
        synchronize(device)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=activities) as prof:
            for _ in range(steps):
                with record_function(STEP_RANGE):
                    step()
                    synchronize(device)
        log = onednn_log(step) if onednn and not gpu else None
    if gpu:
        timed = gpu_kernel_times(prof.key_averages())
    else:
        timed = _robust_cpu_times(prof.events())
    rows, kernels = _class_rows(timed, device, GPU_CLASSES if gpu else CPU_CLASSES)
    what = ("CUDA kernels by GPU time" if gpu else "ATen ops by self CPU time (the CPU profiler's finest grain), each "
            "counted as calls x its median call, so that a pause of a busy machine inside one call does not inflate it")
    listing = KernelList(kernels[:top], [f"{len(kernels)} distinct {'kernels' if gpu else 'ops'}; the {min(top, len(kernels))} with the most time"])
    where = f"{device}" + (f", {on_threads} CPU thread{'s' if on_threads > 1 else ''}" if on_threads else "")
    notes = [f"{label}: {steps} profiled steps on {where}; {what}"]
    onednn_list = None
    if log is not None:
        merged: dict[str, list[float]] = defaultdict(list)
        for primitive, implementation, prop_kind, ms in parse_onednn_log(log):
            merged[f"{primitive} {implementation} ({prop_kind})"].append(ms / 1e3)
        whole = sum(sum(v) for v in merged.values()) or 1.0
        onednn_rows = sorted((KernelTime(name, classify_kernel(name, device), len(v), sum(v), sum(v) / whole) for name, v in merged.items()),
                             key=lambda k: k.seconds, reverse=True)
        onednn_list = OneDNNPrimitives(onednn_rows, ["one step with oneDNN's verbose log on: primitive, implementation (ISA), "
                                                     "propagation kind; times as oneDNN measured them"
                                                     + ("" if onednn_rows else "; none logged: the step used no oneDNN primitive, or this PyTorch has no oneDNN")])
    step_seconds = [e.time_range.elapsed_us() / 1e6 for e in prof.events() if e.name == STEP_RANGE and e.device_type == DeviceType.CPU]
    return KernelTable(rows, listing, onednn_list, device, label, notes, step_seconds)
