"""Saving memory on one device, measured: activation checkpointing, gradient accumulation, mixed precision.

Each technique is compared with plain training on the same model through ``training_memory``
(one training step on fake tensors, by category), with a real step beside it where that is
cheap: its memory under MemTracker (``measure_training_memory``), its time (``time_interleaved``: the
fastest of interleaved rounds), and, for accumulation, a check that the gradients equal those of one big batch.
"""
from __future__ import annotations

import copy
import textwrap
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import cpu_threads as threads_for_cpu
from helpers.core.fake import ExampleInput, first_device, split_args, with_batch
from helpers.core.memory import (
    CATEGORIES,
    MasterWeightAdam,
    OptimizerChoice,
    TrainingMemory,
    make_optimizer,
    measure_training_memory,
    training_memory,
)
from helpers.core.models import transformer_lm
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.step import forward_backward, resolve_amp, training_step
from helpers.core.timing import time_interleaved


def demo_transformer(layers: int = 6, width: int = 128, seq_len: int = 128, vocab: int = 512, seed: int = 0) -> nn.Module:
    """The lecture's model: a small GPT-style transformer whose training memory is mostly activations."""
    torch.manual_seed(seed)
    return transformer_lm("tiny", d_model=width, n_layers=layers, max_len=seq_len, vocab_size=vocab)


def mean_square_loss(output: torch.Tensor) -> torch.Tensor:
    """A loss that averages over the batch (as cross-entropy does), so micro-batch losses must be scaled by 1/k."""
    return output.float().pow(2).mean()


# ---------------------------------------------------------------- the comparison report


@dataclass
class SetupMemory:
    """One setup's training step: memory at the peak by category, and what a real run showed."""

    setup: str = column("setup")
    parameters: int = column("parameters", format_bytes)
    gradients: int = column("gradients", format_bytes)
    optimizer_state: int = column("optimizer state", format_bytes)
    activations: int = column("activations", format_bytes)
    other: int = column("temporaries and input", format_bytes)  # temporaries and the input
    peak: int = column("peak (estimate)", format_bytes)
    workspaces: int | None = column("of which kernel workspaces", format_bytes, optional=True, default=None)  # cuBLAS's, on a GPU
    # what a real run showed: each column is shown only where some setup has it
    micro_batch: int | None = column("micro-batch", ",", optional=True, default=None)
    measured_peak: int | None = column("peak, real step", format_bytes, optional=True, default=None)
    seconds: float | None = column("time per update", format_seconds, optional=True, default=None)
    same_gradients: bool | None = column("same gradients as one batch", optional=True, default=None)

    @classmethod
    def from_report(cls, setup: str, report: TrainingMemory, **measured) -> "SetupMemory":
        c = report.categories
        workspaces = sum(size for name, size in c.items() if name not in CATEGORIES)
        return cls(setup, parameters=c["parameters"], gradients=c["gradients"], optimizer_state=c["optimizer state"],
                   activations=c["activations"], other=c["temporaries"] + c["input"], workspaces=workspaces or None,
                   peak=report.peak_bytes, **measured)

# the categories at the peak: field -> its name in charts (which picks its colour in helpers.core.plots)
PARTS = {"parameters": "parameters", "gradients": "gradients", "optimizer_state": "optimizer state", "activations": "activations",
         "other": "temporaries and input", "workspaces": "kernel workspaces"}


class MemoryComparison(Report):
    """Training-step memory of several setups of one model, side by side; ``.find(setup=...)``, ``.plot()``."""

    def __init__(self, rows: list[SetupMemory], title: str, notes: Sequence[str] = ()):
        self.title = title
        if any(r.seconds is not None for r in rows):
            notes = [*notes, "Time per update: one real optimizer update, the fastest of interleaved rounds on one CPU thread "
                             "(time_interleaved; on a GPU, the GPU's time)."]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        """Each setup's memory at its peak, stacked by category; a real step's peak as a marker where measured."""
        names = [textwrap.fill(r.setup, 16) for r in self.rows]
        parts = {name: [getattr(r, p) or 0 for r in self.rows] for p, name in PARTS.items()}
        parts = {name: values for name, values in parts.items() if any(values)}
        ax = plots.stacked_bars(names, parts, ax, title=self.title, ylabel="memory at the peak")
        measured = [(i, r.measured_peak) for i, r in enumerate(self.rows) if r.measured_peak is not None]
        if measured:
            ax.plot([i for i, _ in measured], [m for _, m in measured], "kD", label="peak of a real step")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
        plots.bytes_axis(ax)
        return ax


