"""Memory of training: the working set per layer, one whole training step by category, and bytes per parameter.

``training_memory`` runs one training step (forward, loss, backward, optimizer step,
with the optimizer's state already created) on fake tensors under torch's MemTracker,
which follows every tensor's storage from birth to death and files it as parameter,
gradient, optimizer state, activation or temporary. Fake tensors hold no data, so the
estimate allocates nothing real and accepts meta-device models far bigger than RAM.
``measure_training_memory`` runs the same step for real, for checking the estimate
(and, beside MemTracker, reads the allocator itself: torch.profiler's memory events on
the CPU, ``torch.cuda.max_memory_allocated`` on a GPU).
"""
from __future__ import annotations

import contextlib
import copy
import gc
import os
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch
from torch import nn
from torch.optim.adam import adam

from helpers.core import plots
from helpers.core.fake import (
    ExampleInput,
    Placement,
    as_example,
    batch_size_of,
    explain_fake_failures,
    fake_run,
    first_device,
    leaf_modules,
    module_hooks,
    split_args,
    tensor_bytes,
)
from helpers.core.gpu_workspaces import BlasWorkspaces, blas_workspaces, live_workspaces
from helpers.core.report import Report, column, format_bytes
from helpers.core.step import default_loss, resolve_amp, tensors_in, training_step
from helpers.core.torch_adapters import mem_tracker, memory_history, profiler_memory
from helpers.core.torch_adapters.dispatch import TorchDispatchMode
from helpers.core.torch_adapters.optim_defaults import foreach_by_default
from helpers.core.torch_adapters.storage import storage_key

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "temporaries", "input")
PHASES = ("forward", "backward", "optimizer step")
CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of 512 bytes


# ---------------------------------------------------------------- the step's ingredients


def _sgd(params, foreach):
    return torch.optim.SGD(params, lr=0.01, foreach=foreach)


def _sgd_momentum(params, foreach):
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, foreach=foreach)


def _adam(params, foreach):
    return torch.optim.Adam(params, lr=1e-3, foreach=foreach)


OPTIMIZERS: dict[str, Callable] = {"sgd": _sgd, "sgd_momentum": _sgd_momentum, "adam": _adam}
OptimizerChoice = str | Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


def make_optimizer(optimizer: OptimizerChoice, params: list[nn.Parameter], foreach: bool | None) -> torch.optim.Optimizer:
    """An optimizer from its name (``OPTIMIZERS``) or from a factory taking the parameters."""
    if callable(optimizer):
        return optimizer(params)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {optimizer!r}; choose one of {sorted(OPTIMIZERS)} or pass a function params -> optimizer")
    return OPTIMIZERS[optimizer](params, foreach)


@dataclass
class _Step:
    """What one training step needs: the model, its inputs, the optimizer, the loss, the autocast dtype."""

    model: nn.Module
    args: tuple
    kwargs: dict
    optimizer: torch.optim.Optimizer
    loss_fn: Callable
    amp_dtype: torch.dtype | None

    def run(self, tracker: Any = None) -> dict[str, int]:
        """The kit's ``training_step`` (the loss freed before the update); returns the gradient bytes per device after backward."""
        grads: dict[str, int] = {}

        def on_phase(phase: str) -> None:
            if phase == "optimizer step":
                grads.update(_bytes_by_device(p.grad for p in self.model.parameters() if p.grad is not None))
            self._phase(tracker, phase)

        training_step(self.model, self.optimizer, self.kwargs or self.args, self.loss_fn, amp_dtype=self.amp_dtype,
                      on_phase=on_phase, keep_loss=False)
        return grads

    def create_optimizer_state(self) -> None:
        """One optimizer step on zero gradients, so the measured step is a steady-state one with its state in place."""
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    @staticmethod
    def _phase(tracker: Any, phase: str) -> None:
        if tracker is not None:
            tracker.phase = phase


