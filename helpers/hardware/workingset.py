"""Working sets beyond cache and RAM: time per training step against hidden size, with the caches marked.

``estimate_training_for`` times a few SGD steps of ``nettype(hidden)`` for each
hidden size, extrapolates to an epoch and to N epochs (as the lecture did), and
relates the time to the step's working set and this machine's cache sizes.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import psutil
import torch
from torch import nn
from tqdm.auto import tqdm

from helpers.core import plots
from helpers.core.device import is_gpu, pick_device
from helpers.core.memory import CATEGORIES, training_memory
from helpers.core.models import BasicFCModel
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import timeit

MNIST_TRAINING_IMAGES = 60_000
PAGE_BYTES = 4096
NOTICEABLE = 1.15  # a ratio closer to 1 than this is a tie on a busy machine (as helpers.hardware.kernels)
DEFAULT_HIDDEN = (64, 128, 256, 512, 1024, 2048, 4096, 6144, 8192, 12288, 16384)


@dataclass
class MemoryLevel:
    name: str
    bytes: int


def cpu_caches(cpu: int = 0) -> list[MemoryLevel]:
    """The data and unified caches of one CPU, smallest first, read from Linux's /sys (empty elsewhere)."""
    levels = []
    for index in sorted(Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*")):
        try:
            kind, level, size = ((index / name).read_text().strip() for name in ("type", "level", "size"))
        except OSError:
            continue
        if kind == "Instruction":
            continue
        units = {"K": 2**10, "M": 2**20, "G": 2**30}
        nbytes = int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
        levels.append(MemoryLevel(f"L{level}{'d' if kind == 'Data' else ''}", nbytes))
    return sorted(levels, key=lambda c: c.bytes)


def memory_levels(device: torch.device) -> list[MemoryLevel]:
    """The caches and main memory a training step on ``device`` can live in, smallest first."""
    if is_gpu(device):
        props = torch.cuda.get_device_properties(device)
        return [MemoryLevel("GPU L2", props.L2_cache_size), MemoryLevel("GPU memory", props.total_memory)]
    return [*cpu_caches(), MemoryLevel("RAM", psutil.virtual_memory().total)]


def training_working_set_bytes(model: nn.Module, example_input: torch.Tensor) -> int:
    """Peak bytes of the tensors of one plain-SGD training step (parameters, gradients, input, activations,
    temporaries), from ``helpers.core.memory.training_memory``: computed on fake tensors, nothing allocated. On a GPU
    the cuBLAS workspaces the estimate adds are left out: they are reserved once, not streamed by every step."""
    estimate = training_memory(model, example_input, "sgd")
    return sum(estimate.categories.get(c, 0) for c in CATEGORIES)


def _duration(seconds: float) -> str:
    """Seconds as s, min, h or days, whichever reads best."""
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:,.1f} {unit}"
    return format_seconds(seconds)


@dataclass
class SizePoint:
    hidden: int = column("hidden")
    parameters: int = column("parameters", ",")
    working_set_bytes: int = column("working set", format_bytes)
    fits_in: str = column("fits in")
    step_s: float = column("time per step", format_seconds)
    ns_per_parameter: float = column("ns / parameter / step", ".2f")
    page_faults_per_step: float | None = column("page faults / step", ",.0f")
    epoch_s: float = column("epoch (extrapolated)", format_seconds)
    estimate_s: float  # the whole training run
    estimate: dict[str, float] = column("{}", _duration, spread=True, default_factory=dict)  # {"<E> epochs": estimate_s}
    spread: float = 1.0  # median block over the fastest block of this size's timing: how much other work disturbed it

    @property
    def fresh_pages(self) -> bool:
        """True when each step faults in at least a MiB of new pages from the OS."""
        return bool(self.page_faults_per_step and self.page_faults_per_step * PAGE_BYTES >= 2**20)


