"""The AlexNet case study: how close the 2012 network came to one 3 GB GTX 580, and what the two-GPU split gave.

``profile_layer_alexnet`` trains the original network (``helpers.core.models.alexnet_2012``)
for one step on fake tensors: its tensor memory comes from ``training_memory``, whole on
one card and split into its two towers with each tower's tensors on its own device.
What is not tensors (the CUDA context, convolution workspaces, allocator fragmentation)
is estimated separately, each with its basis, and shown as its own line.
"""
from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from functools import lru_cache

import matplotlib.pyplot as plt
import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import gpu_available
from helpers.core.hardware_specs import GTX_580_3GB, GPUSpec
from helpers.core.memory import CATEGORIES, LayerMemory, TrainingMemory, profile_layer_mem, training_memory
from helpers.core.models import ALEXNET_INPUT, AlexNet2012, AlexNet2012Split, alexnet_2012
from helpers.core.report import Report, column, format_bytes
from helpers.core.step import resolve_amp
from helpers.hardware.oom import largest_batch

FIGURE_SIZE = (14, 4.8)  # the case study's two charts side by side

PRECISIONS = ("fp32", "amp", "fp16")
ASSUMED_CONTEXT_BYTES = 300 * 2**20
# More than any CUDA context takes (0.3-1 GiB with lazy module loading): memory beyond it belongs to other processes.
PLAUSIBLE_CONTEXT_BYTES = 2 * 2**30
# The two towers on two fake devices: cpu:0 and cpu:1 stand in for the paper's two GPUs.
TOWER_DEVICES = {"towers.0": "cpu:0", "towers.1": "cpu:1"}
GPU_NAMES = {"cpu:0": "GPU 0", "cpu:1": "GPU 1"}


def paper_sgd(params) -> torch.optim.Optimizer:
    """The paper's optimizer: SGD with momentum 0.9 and weight decay 5e-4 (foreach kernels, as on a GPU)."""
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, weight_decay=5e-4, foreach=True)


def _precision_settings(precision: str) -> dict:
    """``training_memory``'s arguments for a precision of the case study; "amp" is autocast as on the paper's GPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return {"fp32": {}, "amp": {"amp": resolve_amp(True, "cuda")}, "fp16": {"dtype": torch.float16}}[precision]


def layer_working_sets(model: nn.Module, example: torch.Tensor, precision: str) -> LayerMemory:
    """Each layer's working set in training, in the case's precision: "fp16" casts the model and the input to half,
    "amp" runs under fp16 autocast (weights stay fp32, what autocast computes is half)."""
    if precision == "fp16":
        return profile_layer_mem(copy.deepcopy(model).to(torch.float16), example.to(torch.float16), mode="training")
    with torch.autocast("cpu", dtype=torch.float16, enabled=precision == "amp"):
        return profile_layer_mem(model, example, mode="training")


@dataclass
class Overhead:
    """Memory on the card that no tensor accounts for: what it is, how much, and on what basis."""

    name: str
    bytes: int
    basis: str


def cuda_context_bytes() -> tuple[int, str]:
    """The CUDA context's size: measured on this machine's GPU when there is one, else the kit's stated assumption.

    The measurement is this process's memory on the GPU as NVML reports it, less what PyTorch reserved; where NVML
    cannot say, the card's used memory less PyTorch's reservation, unless that is more than a context takes (other
    processes share the GPU), in which case the assumption stands, with the figure that ruled the measurement out.
    """
    assumption = "assumed: PyTorch 2 with CUDA 12 and lazy module loading typically takes 250-500 MiB"
    if not gpu_available():
        return ASSUMED_CONTEXT_BYTES, f"{assumption}; not measured here (no GPU)"
    torch.cuda.init()
    name, reserved = torch.cuda.get_device_name(), torch.cuda.memory_reserved()
    own = _own_gpu_bytes()
    if own is not None:
        return max(own - reserved, 0), f"measured on {name}: this process's memory on the GPU (NVML) less what PyTorch reserved"
    free, total = torch.cuda.mem_get_info()
    used = max(total - free - reserved, 0)
    if used <= PLAUSIBLE_CONTEXT_BYTES:
        return used, f"measured on {name}: total - free - reserved (other processes' memory on it would count too)"
    return ASSUMED_CONTEXT_BYTES, (f"{assumption}; on {name}, {format_bytes(used)} are in use beyond PyTorch's reservation, "
                                   "more than a context takes: other processes share this GPU, so it is not measured")


def _own_gpu_bytes() -> int | None:
    """This process's memory on the current GPU, from NVML (None where NVML, or its per-process figures, are missing)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # noqa: BLE001 - no NVML, no driver support, or a sandbox that hides processes
        return None
    mine = [p.usedGpuMemory for p in processes if p.pid == os.getpid() and p.usedGpuMemory]
    return mine[0] if mine else None