def _bytes_by_device(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for t in tensors:
        totals[str(t.device)] = totals.get(str(t.device), 0) + tensor_bytes(t)
    return totals


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps (moments, master copies, step counters)."""
    return [v for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]


# ---------------------------------------------------------------- the report


@dataclass
class ModuleRow:
    module: str = column("module")
    parameters: int = column("parameters", format_bytes)
    output: int = column("output", format_bytes)
    forward_peak: int = column("peak in its forward", format_bytes)
    backward_peak: int = column("peak in its backward", format_bytes)


class ModuleMemory(Report):
    """Per module: its parameters, the output it returns, and the memory in use at its peak in forward and backward."""

    title = "Memory per module (MemTracker)"

    def plot(self, ax=None):
        rows = [r for r in self.rows if r.module != "(whole model)"]
        ax = plots.grouped_bars(
            [r.module for r in rows],
            {"peak in forward": [r.forward_peak for r in rows], "peak in backward": [r.backward_peak for r in rows]},
            ax,
            title="Memory in use at each module's peak",
            ylabel="memory in use",
        )
        plots.bytes_axis(ax)
        return ax


def _categorize(kinds: Mapping[str, int], state_bytes: int) -> dict[str, int]:
    """MemTracker's kinds (as ``torch_adapters.mem_tracker.by_kind`` names them) as the kit's categories;
    tensors the optimizer makes beyond its state are temporaries."""
    optimizer = kinds["optimizer state"]
    state = min(optimizer, state_bytes)
    return {
        "parameters": kinds["parameters"] + kinds["buffers"],
        "gradients": kinds["gradients"],
        "optimizer state": state,
        "activations": kinds["activations"],
        "temporaries": kinds["temporaries"] + optimizer - state,
        "input": kinds["other"],
    }


@dataclass
class CategoryBytes:
    """One category's bytes at the peak, per device."""

    category: str = column("category")
    at_peak: dict[str, int] = column("at the peak on {}", format_bytes, spread=True)


@dataclass(repr=False, eq=False)
class TrainingMemory(Report):
    """Memory of one training step: ``.peak_bytes``, ``.categories`` at the peak, ``.timeline``, ``.modules``.

    With several devices (a model split over GPUs) every figure is per device
    (``.peak_by_device``, ``.categories_by_device``) and ``.peak_bytes`` is the
    largest, the one that must fit.
    """

    model_name: str
    batch_size: int
    optimizer: str
    amp: str
    source: str
    param_count: int
    param_bytes: int
    grad_bytes: int
    state_bytes: int
    peak_by_device: dict[str, int]
    categories_by_device: dict[str, dict[str, int]]
    peak_phase_by_device: dict[str, str]
    timeline: list[tuple[str, dict[str, dict[str, int]]]]
    modules: ModuleMemory
    allocator: str | None = None
    allocator_peak_bytes: int | None = None
    extra_notes: list[str] = field(default_factory=list)

    def __post_init__(self):
        self.device = max(self.peak_by_device, key=self.peak_by_device.get)
        self.peak_bytes = self.peak_by_device[self.device]
        self.categories = self.categories_by_device[self.device]
        self.peak_phase = self.peak_phase_by_device[self.device]
        self.title = f"Training-step memory of {self.model_name}: batch {self.batch_size}, {self.optimizer}, {self.amp} ({self.source})"
        devices = list(self.peak_by_device)
        extra = [c for d in devices for c in self.categories_by_device[d] if c not in CATEGORIES]
        rows = [CategoryBytes(c, {d: self.categories_by_device[d].get(c, 0) for d in devices}) for c in [*CATEGORIES, *dict.fromkeys(extra)]]
        rows.append(CategoryBytes("peak", dict(self.peak_by_device)))
        notes = [
            f"Peak: {format_bytes(self.peak_bytes)} on {self.device}, during the {self.peak_phase}.",
            f"Persistent: parameters {format_bytes(self.param_bytes)} ({self.param_count:,}), gradients {format_bytes(self.grad_bytes)}, "
            f"optimizer state {format_bytes(self.state_bytes)}.",
        ]
        if self.allocator_peak_bytes is not None:
            gap = self.allocator_peak_bytes - self.peak_bytes
            notes.append(f"The allocator's own peak ({self.allocator}): {format_bytes(self.allocator_peak_bytes)}, "
                         f"{format_bytes(gap)} more than the tensors: workspaces that kernels allocate internally.")
        super().__init__(rows, notes + self.extra_notes)

    @property
    def workspace_bytes(self) -> int | None:
        """Allocator peak minus tensor peak (measured steps only): memory no tensor accounts for."""
        return None if self.allocator_peak_bytes is None else self.allocator_peak_bytes - self.peak_bytes

    def plot(self, ax=None, device: str | None = None):
        """Memory by category over the step, operator by operator, with the phases marked."""
        device = device or self.device
        series = [(phase, snap.get(device, dict.fromkeys(CATEGORIES, 0))) for phase, snap in self.timeline]
        x = list(range(len(series)))
        parts = {c: [s[c] for _, s in series] for c in CATEGORIES}
        for name, size in self.categories_by_device.get(device, {}).items():
            if name not in CATEGORIES:  # held through the whole step (cuBLAS workspaces on a GPU): a constant band
                parts[name] = [size] * len(series)
        spans, start = [], 0
        for i in range(1, len(series) + 1):
            if i == len(series) or series[i][0] != series[start][0]:
                spans.append((start, i - 1, series[start][0]))
                start = i
        ax = plots.stacked_area(x, parts, ax, spans=spans, title=f"{self.model_name}: memory through one training step",
                                xlabel="operator, in execution order", ylabel=f"memory on {device}")
        plots.bytes_axis(ax)
        plots.horizontal_line(ax, self.peak_by_device[device], f"peak {format_bytes(self.peak_by_device[device])}")
        return ax


def _module_rows(tracker: Any) -> list[ModuleRow]:
    rows = []
    for stats in mem_tracker.module_peaks(tracker):
        root, _, rest = stats.fqn.partition(".")
        rows.append(ModuleRow(rest or "(whole model)", stats.parameter_bytes, stats.output_bytes, stats.forward_peak, stats.backward_peak))
    return rows


def _report(step: _Step, tracker: Any, grads: dict[str, int], state_at_start: dict[str, int], *,
            model_name: str, batch_size: int, optimizer: OptimizerChoice, amp: str, source: str, **extra) -> TrainingMemory:
    timeline = [(phase, {d: _categorize(s, state_at_start.get(d, 0)) for d, s in snap.items()}) for phase, snap in tracker.timeline]
    peak_by_device: dict[str, int] = {}
    categories_by_device: dict[str, dict[str, int]] = {}
    phase_by_device: dict[str, str] = {}
    for name, snap in mem_tracker.peak_by_kind(tracker).items():
        peak_by_device[name] = snap["total"]
        categories_by_device[name] = _categorize(snap, state_at_start.get(name, 0))
    for name, peak in peak_by_device.items():
        phase_by_device[name] = next((phase for phase, snap in timeline if name in snap and sum(snap[name].values()) == peak), "forward")
    notes = list(extra.pop("extra_notes", []))
    for name in peak_by_device:
        if name.startswith("cuda"):
            workspaces = _blas_workspaces(name)
            categories_by_device[name][workspaces.label()] = workspaces.total
            peak_by_device[name] += workspaces.total
            notes.append(f"{workspaces.label()} on {name}: {format_bytes(workspaces.total)}, held by the caching allocator "
                         f"beside the tensors ({workspaces.source}). cuDNN picks a workspace per convolution call "
                         "(bounded by torch.backends.cudnn's limit); it is not included.")
    params = list(step.model.parameters())
    return TrainingMemory(
        model_name=model_name,
        batch_size=batch_size,
        optimizer=optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "custom optimizer"),
        amp=amp,
        source=source,
        param_count=sum(p.numel() for p in params),
        param_bytes=sum(tensor_bytes(p) for p in params) + sum(tensor_bytes(b) for b in step.model.buffers()),
        grad_bytes=sum(grads.values()),
        state_bytes=sum(state_at_start.values()),
        peak_by_device=peak_by_device,
        categories_by_device=categories_by_device,
        peak_phase_by_device=phase_by_device,
        timeline=timeline,
        modules=ModuleMemory(_module_rows(tracker)),
        extra_notes=notes,
        **extra,
    )


