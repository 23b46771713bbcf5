"""Out of memory, explained: will one training step at this batch fit a memory budget, and which batch does.

``fit_batch`` asks ``training_memory`` before anything runs, finds the largest batch
that fits with a binary search over it, and, given the real step, runs it only when it
fits and turns an out-of-memory error into an explanation instead of a crashed notebook.
On a CPU, pass a stated budget (e.g. "512 MiB") rather than exhausting the machine.
"""
from __future__ import annotations

from typing import Any, Callable

import psutil
import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import Fact, is_gpu
from helpers.core.fake import ExampleInput, as_example, batch_size_of, first_device, with_batch
from helpers.core.memory import CATEGORIES, OptimizerChoice, TrainingMemory, training_memory
from helpers.core.report import Report, format_bytes


def parse_bytes(size: int | float | str) -> int:
    """Bytes from a number or a string such as '512 MiB', '3 GiB' or '2.5 GB' (GB = 10^9 B, GiB = 2^30 B)."""
    if isinstance(size, (int, float)):
        return int(size)
    units = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
    text = str(size).strip().upper().replace(" ", "")
    number = text.rstrip("KMGTIB")
    unit = text[len(number):] or "B"
    try:
        return int(float(number) * units[unit])
    except (KeyError, ValueError):
        raise ValueError(f"cannot read {size!r} as a size; write e.g. 512 MiB, 3 GiB or 2.5 GB") from None


def largest_batch(peak_of: Callable[[int], int], budget_bytes: int, hint: int = 64, limit: int = 2**24) -> tuple[int, dict[int, int]]:
    """The largest batch size whose ``peak_of(batch)`` fits in ``budget_bytes`` (0 if even 1 does not), and every peak probed.

    A binary search over batch sizes whose probes are aimed where the straight line
    through the two nearest probes meets the budget (a training step's memory grows
    almost linearly with the batch), so it usually ends after four or five probes; after
    a few probes that do not land it falls back to plain bisection.
    """
    peaks: dict[int, int] = {}

    def fits(batch: int) -> bool:
        if batch not in peaks:
            peaks[batch] = peak_of(batch)
        return peaks[batch] <= budget_bytes

    if not fits(1):
        return 0, peaks
    lo, hi, probe = 1, None, min(max(hint, 2), limit)
    while lo < limit and (hi is None or hi - lo > 1):
        if fits(probe):
            lo = probe
        else:
            hi = probe
        aimed = _aim(peaks, budget_bytes, lo, hi)
        upper = hi if hi is not None else limit + 1
        probe = aimed if lo < aimed < upper and len(peaks) < 8 else (lo + upper) // 2 if hi is not None else min(2 * lo, limit)
    return lo, peaks


def _aim(peaks: dict[int, int], budget: int, lo: int, hi: int | None) -> int:
    """Where the line through probe ``lo`` and its nearest other probe reaches the budget (at least lo + 1)."""
    others = [b for b in peaks if b != lo]
    if not others:
        return 2 * lo
    other = hi if hi is not None else max(others)
    slope = (peaks[other] - peaks[lo]) / (other - lo)
    if slope <= 0:
        return 2 * lo
    return max(lo + 1, lo + int((budget - peaks[lo]) / slope))