def convolution_workspace_per_sample(model: nn.Module, layers: LayerMemory, element_bytes: int, prefix: str = "") -> tuple[int, str]:
    """Upper bound on convolution scratch space per sample: the largest im2col buffer an explicit-GEMM algorithm needs.

    Looks at the convolutions in ``layers`` whose names start with ``prefix`` (one tower's, say).
    """
    best, where = 0, "none"
    for row in layers.rows:
        module = model.get_submodule(row.layer)
        if row.layer.startswith(prefix) and isinstance(module, nn.Conv2d) and len(row.output_shape) == 4:
            _, _, height, width = row.output_shape
            size = module.in_channels // module.groups * module.kernel_size[0] * module.kernel_size[1] * height * width * element_bytes
            if size > best:
                best, where = size, row.layer.removeprefix(prefix)
    return best, (f"upper bound: the im2col buffer of {where} (one group, whole batch), what an explicit-GEMM algorithm "
                  "needs; cuDNN's implicit-GEMM algorithms need almost none, and PyTorch falls back to them when memory is short")


@dataclass
class CardRow:
    configuration: str = column("configuration")
    batch: int = column("batch", ",")
    tensors: int = column("tensors (training_memory)", format_bytes)
    overheads: int = column("non-tensor (estimated)", format_bytes)
    total: int = column("total", format_bytes)
    card: int
    headroom: int = column("headroom on the card", format_bytes)
    fits: str = column("fits")