def _blas_workspaces(device_name: str) -> BlasWorkspaces:
    """The cuBLAS workspaces a training step holds on ``device_name``: live on a real GPU, else derived (Hopper defaults)."""
    if torch.cuda.is_available():
        return live_workspaces(torch.device(device_name))
    return blas_workspaces((9, 0), training=True)


def _amp_label(amp_dtype: torch.dtype | None, dtype: torch.dtype | None = None) -> str:
    if amp_dtype is not None:
        return f"AMP ({str(amp_dtype).replace('torch.', '')} autocast)"
    return str(dtype or torch.float32).replace("torch.", "")


# ---------------------------------------------------------------- estimate and measurement


def training_memory(
    model: nn.Module,
    example_input: ExampleInput | tuple[int, ...],
    optimizer: OptimizerChoice = "sgd",
    loss_fn: Callable | None = None,
    amp: bool | str = False,
    *,
    device: Placement = None,
    dtype: torch.dtype | None = None,
) -> TrainingMemory:
    """Estimate the memory of one whole training step of ``model`` on ``example_input``, allocating nothing real.

    The step is forward, ``loss_fn(output)`` (default: ``default_loss``, the fp32 sum of
    the output), backward, ``optimizer.step()`` and ``zero_grad``, with the optimizer's
    state created beforehand (a steady-state step). ``optimizer`` is "sgd",
    "sgd_momentum", "adam" or a function from parameters to an optimizer; ``amp`` runs
    forward under autocast (True: fp16 on GPUs, bf16 on CPUs). ``device`` places the
    model (default: where it is; meta means CPU), or maps module-name prefixes to
    devices for a model split over several; ``dtype`` casts parameters and inputs (pure
    low precision). Works on meta-device models and inputs; the model is not changed.
    """
    run = fake_run(model, example_input, placement=device, dtype=dtype, prepare=_check_devices_exist)
    fake_model, args, kwargs, example = run.model, run.args, run.kwargs, run.example
    input_device = first_device(fake_model)
    amp_dtype = resolve_amp(amp, input_device)
    with run.mode, explain_fake_failures(model):
        params = [p for p in fake_model.parameters() if p.requires_grad]
        step = _Step(fake_model, args, kwargs, make_optimizer(optimizer, params, foreach=foreach_by_default(params)),
                     loss_fn or default_loss, amp_dtype)
        step.create_optimizer_state()
        state = _bytes_by_device(optimizer_state_tensors(step.optimizer))
        tracker = mem_tracker.new_step_tracker()
        tracker.track_external(fake_model, step.optimizer, *args, *kwargs.values())
        with tracker:
            grads = step.run(tracker)
    return _report(step, tracker, grads, state, model_name=type(model).__name__, batch_size=batch_size_of(example),
                   optimizer=optimizer, amp=_amp_label(amp_dtype, dtype), source="estimate on fake tensors",
                   extra_notes=_known_gaps(model, input_device))