class BatchFit(Report):
    """Whether one training step at a batch size fits a memory budget, why not, and the largest batch that does."""

    title = "Will this batch fit?"

    def __init__(self, *, model_name: str, batch_size: int, estimate: TrainingMemory, budget_bytes: int, budget_source: str,
                 largest_batch: int, peaks: dict[int, int], ran: bool = False, error: str | None = None, result: Any = None):
        self.model_name, self.batch_size, self.estimate = model_name, batch_size, estimate
        self.peak_bytes, self.budget_bytes, self.budget_source = estimate.peak_bytes, budget_bytes, budget_source
        self.fits = self.peak_bytes <= budget_bytes
        self.largest_batch, self.peaks = largest_batch, dict(sorted(peaks.items()))
        self.largest_peak_bytes = self.peaks.get(largest_batch)
        self.ran, self.error, self.result = ran, error, result
        cats = estimate.categories
        biggest = max(cats, key=cats.get)
        rows = [
            Fact("model", model_name),
            Fact("batch size asked", f"{batch_size:,}"),
            Fact("memory one training step needs", format_bytes(self.peak_bytes)),
            Fact(f"  of which {biggest} (largest part)", f"{format_bytes(cats[biggest])} ({100 * cats[biggest] / self.peak_bytes:.0f}%)"),
            Fact("memory budget", f"{format_bytes(budget_bytes)} ({budget_source})"),
            Fact("fits", "yes" if self.fits else "no"),
            Fact("largest batch that fits", f"{largest_batch:,}" + (f" (needs {format_bytes(self.largest_peak_bytes)})" if largest_batch else "")),
        ]
        if ran or error:
            rows.append(Fact("real step", "ran" if ran else f"failed: {error}"))
        super().__init__(rows, [self.explanation()])

    def explanation(self) -> str:
        if self.error:
            return (f"The step ran out of memory although its tensors ({format_bytes(self.peak_bytes)}) fit the budget: "
                    "memory that is not tensors (CUDA context, kernel workspaces, allocator fragmentation) took the rest. "
                    f"Try a smaller batch, e.g. {max(1, int(self.largest_batch * 0.8)):,}.")
        if self.fits:
            return f"Batch {self.batch_size:,} fits, with {format_bytes(self.budget_bytes - self.peak_bytes)} to spare."
        if not self.largest_batch:
            est = self.estimate
            fixed = {"parameters, gradients and optimizer state": est.param_bytes + est.grad_bytes + est.state_bytes,
                     **{name: size for name, size in est.categories.items() if name not in CATEGORIES}}  # e.g. cuBLAS workspaces
            parts = " and ".join(f"{format_bytes(size)} of {name}" for name, size in fixed.items() if size)
            return (f"Not even a batch of 1 fits: one step at batch 1 needs {format_bytes(self.peaks[1])}, and of that, {parts} "
                    "do not shrink with the batch. Use a smaller model, lower precision, a larger budget, or split the model over devices.")
        return (f"Batch {self.batch_size:,} does not fit: one step needs {format_bytes(self.peak_bytes)}, "
                f"{format_bytes(self.peak_bytes - self.budget_bytes)} more than the budget. The largest batch that fits is "
                f"{self.largest_batch:,}; to train on {self.batch_size:,} samples per update anyway, accumulate gradients over "
                f"{-(-self.batch_size // self.largest_batch)} smaller batches, or use mixed precision for smaller activations.")

    def plot(self, ax=None):
        ax = plots.line_chart({"one training step": (list(self.peaks), list(self.peaks.values()))}, ax, logx=True,
                              title=f"{self.model_name}: memory against batch size", xlabel="batch size", ylabel="peak memory")
        plots.bytes_axis(ax)
        plots.horizontal_line(ax, self.budget_bytes, f"budget {format_bytes(self.budget_bytes)}", color="#d62728")
        ax.scatter([self.batch_size], [self.peak_bytes], color="#d62728", zorder=3, label=f"asked: {self.batch_size:,}")
        if self.largest_batch:
            ax.scatter([self.largest_batch], [self.largest_peak_bytes], color="#2ca02c", zorder=3, label=f"largest that fits: {self.largest_batch:,}")
        ax.legend(loc="upper left")
        return ax


def _default_budget(device: torch.device) -> tuple[int, str]:
    if is_gpu(device):
        free, _total = torch.cuda.mem_get_info(device)
        return free, f"free memory on {device}"
    return psutil.virtual_memory().available, "available RAM"


def _is_out_of_memory(err: BaseException) -> bool:
    """CUDA raises torch.OutOfMemoryError; torch's CPU allocator raises a RuntimeError saying it can't allocate memory."""
    return isinstance(err, (torch.OutOfMemoryError, MemoryError)) or "allocate memory" in str(err) or "out of memory" in str(err)


def fit_batch(
    model: nn.Module,
    example_input: ExampleInput | tuple[int, ...],
    budget: int | str | None = None,
    optimizer: OptimizerChoice = "sgd",
    loss_fn: Callable | None = None,
    amp: bool | str = False,
    step: Callable[[], Any] | None = None,
) -> BatchFit:
    """Check that one training step at this batch fits ``budget`` before running anything; explain when it does not.

    ``budget`` is bytes or a size such as "512 MiB" (default: free GPU memory, or the
    available RAM on a CPU). The estimate comes from ``training_memory``; the largest
    batch that fits from a binary search over it. Given ``step`` (a function running the
    real work), it is called only when the batch fits, and an out-of-memory error it
    raises is caught and explained rather than raised, so a notebook never crashes.
    """
    example = as_example(model, example_input)
    device = first_device(model)
    budget_bytes, source = _default_budget(device) if budget is None else (parse_bytes(budget), "stated budget")
    settings = dict(optimizer=optimizer, loss_fn=loss_fn, amp=amp)
    batch = batch_size_of(example)
    estimate = training_memory(model, example, **settings)
    best, peaks = largest_batch(lambda b: training_memory(model, with_batch(example, b), **settings).peak_bytes, budget_bytes, hint=batch)
    peaks[batch] = estimate.peak_bytes
    ran, error, result = False, None, None
    if step is not None and estimate.peak_bytes <= budget_bytes:
        try:
            result, ran = step(), True
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as err:
            if not _is_out_of_memory(err):
                raise
            error = str(err).splitlines()[0]
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    return BatchFit(model_name=type(model).__name__, batch_size=batch, estimate=estimate, budget_bytes=budget_bytes, budget_source=source,
                    largest_batch=best, peaks=peaks, ran=ran, error=error, result=result)