class WorkingSetSweep(Report):
    """Per hidden size: the working set, where it fits, the measured step time, and the extrapolated training time."""

    def __init__(self, rows: Sequence[SizePoint], *, model_name: str, levels: list[MemoryLevel], device: torch.device, epochs: int, batch_size: int, steps_per_epoch: int, threads: int):
        self.model_name, self.levels, self.device = model_name, levels, device
        self.epochs, self.batch_size, self.steps_per_epoch, self.threads = epochs, batch_size, steps_per_epoch, threads
        self.title = f"{model_name}: training time against hidden size ({device}, batch {batch_size})"
        main = levels[-1]
        self.rows = list(rows)
        self.ram_hidden = _hidden_at(main.bytes, rows)
        notes = [
            f"Each step was timed on a batch kept in {device} memory ({_runs_on(device, threads)}; the fastest block of steps, as "
            f"other programs can only slow a block down); an epoch is "
            f"{steps_per_epoch:,} such steps (extrapolated, not run), and {epochs} epochs are {epochs} such epochs.",
            "Working set = the peak memory of one SGD step (training_memory: parameters, gradients, input, activations, temporaries). Once it outgrows a cache, every step streams "
            "it from the next, slower level; that costs time where the step is bound by memory traffic rather than arithmetic "
            "(a larger batch does more arithmetic per byte and hides it), so compare the time per parameter either side of the "
            "dashed lines. At the smallest sizes a fixed per-step overhead (Python, kernel launches) dominates instead.",
            *self._page_fault_note(),
            *self._steps_note(),
            f"{main.name} ({format_bytes(main.bytes)}) would fill at hidden size about {self.ram_hidden:,} (extrapolated). That "
            + ("is not run: past GPU memory the step stops with a CUDA out-of-memory error (GPU memory does not swap)."
               if is_gpu(device) else
               "is not run: a working set beyond RAM swaps to disk, or gets the process killed, and would take the machine down with it."),
        ]
        super().__init__(rows, notes)

    def _page_fault_note(self) -> list[str]:
        """A sentence on the sizes whose steps fault in fresh pages from the OS, if any did."""
        faulting = [r for r in self.rows if r.fresh_pages]
        if not faulting:
            return []
        return [
            f"From hidden {faulting[0].hidden:,} on (circled), each step also faults in fresh pages from the operating system "
            f"({faulting[0].page_faults_per_step:,.0f} per step, measured): a gradient that large is handed back to the OS when freed "
            "(glibc does so above 32 MiB), and the next step must have new, zeroed pages mapped in."
        ]

    def steps(self, noticeable: float = NOTICEABLE) -> list[tuple[SizePoint, SizePoint, float, str]]:
        """(smaller size, next size, ratio of their ns / parameter / step, verdict) for each step of hidden sizes.

        "rose" or "fell" when the ratio clears the noise bound (the larger of ``noticeable`` and both sizes' spreads of
        timed blocks), else "tie".
        """
        found = []
        for before, after in zip(self.rows, self.rows[1:]):
            ratio = after.ns_per_parameter / before.ns_per_parameter
            bound = max(noticeable, before.spread, after.spread)
            found.append((before, after, ratio, "rose" if ratio > bound else "fell" if 1 / ratio > bound else "tie"))
        return found

    def _steps_note(self) -> list[str]:
        """Time per parameter, step by step, read against the noise; the steps that cross a level boundary named."""
        if len(self.rows) < 2:
            return []
        lines = []
        for before, after, ratio, verdict in self.steps():
            bound = max(NOTICEABLE, before.spread, after.spread)
            where = (f"{before.fits_in} -> {after.fits_in}, a level boundary" if before.fits_in != after.fits_in
                     else f"both in {before.fits_in}")
            faults = "; fresh pages from the OS begin here" if after.fresh_pages and not before.fresh_pages else ""
            said = {"rose": f"rose {ratio:.2f}x", "fell": f"fell to {ratio:.2f}x", "tie": f"{ratio:.2f}x, a tie"}[verdict]
            lines.append(f"hidden {before.hidden:,} -> {after.hidden:,} ({where}{faults}): {said} (noise bound {bound:.2f}x)")
        steps = self.steps()
        onset = lambda a, b: b.fresh_pages and not a.fresh_pages  # noqa: E731 - fresh pages from the OS begin at this step
        crossing = [(a, b, v) for a, b, _, v in steps if a.fits_in != b.fits_in and not onset(a, b)]
        risen = [(a, b) for a, b, v in crossing if v == "rose"]
        faults = [(a, b) for a, b, _, v in steps if v == "rose" and onset(a, b)]
        if not crossing:
            verdict = "No step crossed a level boundary on its own: time more sizes to see one."
        elif risen:
            verdict = ("Time per parameter rose beyond the noise where the working set outgrew "
                       + ", ".join(f"{a.fits_in} (hidden {a.hidden:,} -> {b.hidden:,})" for a, b in risen)
                       + ": there each step streamed its weights from a slower level.")
            flat = [(a, b) for a, b, v in crossing if v != "rose"]
            if flat:
                verdict += " At " + ", ".join(f"{a.fits_in} -> {b.fits_in}" for a, b in flat) + " it did not."
        else:
            verdict = f"No level boundary raised the time per parameter beyond the noise here ({len(crossing)} crossed)."
        inside = [(a, b) for a, b, _, v in steps if v == "rose" and a.fits_in == b.fits_in and not onset(a, b)]
        if inside:
            verdict += (" It rose inside a level instead (" + ", ".join(f"{a.fits_in}, hidden {a.hidden:,} -> {b.hidden:,}" for a, b in inside)
                        + "): a cache shared with other cores (or, on a virtual machine, with other guests) can hold less than "
                        "its stated size, which moves the size where the time rises.")
        if faults:
            verdict += (" It rose where fresh pages from the OS began (" + ", ".join(f"hidden {a.hidden:,} -> {b.hidden:,}" for a, b in faults)
                        + "): a cost of mapping new memory, not of a cache level.")
        return ["Time per parameter, each size against the next: " + "; ".join(lines) + ".", verdict]

    def plot(self, ax=None):
        """Two panels: time per parameter against working set (caches marked), and epoch time against hidden size."""
        if ax is None:
            import matplotlib.pyplot as plt

            _, (left, right) = plt.subplots(1, 2, figsize=(12, 4.4))
        else:
            left, right = ax
        sets = [r.working_set_bytes / 2**20 for r in self.rows]
        plots.line_chart({"measured": (sets, [r.ns_per_parameter for r in self.rows])}, left, title="Time per parameter per step", xlabel="working set, MiB (log scale)", ylabel="ns per parameter", logx=True)
        faulting = [r for r in self.rows if r.fresh_pages]
        if faulting:
            left.scatter([r.working_set_bytes / 2**20 for r in faulting], [r.ns_per_parameter for r in faulting], s=90, facecolors="none", edgecolors=plots.color_for("wrong"), linewidths=1.5, label="fresh pages from the OS every step", zorder=3)
            left.legend(loc="lower left")
        left.set_ylim(bottom=0)
        for level in self.levels:
            if min(sets) / 2 <= level.bytes / 2**20 <= max(sets) * 2:
                plots.vertical_line(left, level.bytes / 2**20, f"{level.name} {format_bytes(level.bytes)}", color="#7f7f7f")
        hidden = [r.hidden for r in self.rows]
        best = min(self.rows, key=lambda r: r.ns_per_parameter)
        at_best_rate = [best.epoch_s * r.parameters / best.parameters for r in self.rows]
        reference = f"at the best rate ({best.ns_per_parameter:.2f} ns / parameter)"
        plots.line_chart(
            {"measured": (hidden, [r.epoch_s for r in self.rows]), reference: (hidden, at_best_rate)},
            right,
            styles={reference: ":"},
            title="Epoch time (extrapolated)",
            xlabel=f"hidden size (log scale); {self.levels[-1].name} would fill at ~{self.ram_hidden:,} (not run)",
            ylabel="seconds per epoch (log scale)",
            logx=True,
            logy=True,
        )
        for level in self.levels:
            h = _hidden_at(level.bytes, self.rows)
            if min(hidden) <= h <= max(hidden):
                plots.vertical_line(right, h, f"fills {level.name}", color="#7f7f7f")
        right.legend(loc="lower right")
        return left, right