def _known_gaps(model: nn.Module, device: torch.device) -> list[str]:
    """Where fake execution is known to miss memory the real kernels take."""
    if device.type == "cpu" and any(isinstance(m, nn.RNNBase) for m in model.modules()):
        return ["Recurrent layers on the CPU run in oneDNN, which sizes its workspace (kept for backward) only when it runs: "
                "this estimate leaves it out, so a real step needs more. Check with measure_training_memory on a small batch."]
    return []


def _check_devices_exist(model: nn.Module) -> None:
    """Autograd needs a real CUDA context even for fake CUDA tensors, so CUDA placements need a visible GPU."""
    if any(p.device.type == "cuda" for p in model.parameters()) and not torch.cuda.is_available():
        raise ValueError(
            "device='cuda' needs a visible GPU even for an estimate (autograd opens a CUDA context). Estimate on the "
            "CPU instead: tensor sizes are the same; to mimic a GPU's optimizer, pass a factory with foreach=True."
        )


def _real_inputs(example: ExampleInput, device: torch.device) -> tuple[tuple, dict]:
    """Real tensors for a measurement: given ones as they are, meta ones filled with random values."""

    def real(t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "meta":
            return t.to(device)
        if t.is_floating_point():
            return torch.randn(t.shape, dtype=t.dtype, device=device)
        return torch.zeros(t.shape, dtype=t.dtype, device=device)

    args, kwargs = split_args(example)
    return tuple(real(a) for a in args), {k: real(v) for k, v in kwargs.items()}


def _live_bytes(tensors: Iterable[torch.Tensor], device: torch.device) -> int:
    """Bytes of the distinct storages behind ``tensors`` on ``device``, rounded as its allocator rounds blocks."""
    storages = {}
    for t in tensors:
        if t.device == device or (t.device.type == device.type == "cpu"):
            storage = t.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    if device.type == "cuda":
        return sum(-(-n // CUDA_BLOCK) * CUDA_BLOCK for n in storages.values())
    return sum(storages.values())


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence what C++ libraries print straight to file descriptor 2 (the profiler's start/stop lines)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class _AllocatorPeak:
    """The allocator's peak during a block, counting ``baseline`` bytes of tensors live when it starts.

    CPU: torch.profiler's memory events (every allocation and free through torch's CPU
    allocator, including buffers kernels allocate internally); what the profiler prints
    straight to file descriptor 2 during the block (e.g. frees of blocks allocated before
    it started) is silenced. CUDA:
    ``torch.cuda.max_memory_allocated``, less what was allocated beforehand and is not
    part of the step (other models, say). The cuBLAS workspaces the warm-up step created
    stay in: the step holds them throughout, and the estimate counts them too.
    """

    def __init__(self, device: torch.device, baseline: int):
        self.device, self.baseline = device, baseline
        self.peak: int | None = None
        self.source = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "torch.profiler CPU memory events"

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            workspaces = _blas_workspaces(str(self.device)).total
            self.untracked = torch.cuda.memory_allocated(self.device) - self.baseline - workspaces
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
            self.quiet = _quiet_native_stderr()
            self.quiet.__enter__()
            try:
                self.profiler.__enter__()
            except BaseException:
                self.quiet.__exit__(None, None, None)
                raise
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device) - self.untracked
            return False
        try:
            self.profiler.__exit__(*exc)
        finally:
            self.quiet.__exit__(None, None, None)
        self.peak = self.baseline + profiler_memory.peak_of(profiler_memory.cpu_allocations(self.profiler))
        return False


def peak_bytes(fn: Callable[[], Any], device: str | torch.device | None = None) -> tuple[int, Any]:
    """(the allocator's peak in bytes above what was live before ``fn()`` ran, what it returned).

    CPU: torch.profiler's memory events; CUDA: ``max_memory_allocated`` (cuBLAS's workspaces included).
    What the call returns is counted while it is live, as the caller holds it.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    with _AllocatorPeak(device, baseline=0) as probe:
        result = fn()
    return probe.peak, result


class _Created(TorchDispatchMode):
    """Weak references to every tensor a torch operation of this thread returns."""

    def __init__(self):
        super().__init__()
        self.created: list[weakref.ref] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (list, tuple)) else (out,):
            if isinstance(t, torch.Tensor):
                self.created.append(weakref.ref(t))
        return out


def bytes_kept(fn: Callable[[], Any], besides: Iterable[torch.Tensor] = (), settle_seconds: float = 0.1) -> tuple[int, Any]:
    """(bytes of the tensors created while ``fn()`` ran that are still alive after it, what it returned).

    Each storage is counted once, whatever views of it are alive; storages of ``besides`` (say, the parameters
    and their gradients) are left out. Sees the operations of this thread, on any device. A background thread
    may hold a tensor a moment after ``fn`` returns (gloo's workers hold a collective's buffers until they
    finish with them), so the count is taken again until it has not changed for ``settle_seconds`` (at most 5 s).
    """
    with _Created() as watch:
        result = fn()
    left_out = {storage_key(t) for t in besides}

    def alive() -> int:
        gc.collect()
        storages: dict[Any, int] = {}
        for ref in watch.created:
            tensor = ref()
            if tensor is not None and storage_key(tensor) not in left_out:
                storages[storage_key(tensor)] = tensor.untyped_storage().nbytes()
        return sum(storages.values())

    count, steady_since, deadline = alive(), time.monotonic(), time.monotonic() + 5.0
    while time.monotonic() - steady_since < settle_seconds and time.monotonic() < deadline:
        time.sleep(settle_seconds / 5)
        latest = alive()
        if latest != count:
            count, steady_since = latest, time.monotonic()
    return count, result


@dataclass
class AllocationTimeline:
    """Bytes live in the allocator over one run of some phases, from zero at the start, and where each phase began."""

    milliseconds: list[float]  # when each allocation or free happened (on a GPU: its index in the trace)
    live_bytes: list[int]
    phases: dict[str, float]  # phase -> when it began, on the same axis (empty on a GPU)
    source: str
    html: str | None = None  # on a GPU: the snapshot rendered by torch.cuda._memory_viz.trace_plot

    @property
    def peak(self) -> int:
        return max(self.live_bytes, default=0)

    def plot(self, ax=None):
        gpu = self.html is not None
        ax = plots.new_axes(ax, title="Bytes live during one training step", xlabel="allocator event" if gpu else "milliseconds",
                            ylabel="live", yunit="bytes")
        ax.step(self.milliseconds, self.live_bytes, where="post", color=plots.color_for("live"))
        for name, start in self.phases.items():
            plots.vertical_line(ax, start, name)
        return ax


def allocation_timeline(phases: Mapping[str, Callable[[], Any]], device: str | torch.device | None = None) -> AllocationTimeline:
    """Run each phase in order and record every allocation and free of the run.

    CPU: torch.profiler's memory events (each phase inside a ``record_function`` range, so the timeline shows where
    it began). CUDA: the allocator's own history (``torch.cuda.memory._record_memory_history``), also rendered as
    PyTorch's memory-viz HTML page.
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    if device.type == "cuda":
        return _cuda_timeline(phases, device)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True)
    with _quiet_native_stderr(), profiler:
        for name, phase in phases.items():
            with torch.profiler.record_function(f"phase: {name}"):
                phase()
    starts = profiler_memory.range_starts(profiler, "phase: ")
    allocations = profiler_memory.cpu_allocations(profiler)
    origin = min([*starts.values(), *(t for t, _ in allocations)], default=0)
    live, times, values = 0, [], []
    for t, nbytes in allocations:
        live += nbytes
        times.append((t - origin) / 1e6)
        values.append(live)
    return AllocationTimeline(times, values, {n: (t - origin) / 1e6 for n, t in starts.items()}, "torch.profiler CPU memory events")


def _cuda_timeline(phases: Mapping[str, Callable[[], Any]], device: torch.device) -> AllocationTimeline:
    torch.cuda.synchronize(device)
    memory_history.record_memory_history(max_entries=200_000)
    try:
        for phase in phases.values():
            phase()
        torch.cuda.synchronize(device)
        snapshot = memory_history.snapshot()
    finally:
        memory_history.stop_recording()
    values = memory_history.live_bytes(snapshot["device_traces"][device.index or 0])
    return AllocationTimeline(list(range(len(values))), values, {}, "torch.cuda.memory._record_memory_history", memory_history.trace_plot(snapshot))


def measure_training_memory(
    model: nn.Module,
    example_input: ExampleInput | tuple[int, ...],
    optimizer: OptimizerChoice = "sgd",
    loss_fn: Callable | None = None,
    amp: bool | str = False,
) -> TrainingMemory:
    """Run one real training step (as ``training_memory`` describes it) and measure its memory.

    Works on a copy of ``model``, so its weights do not change. A full warm-up step
    creates the optimizer's state; the next step is measured by MemTracker (tensors, by
    category) and by the allocator (``.allocator_peak_bytes``; see ``_AllocatorPeak``).
    """
    if any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers())):
        raise ValueError("measure_training_memory runs a real step, so the model must hold real weights (not on the meta device); use training_memory")
    real_model = copy.deepcopy(model).train()
    device = first_device(real_model)
    example = as_example(model, example_input)
    args, kwargs = _real_inputs(example, device)
    amp_dtype = resolve_amp(amp, device)
    params = [p for p in real_model.parameters() if p.requires_grad]
    step = _Step(real_model, args, kwargs, make_optimizer(optimizer, params, foreach=None), loss_fn or default_loss, amp_dtype)
    step.run()  # warm-up: creates the optimizer's state (and, on a GPU, cuBLAS workspaces)
    state = _bytes_by_device(optimizer_state_tensors(step.optimizer))
    tracker = mem_tracker.new_step_tracker()
    tracker.track_external(real_model, step.optimizer, *args, *kwargs.values())
    baseline = _live_bytes([*real_model.parameters(), *real_model.buffers(), *optimizer_state_tensors(step.optimizer), *args, *kwargs.values()], device)
    allocator = _AllocatorPeak(device, baseline) if device.type in ("cpu", "cuda") else None
    with allocator or contextlib.nullcontext(), tracker:
        grads = step.run(tracker)
    return _report(step, tracker, grads, state, model_name=type(model).__name__, batch_size=batch_size_of(example),
                   optimizer=optimizer, amp=_amp_label(amp_dtype), source=f"measured: one real step on {device}",
                   allocator=allocator.source if allocator else None, allocator_peak_bytes=allocator.peak if allocator else None)