# ---------------------------------------------------------------- a real update, for timing and checks


def accumulate(model: nn.Module, example: ExampleInput, micro_batches: int, loss_fn: Callable = mean_square_loss,
               amp: bool | str = False) -> None:
    """Forward and backward over ``micro_batches`` equal slices of the batch, each loss scaled by 1/k: ``.grad`` then
    holds the gradient of the whole batch's (mean) loss (the kit's ``forward_backward``)."""
    forward_backward(model, example, loss_fn, amp_dtype=resolve_amp(amp, first_device(model)), micro_batches=micro_batches,
                     keep_loss=False)


def update_function(model: nn.Module, example: ExampleInput, optimizer: OptimizerChoice = "adam", loss_fn: Callable = mean_square_loss,
                    amp: bool | str = False, micro_batches: int = 1) -> Callable[[], None]:
    """One real optimizer update of a copy of ``model`` on ``example`` (accumulated over ``micro_batches``), as a function to time."""
    model = copy.deepcopy(model).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = make_optimizer(optimizer, params, foreach=None)
    real_example = _on_device(example, first_device(model))
    amp_dtype = resolve_amp(amp, first_device(model))

    def update() -> None:
        training_step(model, opt, real_example, loss_fn, amp_dtype=amp_dtype, micro_batches=micro_batches, keep_loss=False)

    return update


def _on_device(example: ExampleInput, device: torch.device) -> ExampleInput:
    args, kwargs = split_args(example)
    if kwargs:
        return {k: v.to(device) for k, v in kwargs.items()}
    moved = [a.to(device) for a in args]
    return moved[0] if isinstance(example, torch.Tensor) else type(example)(moved)


def real_step_peak(model: nn.Module, example: ExampleInput, optimizer: OptimizerChoice, **settings) -> int:
    """The tensor peak of one real training step under MemTracker (``measure_training_memory``), run on one CPU thread:
    tensor memory does not depend on the thread count, and one thread is not stalled by other work on the machine."""
    with threads_for_cpu(1):
        return measure_training_memory(model, example, optimizer, loss_fn=mean_square_loss, **settings).peak_bytes


def _update_rounds(setups: Mapping, example: ExampleInput, optimizer: OptimizerChoice, rounds: int) -> dict[object, list[float]]:
    """Every round's update time per setup (``update_function`` keyword arguments by key), the setups taking turns after a
    warm-up each; empty when ``rounds`` is 0."""
    if rounds <= 0:
        return {}
    updates = {key: update_function(example=example, optimizer=optimizer, **settings) for key, settings in setups.items()}
    device = first_device(next(iter(setups.values()))["model"])
    return {key: list(t.readings) for key, t in time_interleaved(updates, device, rounds, cpu_threads=1).items()}


def _update_times(setups: Mapping, example: ExampleInput, optimizer: OptimizerChoice, rounds: int) -> dict:
    """The fastest update time per setup over ``rounds`` interleaved rounds; empty when ``rounds`` is 0."""
    return {key: min(values) for key, values in _update_rounds(setups, example, optimizer, rounds).items()}


def example_batch(model: nn.Module, batch_size: int) -> torch.Tensor:
    """A real batch for ``model``: its ``example_input(batch_size)`` (random token ids), else random values of its ``input_shape``."""
    if hasattr(model, "example_input"):
        return model.example_input(batch_size)
    if not hasattr(model, "input_shape"):
        raise ValueError(f"{type(model).__name__} has neither example_input() nor input_shape; give it one so a batch can be made")
    return torch.randn(batch_size, *model.input_shape, device=first_device(model))