def _runs_on(device: torch.device, threads: int) -> str:
    return torch.cuda.get_device_name(device) if is_gpu(device) else f"{threads} CPU thread{'s' if threads > 1 else ''}"


def _hidden_at(nbytes: int, rows: Sequence[SizePoint]) -> int:
    """The hidden size whose working set is ``nbytes``, interpolated (or extrapolated) linearly between measured sizes."""
    pairs = sorted((r.working_set_bytes, r.hidden) for r in rows)
    if len(pairs) == 1:  # one size measured: take the working set as proportional to it
        return round(pairs[0][1] * nbytes / pairs[0][0])
    lower = max([p for p in pairs if p[0] <= nbytes] or [pairs[0]])
    upper = min([p for p in pairs if p[0] > nbytes] or [pairs[-1]])
    if upper[0] == lower[0]:
        lower, upper = pairs[-2], pairs[-1]
    return round(lower[1] + (nbytes - lower[0]) * (upper[1] - lower[1]) / (upper[0] - lower[0]))


def estimate_training_for(
    nettype: Callable[[int], nn.Module] = BasicFCModel,
    hidden_sizes: Sequence[int] = DEFAULT_HIDDEN,
    epochs: int = 1000,
    batch_size: int = 8,
    dataset_size: int = MNIST_TRAINING_IMAGES,
    input_shape: Sequence[int] = (1, 28, 28),
    device: str | torch.device | None = None,
    threads: int = 1,
    min_run_time: float = 0.2,
    progress: bool = True,
) -> WorkingSetSweep:
    """For each hidden size, time plain-SGD steps of ``nettype(hidden)`` and estimate an epoch and ``epochs`` epochs.

    ``nettype`` must build a model from one hidden size (``BasicFCModel`` does).
    Steps run on one resident batch, so only the model's working set changes; an
    epoch is ceil(dataset_size / batch_size) steps. A small batch uses each weight
    only a few times per step, so the step is bound by memory and where the working
    set lives shows; ``threads=1`` keeps one core's private caches in play and the
    timing steadier on a busy machine. Page faults per step are counted too.
    """
    device = pick_device(device)
    levels = memory_levels(device)
    steps_per_epoch = math.ceil(dataset_size / batch_size)
    rows = []
    for hidden in tqdm(hidden_sizes, desc="hidden sizes", disable=not progress):
        try:
            model = nettype(hidden).to(device)
        except TypeError as err:
            raise TypeError(f"estimate_training_for builds nettype(hidden); {getattr(nettype, '__name__', nettype)} does not take a hidden size ({err}). Use e.g. BasicFCModel.") from None
        inputs = torch.randn(batch_size, *input_shape, device=device)
        targets = torch.randint(0, 10, (batch_size,), device=device)
        working_set = training_working_set_bytes(model, inputs)
        step = _sgd_step(model, inputs, targets)
        blocks = timeit(step, device=device, min_run_time=min_run_time, num_threads=threads).times
        step_s = min(blocks)  # the least disturbed block
        faults = None if is_gpu(device) else page_faults_per_call(step)
        parameters = sum(p.numel() for p in model.parameters())
        fits_in = next((lv.name for lv in levels if working_set <= lv.bytes), f"beyond {levels[-1].name}")
        epoch_s = step_s * steps_per_epoch
        rows.append(SizePoint(hidden, parameters, working_set, fits_in, step_s, step_s / parameters * 1e9, faults, epoch_s, epoch_s * epochs,
                              {f"{epochs} epochs": epoch_s * epochs}, statistics.median(blocks) / step_s))
        del model
    return WorkingSetSweep(rows, model_name=getattr(nettype, "__name__", "model"), levels=levels, device=device, epochs=epochs, batch_size=batch_size, steps_per_epoch=steps_per_epoch, threads=threads)


def page_faults_per_call(fn: Callable[[], None], calls: int = 3) -> float | None:
    """Minor page faults (pages the OS had to map in) per call of ``fn``, from getrusage; None where unavailable."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def _sgd_step(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> Callable[[], None]:
    """One training step; gradients are zeroed in place, not freed, so they stay part of the working set."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(inputs), targets).backward()
        optimizer.step()

    return step