# ---------------------------------------------------------------- working sets per layer


@dataclass
class LayerMemRow:
    """One layer's working set; the gradient parts are None (and not shown) for inference."""

    layer: str = column("layer")
    type: str = column("type")
    inputs: int = column("inputs", format_bytes)
    weights: int = column("weights", format_bytes)
    outputs: int = column("outputs", format_bytes)
    weight_gradients: int | None = column("weight gradients", format_bytes, optional=True, default=None)
    output_gradients: int | None = column("output gradients", format_bytes, optional=True, default=None)
    total: int = column("working set", format_bytes, init=False)
    output_shape: tuple = ()

    def __post_init__(self):
        self.total = self.inputs + self.weights + self.outputs + (self.weight_gradients or 0) + (self.output_gradients or 0)


WORKING_SET_PARTS = {"inference": ("inputs", "weights", "outputs"),
                     "training": ("inputs", "weights", "outputs", "weight_gradients", "output_gradients")}


class LayerMemory(Report):
    """Each layer's working set: the bytes of its inputs, weights and outputs (training: and their gradients)."""

    def __init__(self, rows: list[LayerMemRow], mode: str, model_name: str, input_shapes: list[tuple]):
        self.mode, self.model_name, self.parts = mode, model_name, WORKING_SET_PARTS[mode]
        self.largest = max(rows, key=lambda r: r.total)
        self.title = f"Working set per layer of {model_name} ({mode}, input {', '.join(map(str, input_shapes))})"
        notes = [f"Largest working set: {self.largest.layer} ({self.largest.type}), {format_bytes(self.largest.total)}."]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        short = [r.layer.rsplit(".", 1)[-1] for r in self.rows]
        names = short if len(set(short)) == len(short) else [r.layer for r in self.rows]
        ax = plots.stacked_bars(names, {p.replace("_", " "): [getattr(r, p) for r in self.rows] for p in self.parts},
                                ax, title=f"{self.model_name}: working set per layer ({self.mode})", ylabel="working set")
        plots.bytes_axis(ax)
        return ax