# ---------------------------------------------------------------- activation checkpointing


Wrap = Callable[[nn.Module, int], nn.Module]  # (model, blocks per group) -> a copy of the model with its blocks checkpointed


def checkpointing_memory(model: nn.Module, wrap: Wrap, batch_size: int = 8, every: Sequence[int] = (1, 2), optimizer: OptimizerChoice = "adam",
                         measure: bool = True, rounds: int = 3) -> MemoryComparison:
    """Memory and time of a training step without checkpointing and with ``wrap(model, k)`` for each k in ``every``.

    ``wrap`` is the lecture's: it returns a copy of ``model`` whose blocks are checkpointed in groups of k.

    Memory from ``training_memory``; with ``measure``, a real step's peak beside it; with
    ``rounds`` > 0, each setup's update time (``time_interleaved``), so the recompute cost
    shows as extra time.
    """
    example = example_batch(model, batch_size)
    setups = {"no checkpointing": model} | {f"checkpoint every {k} block{'s' if k > 1 else ''}": wrap(model, k) for k in every}
    seconds = _update_times({name: dict(model=variant) for name, variant in setups.items()}, example, optimizer, rounds)
    rows = []
    for name, variant in setups.items():
        report = training_memory(variant, example, optimizer, loss_fn=mean_square_loss)
        measured = real_step_peak(variant, example, optimizer) if measure else None
        rows.append(SetupMemory.from_report(name, report, measured_peak=measured, seconds=seconds.get(name)))
    base = rows[0]
    notes = [f"{type(model).__name__}, {len(getattr(model, 'blocks', []))} blocks, batch {batch_size}, {optimizer}; "
             "the fp32 mean of the squared output as the loss."]
    for r in rows[1:]:
        note = f"{r.setup}: activations at the peak {format_bytes(r.activations)} instead of {format_bytes(base.activations)}, peak {100 * r.peak / base.peak:.0f}% of plain"
        if r.seconds and base.seconds:
            note += f", update time {100 * (r.seconds / base.seconds - 1):+.0f}% (the recomputed forward)"
        notes.append(note + ".")
    return MemoryComparison(rows, "Activation checkpointing: memory for recomputation", notes)


# ---------------------------------------------------------------- gradient accumulation


def keeping_gradients(optimizer: OptimizerChoice = "adam") -> Callable[[list[nn.Parameter]], torch.optim.Optimizer]:
    """An optimizer factory whose ``zero_grad`` keeps the gradient tensors (zeroed) instead of freeing them.

    In ``training_memory`` this gives the steady state of gradient accumulation: from the second
    micro-batch on, the gradients being accumulated are live through forward and backward.
    """

    def factory(params: list[nn.Parameter]) -> torch.optim.Optimizer:
        opt = make_optimizer(optimizer, params, foreach=None)
        plain_zero_grad = type(opt).zero_grad
        opt.zero_grad = lambda set_to_none=True: plain_zero_grad(opt, set_to_none=False)
        return opt

    factory.__name__ = optimizer if isinstance(optimizer, str) else getattr(optimizer, "__name__", "optimizer")
    return factory


def gradients_after(model: nn.Module, example: ExampleInput, micro_batches: int, loss_fn: Callable = mean_square_loss) -> list[torch.Tensor]:
    """The gradients a copy of ``model`` accumulates over ``micro_batches`` slices of ``example``."""
    model = copy.deepcopy(model)
    accumulate(model, example, micro_batches, loss_fn)
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