class AlexNetCase(Report):
    """AlexNet (2012) against its GPUs: one card, the two-tower split, and the largest batch one card holds."""

    def __init__(self, rows: list[CardRow], notes: list[str], *, precision: str, card: GPUSpec, layers: LayerMemory,
                 single: TrainingMemory, split: TrainingMemory | None, overheads: dict[str, list[Overhead]],
                 largest_batch_tensors: int, largest_batch_with_overheads: int):
        self.precision, self.card, self.layers, self.single, self.split = precision, card, layers, single, split
        self.overheads = overheads
        self.batch_size = single.batch_size
        self.card_bytes = int(card.memory_gb * 2**30)
        self.single_peak_bytes = single.peak_bytes
        self.per_card_peak_bytes = {GPU_NAMES[d]: split.peak_by_device[d] for d in TOWER_DEVICES.values()} if split else {}
        self.largest_batch_tensors = largest_batch_tensors
        self.largest_batch_with_overheads = largest_batch_with_overheads
        self.headroom = {r.configuration: r.headroom for r in rows}
        self.title = f"AlexNet (2012) training, batch {self.batch_size}, {precision}, against one {card.name}"
        super().__init__(rows, notes)

    def plot(self, ax=None):
        """Left: each layer's working set. Right: each card's memory by category, with the card's capacity."""
        if ax is None:
            _, (left, right) = plt.subplots(1, 2, figsize=FIGURE_SIZE, gridspec_kw={"width_ratios": [3, 2]})
        else:
            left, right = None, ax
        return self.draw(left, right)

    def draw(self, left, right):
        """Draw the layer chart on ``left`` (when given) and the cards' memory on ``right``; returns ``right``."""
        if left is not None:
            self.layers.plot(left)
            left.set_title(f"working set per layer (training, batch {self.batch_size}, {self.precision})")
        bars = [("one GPU", self.single, self.single.device, self.overheads["one GPU"])]
        if self.split:
            bars += [(GPU_NAMES[d], self.split, d, self.overheads[GPU_NAMES[d]]) for d in TOWER_DEVICES.values()]
        parts: dict[str, list[float]] = {c: [] for c in CATEGORIES}
        for _, report, device, extras in bars:
            for c in CATEGORIES:
                parts[c].append(report.categories_by_device[device][c])
            for item in extras:
                parts.setdefault(item.name, [0] * (len(parts["input"]) - 1)).append(item.bytes)
        plots.stacked_bars([b[0] for b in bars], parts, right, title=f"one training step, batch {self.batch_size} ({self.precision})",
                           ylabel="memory on the card")
        plots.bytes_axis(right)
        # the card's capacity is named in the legend, not written across the bars it crosses
        right.axhline(self.card_bytes, linestyle="--", color="#d62728", linewidth=1.2, label=f"capacity of one {self.card.name}")
        right.legend(fontsize=10, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        if left is not None and left.get_legend() is not None:
            left.legend(fontsize=10)
        return right


def _models(model: nn.Module | None) -> tuple[nn.Module, nn.Module | None]:
    """The whole network and its two-tower split (meta-device copies where the caller gave only one)."""
    if model is None:
        with torch.device("meta"):
            return alexnet_2012(), alexnet_2012(split=True)
    if isinstance(model, AlexNet2012):
        with torch.device("meta"):
            return model, alexnet_2012(split=True, num_classes=model.classifier.fc8.out_features)
    if isinstance(model, AlexNet2012Split):
        with torch.device("meta"):
            return alexnet_2012(num_classes=2 * model.towers[0].fc8.out_features), model
    return model, None


@dataclass
class _Estimates:
    """The basis of the non-tensor estimates for one card: they scale with the batch and with the tensors."""

    workspace_per_sample: int
    workspace_basis: str
    fragmentation: float
    context: tuple[int, str]

    def at(self, batch: int, tensors: int) -> list[Overhead]:
        return [
            Overhead("cuda context", self.context[0], self.context[1]),
            Overhead("convolution workspace", self.workspace_per_sample * batch, self.workspace_basis),
            Overhead("allocator fragmentation", int(self.fragmentation * tensors),
                     f"assumed: {self.fragmentation:.0%} of the tensors (blocks the caching allocator reserved but cannot "
                     "reuse; compare torch.cuda.memory_reserved() with max_memory_allocated() on your GPU)"),
        ]


def _row(configuration: str, batch: int, tensors: int, overheads: list[Overhead], card_bytes: int) -> CardRow:
    extra = sum(o.bytes for o in overheads)
    total = tensors + extra
    fits = "yes" if total <= card_bytes else "not with estimates" if tensors <= card_bytes else "no"  # the estimates can decide it
    return CardRow(configuration, batch, tensors, extra, total, card_bytes, card_bytes - total, fits)


def profile_layer_alexnet(
    model: nn.Module | None = None,
    batch_size: int = 128,
    precision: str = "fp32",
    card: GPUSpec = GTX_580_3GB,
    fragmentation: float = 0.10,
) -> AlexNetCase:
    """AlexNet (2012) in training: per-layer working sets, the peak on one card, the per-card peak after the split.

    ``model`` defaults to ``alexnet_2012()`` (built on the meta device, so nothing is
    allocated); another network (e.g. torchvision's alexnet) gets the one-card figures
    only. ``precision`` is "fp32", "amp" (fp16 autocast) or "fp16" (everything in half).
    The optimizer is the paper's: SGD with momentum and weight decay.
    """
    settings = _precision_settings(precision)
    element_bytes = 4 if precision == "fp32" else 2
    whole, split = _models(model)
    example = torch.empty(batch_size, *getattr(whole, "input_shape", ALEXNET_INPUT), device="meta")
    card_bytes = int(card.memory_gb * 2**30)
    context = cuda_context_bytes()
    layers = layer_working_sets(whole, example, precision)
    one_card = _Estimates(*convolution_workspace_per_sample(whole, layers, element_bytes), fragmentation, context)
    single = training_memory(whole, example, paper_sgd, **settings)
    overheads = {"one GPU": one_card.at(batch_size, single.peak_bytes)}
    rows = [_row("one GPU, whole network", batch_size, single.peak_bytes, overheads["one GPU"], card_bytes)]
    split_report = None
    if split is not None:
        split_report = training_memory(split, example, paper_sgd, device=TOWER_DEVICES, **settings)
        split_layers = layer_working_sets(split, example, precision)
        for tower, device in TOWER_DEVICES.items():
            name, peak = GPU_NAMES[device], split_report.peak_by_device[device]
            card_estimates = _Estimates(*convolution_workspace_per_sample(split, split_layers, element_bytes, tower + "."), fragmentation, context)
            overheads[name] = card_estimates.at(batch_size, peak)
            rows.append(_row(f"two GPUs (split): {name}", batch_size, peak, overheads[name], card_bytes))
    estimate = _peak_function(whole, precision)
    peaks = {0: 0, batch_size: single.peak_bytes}  # each batch size's step is estimated once in this call

    def peak_of(batch: int) -> int:
        if batch not in peaks:
            peaks[batch] = estimate(batch)
        return peaks[batch]

    def with_estimates_of(batch: int) -> int:
        tensors = peak_of(batch)
        return tensors + sum(o.bytes for o in one_card.at(batch, tensors))

    tensors_only, _ = largest_batch(peak_of, card_bytes, hint=batch_size)
    with_estimates, _ = largest_batch(with_estimates_of, card_bytes, hint=tensors_only or 1)
    rows.append(_row("one GPU, largest batch (tensors only)", tensors_only, peak_of(tensors_only), [], card_bytes))
    rows.append(_row("one GPU, largest batch (with estimates)", with_estimates, peak_of(with_estimates),
                     one_card.at(with_estimates, peak_of(with_estimates)), card_bytes))
    notes = _notes(rows, overheads, split_report is not None, card)
    return AlexNetCase(rows, notes, precision=precision, card=card, layers=layers, single=single, split=split_report,
                       overheads=overheads, largest_batch_tensors=tensors_only, largest_batch_with_overheads=with_estimates)


def _peak_function(whole: nn.Module, precision: str):
    """Tensor peak of one training step against batch size (cached for the 2012 network, which the widget asks about often)."""
    if isinstance(whole, AlexNet2012) and all(p.device.type == "meta" for p in whole.parameters()):
        classes = whole.classifier.fc8.out_features
        return lambda batch: _cached_peak(classes, precision, batch)
    shape = getattr(whole, "input_shape", ALEXNET_INPUT)
    settings = _precision_settings(precision)
    return lambda batch: training_memory(whole, torch.empty(batch, *shape, device="meta"), paper_sgd, **settings).peak_bytes if batch else 0


@lru_cache(maxsize=1024)
def _cached_peak(num_classes: int, precision: str, batch: int) -> int:
    if batch == 0:
        return 0
    with torch.device("meta"):
        model = alexnet_2012(num_classes=num_classes)
    return training_memory(model, torch.empty(batch, *ALEXNET_INPUT, device="meta"), paper_sgd, **_precision_settings(precision)).peak_bytes


def _notes(rows: list[CardRow], overheads: dict[str, list[Overhead]], has_split: bool, card: GPUSpec) -> list[str]:
    one = rows[0]
    notes = [f"One {card.name}: {format_bytes(one.tensors)} of tensors at batch {one.batch}, {100 * one.tensors / one.card:.0f}% of the card; "
             f"with the non-tensor estimates {format_bytes(one.total)} ({100 * one.total / one.card:.0f}%)."]
    notes.append(_one_card_verdict(one, overheads["one GPU"]))
    if has_split:
        cards = [r for r in rows if r.configuration.startswith("two GPUs")]
        notes.append("After the split the cards hold " + " and ".join(format_bytes(r.tensors) for r in cards) + " of tensors; "
                     "headroom with the estimates: " + ", ".join(f"{r.configuration.split(': ')[1]} {format_bytes(r.headroom)}" for r in cards) + ".")
        notes.append("Per-card accounting: each tower's weights sit on their own (fake) device and the activations the towers "
                     "exchange are copied to the device that reads them, so every card's peak counts the copies it receives.")
    notes += [f"{o.name}: {format_bytes(o.bytes)}, {o.basis}." for o in overheads["one GPU"]]
    notes.append(f"Card memory: {card.memory_gb:g} GB on the box means {card.memory_gb:g} GiB ({int(card.memory_gb * 1024):,} MiB).")
    return notes


def _one_card_verdict(one: CardRow, overheads: list[Overhead]) -> str:
    """Whether one card holds the step, and how much of that rests on the non-tensor estimates rather than the tensors."""
    if one.tensors > one.card:
        return "Verdict: the tensors alone exceed one card, so the step does not fit on it, whatever the estimates."
    if one.total <= one.card:
        return "Verdict: the step fits one card, even with every non-tensor estimate added."
    by_name = {o.name: o for o in overheads}
    workspace = by_name.get("convolution workspace")
    without = one.total - (workspace.bytes if workspace else 0)
    context = by_name.get("cuda context")
    assumed_context = context is not None and context.basis.startswith("assumed")
    return ("Verdict: the tensors fit one card; only the non-tensor estimates push the step over, so 'does not fit' holds only if "
            "they do. "
            + (f"The workspace ({format_bytes(workspace.bytes)}) is an upper bound; at zero, the step takes {format_bytes(without)} "
               f"({'fits' if without <= one.card else 'still does not fit'}). " if workspace else "")
            + ("The CUDA context is assumed for PyTorch 2 with CUDA 12, not the 2012 software's. " if assumed_context else "")
            + "These figures model today's PyTorch, not the authors' 2012 code, whose buffers they do not reproduce; the "
            "authors write that the network was too big for one GTX 580 (Krizhevsky, Sutskever and Hinton, NIPS 2012, section 3.2).")