def _layer_rows(model: nn.Module, shape: Any, mode: str) -> tuple[list[LayerMemRow], list[tuple], ExampleInput]:
    """One forward pass on fake tensors, recording each leaf layer's input, weight and output bytes."""
    if mode not in WORKING_SET_PARTS:
        raise ValueError(f"mode must be 'inference' or 'training', got {mode!r}")
    run = fake_run(model, shape, training=mode == "training")
    rows: list[LayerMemRow] = []

    def record(name: str, module: nn.Module, inputs, output) -> None:
        ins = tensors_in(inputs)
        read = {storage_key(t) for t in ins}
        # an in-place layer (ReLU(inplace=True)) writes over its input: its output takes no memory of its own
        outs = [t for t in tensors_in(output) if storage_key(t) not in read]
        out_bytes = sum(tensor_bytes(t) for t in outs)
        training = mode == "training"
        rows.append(LayerMemRow(
            name, type(module).__name__,
            inputs=sum(tensor_bytes(t) for t in ins),
            weights=sum(tensor_bytes(t) for t in (*module.parameters(), *module.buffers())),
            outputs=out_bytes,
            weight_gradients=sum(tensor_bytes(p) for p in module.parameters() if p.requires_grad) if training else None,
            output_gradients=sum(tensor_bytes(t) for t in tensors_in(output)) if training else None,
            output_shape=tuple(output.shape) if isinstance(output, torch.Tensor) else (),
        ))

    with module_hooks(leaf_modules(run.model), after=record), run.mode, torch.no_grad(), explain_fake_failures(model, "profiled"):
        run.model(*run.args, **run.kwargs)
    if not rows:
        raise ValueError(f"{type(model).__name__} ran no layers (modules) in its forward; nothing to profile")
    return rows, run.input_shapes, run.example