def accumulation_memory(model: nn.Module | None = None, batch_size: int = 16, micro_batch_sizes: Sequence[int] = (16, 8, 4, 2),
                        optimizer: OptimizerChoice = "adam", check: bool = True, rounds: int = 3) -> MemoryComparison:
    """One update on a batch of ``batch_size``, accumulated over micro-batches of each size: memory, time, same gradients.

    Memory is one micro-batch's step with the accumulated gradients live (``keeping_gradients``);
    with ``check``, the real accumulated gradients are compared with the one-batch step's.
    """
    model = model if model is not None else demo_transformer()
    example = example_batch(model, batch_size)
    bad = [m for m in micro_batch_sizes if m < 1 or batch_size % m]
    if bad:
        raise ValueError(f"micro-batch sizes {bad} do not divide the batch of {batch_size}; use divisors of it")
    same = {}
    if check:
        with threads_for_cpu(1):
            reference = gradients_after(model, example, 1)
            for micro in micro_batch_sizes:
                grads = gradients_after(model, example, batch_size // micro)
                same[micro] = all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(grads, reference))
    round_seconds = _update_rounds({m: dict(model=model, micro_batches=batch_size // m) for m in micro_batch_sizes}, example, optimizer, rounds)
    seconds = {m: min(values) for m, values in round_seconds.items()}
    rows = []
    for micro in micro_batch_sizes:
        k = batch_size // micro
        report = training_memory(model, with_batch(example, micro), optimizer if k == 1 else keeping_gradients(optimizer), loss_fn=mean_square_loss)
        name = "one batch" if k == 1 else f"{k} micro-batches"
        rows.append(SetupMemory.from_report(name, report, seconds=seconds.get(micro), micro_batch=micro, same_gradients=same.get(micro)))
    smallest = rows[-1]
    notes = [f"{type(model).__name__}, effective batch {batch_size}, {optimizer}; each micro-batch's loss is divided by the number of "
             "micro-batches, so the summed gradients are those of the batch's mean loss.",
             f"Peak {format_bytes(rows[0].peak)} at one batch, {format_bytes(smallest.peak)} in micro-batches of {smallest.micro_batch}: "
             "activations shrink with the micro-batch; parameters, gradients (kept between micro-batches) and optimizer state do not."]
    report = MemoryComparison(rows, f"Gradient accumulation: one update on a batch of {batch_size}", notes)
    report.round_seconds = {r.setup: round_seconds.get(r.micro_batch, []) for r in rows}  # every round's update time, by setup
    return report


# ---------------------------------------------------------------- mixed precision


def precision_memory(model: nn.Module | None = None, batch_size: int = 8, optimizer: OptimizerChoice = "adam",
                     measure: bool = True) -> MemoryComparison:
    """The same step in fp32, under autocast, with half weights and an fp32 master copy, and all in half precision."""
    model = model if model is not None else demo_transformer()
    example = example_batch(model, batch_size)
    half = resolve_amp(True, first_device(model))  # the device's autocast type: fp16 on GPUs, bf16 on CPUs
    name = str(half).replace("torch.", "")
    setups = [
        ("fp32", dict(optimizer=optimizer)),
        (f"AMP: fp32 weights, {name} autocast", dict(optimizer=optimizer, amp=True)),
        (f"{name} weights + fp32 master copy", dict(optimizer=MasterWeightAdam, dtype=half)),
        (f"all {name} (no master copy)", dict(optimizer=optimizer, dtype=half)),
    ]
    rows = []
    for setup, settings in setups:
        report = training_memory(model, example, loss_fn=mean_square_loss, **settings)
        measured = None
        if measure and "dtype" not in settings:
            measured = real_step_peak(model, example, settings["optimizer"], amp=settings.get("amp", False))
        rows.append(SetupMemory.from_report(setup, report, measured_peak=measured))
    fp32, amp, master = rows[0], rows[1], rows[2]
    notes = [
        f"Autocast keeps the fp32 weights and optimizer state ({format_bytes(amp.parameters + amp.optimizer_state)} at the peak, as in "
        f"fp32) and runs matmuls in {name}: activations at the peak {format_bytes(amp.activations)} against {format_bytes(fp32.activations)} "
        f"in fp32 (the {name} copies of the weights it makes count as activations).",
        f"{name} weights with an fp32 master copy: the weights halve, but the master copy joins Adam's moments as optimizer state "
        f"({format_bytes(master.optimizer_state)} against {format_bytes(fp32.optimizer_state)}). All-{name} training saves the most, "
        "but its updates lose small steps to rounding, which is why the master copy exists.",
    ]
    return MemoryComparison(rows, f"Mixed precision: where the memory goes (batch {batch_size})", notes)