def profile_layer_mem(model: nn.Module, shape: Any = None, mode: str = "inference") -> LayerMemory:
    """Per layer, the bytes of its inputs, weights and outputs (``mode="training"`` adds weight and output gradients).

    ``shape`` is the input's shape (batch first) or example input tensors; by default one
    sample of ``model.input_shape``. Runs on fake tensors: no memory, meta models welcome.
    """
    rows, shapes, _ = _layer_rows(model, shape, mode)
    return LayerMemory(rows, mode, type(model).__name__, shapes)


@dataclass
class MemoryPart:
    part: str = column("part")
    bytes: int = column("bytes", format_bytes)
    share: float = column("share (%)", ".1f")


class MemoryShares(Report):
    """The shares of input, parameters, activations (and gradients) in a model's memory, by count of tensors."""

    def __init__(self, shares: dict[str, int], mode: str, model_name: str):
        self.shares, self.mode, self.model_name = shares, mode, model_name
        self.total = sum(shares.values())
        self.title = f"Memory of {model_name} by part ({mode})"
        rows = [MemoryPart(k, v, 100 * v / self.total) for k, v in shares.items()]
        notes = ["Activations = every layer's output, each counted once; a count of tensors, not a peak "
                 "(training_memory measures the peak of a real training step)."]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        return plots.pie_chart(self.shares, ax, title=f"{self.model_name}: memory by part ({self.mode})")


def profile_mem(model: nn.Module, shape: Any = None, mode: str = "inference") -> MemoryShares:
    """Shares of input, parameters and activations (``mode="training"``: and parameter gradients), as a pie chart."""
    rows, _, example = _layer_rows(model, shape, mode)
    args, kwargs = split_args(example)
    params = [p for p in model.parameters()]
    shares = {
        "input": sum(tensor_bytes(t) for t in (*args, *kwargs.values())),
        "parameters": sum(tensor_bytes(p) for p in params) + sum(tensor_bytes(b) for b in model.buffers()),
        "activations": sum(r.outputs for r in rows),
    }
    if mode == "training":
        shares["gradients"] = sum(tensor_bytes(p) for p in params if p.requires_grad)
    return MemoryShares(shares, mode, type(model).__name__)


# ---------------------------------------------------------------- bytes per parameter


class MasterWeightAdam(torch.optim.Optimizer):
    """Adam on fp32 master copies of the parameters (the apex "O2" / Megatron layout for half-precision models).

    The model holds (possibly fp16/bf16) weights and gets gradients of the same type; the
    update runs on fp32 masters, with fp32 moments, and the result is copied back into the
    model after every step. ``master_device`` keeps masters and moments elsewhere (e.g. the
    host: lecture 4's ``OffloadedAdam`` writes the same idea out in a cell); by default they sit beside each parameter.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 master_device: str | torch.device | None = None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))
        self.master_device = None if master_device is None else torch.device(master_device)

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                home, state = self.master_device or p.device, self.state[p]
                if not state:
                    master = p.detach().to(home, torch.float32, copy=True)
                    state.update(step=torch.tensor(0.0), master=master,  # a scalar tensor, as torch.optim.Adam keeps it
                                 exp_avg=torch.zeros_like(master), exp_avg_sq=torch.zeros_like(master))
                grad = p.grad.to(home, torch.float32)  # device -> host when the masters are elsewhere
                adam([state["master"]], [grad], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]], foreach=False,
                     amsgrad=False, beta1=beta1, beta2=beta2, lr=group["lr"], weight_decay=0.0, eps=group["eps"], maximize=False)
                p.copy_(state["master"])  # and back, into the model's own dtype


@dataclass
class BytesPerParamRow:
    setup: str = column("setup")
    label: str  # short, for the chart
    weights: int = column("weights")
    master_weights: int = column("fp32 master")
    gradients: int = column("gradients")
    optimizer_state: int = column("optimizer state")
    theory: int = column("total")
    measured: float = column("measured", ".2f")


class BytesPerParam(Report):
    """Bytes each parameter costs in training, by setup: theory, and ``training_memory`` on a real model."""

    title = "Bytes per parameter in training"

    def plot(self, ax=None):
        parts = {"weights": [r.weights for r in self.rows], "fp32 master weights": [r.master_weights for r in self.rows],
                 "gradients": [r.gradients for r in self.rows], "optimizer state": [r.optimizer_state for r in self.rows]}
        return plots.stacked_bars([r.label for r in self.rows], parts, ax, title=self.title, ylabel="bytes per parameter")


def bytes_per_param(model: nn.Module | None = None, example_input: Any = None) -> BytesPerParam:
    """Bytes per parameter for fp32 SGD, SGD with momentum, Adam, and mixed-precision Adam in two layouts.

    Mixed precision saves nothing per parameter (16 B, like fp32 Adam): the fp16 weights
    and gradients are joined by an fp32 master copy, or (torch.autocast) the weights stay
    fp32 and the half copies live only as activations. Its savings are in activations.
    The "measured" column is (parameters + gradients + optimizer state) / parameters from
    ``training_memory`` on ``model`` (default: LeNet).
    """
    from helpers.core.models import LeNet

    model = model if model is not None else LeNet()
    example = as_example(model, example_input)
    setups = [
        ("fp32, SGD", "SGD", (4, 0, 4, 0), dict(optimizer="sgd")),
        ("fp32, SGD with momentum", "SGD+momentum", (4, 0, 4, 4), dict(optimizer="sgd_momentum")),
        ("fp32, Adam", "Adam", (4, 0, 4, 8), dict(optimizer="adam")),
        ("mixed precision, Adam, fp32 master copy", "AMP Adam\n(master copy)", (2, 4, 2, 8), dict(optimizer=MasterWeightAdam, dtype=torch.float16)),
        ("mixed precision, Adam, torch.autocast", "AMP Adam\n(autocast)", (4, 0, 4, 8), dict(optimizer="adam", amp=True)),
    ]
    rows, count = [], sum(p.numel() for p in model.parameters())
    if not count:
        raise ValueError(f"{type(model).__name__} has no parameters")
    for name, label, (weights, master, grads, state), kwargs in setups:
        report = training_memory(model, example, **kwargs)
        measured = (report.param_bytes + report.grad_bytes + report.state_bytes) / count
        rows.append(BytesPerParamRow(name, label, weights, master, grads, state, weights + master + grads + state, measured))
    notes = [
        "Mixed precision saves nothing per parameter: with a master copy, fp16 weights (2 B) and gradients (2 B) come "
        "with an fp32 copy (4 B) for the update; torch.autocast keeps fp32 weights and gradients and makes half "
        "copies of the weights in every forward, held as activations. The savings are in the activations.",
        f"Measured on {type(model).__name__} ({count:,} parameters) with training_memory: "
        "(parameters + gradients + optimizer state) / parameters; there the fp32 master copy is optimizer state.",
    ]
    return BytesPerParam(rows, notes)
