"""Mixed precision, measured: number formats read from torch.finfo, tensor-core shape rules, which format autocast
runs each op in, and fp16 gradient underflow rescued by loss scaling. (What AMP saves in memory and time: helpers.training.amp.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn

from helpers.core import plots
from helpers.core.device import dtype_name, is_gpu, pick_device
from helpers.core.report import Report, column
from helpers.core.step import resolve_amp
from helpers.core.torch_adapters.dispatch import TorchDispatchMode

# ---------------------------------------------------------------- number formats


@dataclass
class NumberFormat:
    name: str = column("format")
    bits: int = column("bits")
    exponent_bits: int = column("exponent")
    mantissa_bits: int = column("mantissa")
    epsilon: float = column("epsilon", ".3g")
    smallest_subnormal: float = column("smallest subnormal", ".3g")
    smallest_normal: float = column("smallest normal", ".3g")
    largest: float = column("largest", ".3g")
    kind: str = column("kind")  # "storage" (a tensor dtype) or "matmul mode" (TF32: only inside tensor-core matmuls)


def describe_format(name: str, range_of: torch.dtype, precision_of: torch.dtype | None = None) -> NumberFormat:
    """A format with the exponent of ``range_of`` and the mantissa of ``precision_of`` (default: the same dtype).

    Everything is read from torch.finfo: mantissa bits from epsilon (2^-mantissa),
    exponent bits as the rest of the word. TF32 is fp32's exponent with fp16's mantissa.
    """
    r = torch.finfo(range_of)
    p = torch.finfo(precision_of or range_of)
    mantissa = round(-math.log2(p.eps))
    exponent = r.bits - 1 - round(-math.log2(r.eps))
    if precision_of in (None, range_of):
        largest = r.max
    else:  # the same largest exponent, with fewer mantissa bits below it
        largest = (2 - p.eps) * 2.0 ** math.floor(math.log2(r.max))
    kind = "storage" if precision_of in (None, range_of) else "matmul mode"
    return NumberFormat(name, 1 + exponent + mantissa, exponent, mantissa, p.eps, r.smallest_normal * p.eps, r.smallest_normal, largest, kind)


def _known_formats() -> list[tuple[str, torch.dtype, torch.dtype | None]]:
    formats = [("fp32", torch.float32, None), ("tf32", torch.float32, torch.float16), ("fp16", torch.float16, None), ("bf16", torch.bfloat16, None)]
    for name, attribute in (("fp8 e4m3", "float8_e4m3fn"), ("fp8 e5m2", "float8_e5m2")):
        if hasattr(torch, attribute):  # fp8 dtypes exist from torch 2.1 on
            formats.append((name, getattr(torch, attribute), None))
    return formats


class NumberFormats(Report):
    """Floating-point formats side by side: bits, range and precision, all from torch.finfo."""

    title = "Floating-point formats (torch.finfo; tf32, no torch dtype, from its definition: fp32's exponent, fp16's mantissa)"

    def plot(self, ax=None):
        """Each format's range on a log2 axis: subnormals thin, normal numbers thick."""
        ranges = {r.name: (r.smallest_subnormal, r.smallest_normal, r.largest) for r in self.rows}
        return plots.log2_ranges(ranges, ax, title="Representable magnitudes", xlabel="log2 |x|")


def number_formats() -> NumberFormats:
    """The formats of deep learning (fp32, tf32, fp16, bf16 and, where torch has them, fp8), from torch.finfo."""
    return NumberFormats([describe_format(*spec) for spec in _known_formats()])


# ---------------------------------------------------------------- tensor-core shape rules

# NVIDIA's "Matrix Multiplication Background" guide (cuBLAS >= 11, cuDNN >= 7.6.3): tensor cores are used for any
# M, N, K but are most efficient when each is a multiple of the first number; on A100 and later, of the second.
CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
TENSOR_CORE_MULTIPLES = {"fp16": (8, 64), "bf16": (8, 64), "tf32": (4, 32), "int8": (16, 128), "fp64": (2, 16)}


def pad_to_multiple(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``n``."""
    return -(-n // multiple) * multiple


@dataclass
class LayerDimension:
    layer: str = column("layer")
    dimension: str = column("dimension")
    size: int = column("size")
    multiple: int = column("multiple of")
    aligned: bool = column("aligned", lambda ok: "yes" if ok else "NO")
    padded: int = column("pad to")


class Alignment(Report):
    """Which matmul dimensions of a model are multiples of the tensor-core tile, and what to pad them to."""

    title = "Tensor-core alignment of the model's matmul dimensions"

    @property
    def misaligned(self) -> list[LayerDimension]:
        return [r for r in self.rows if not r.aligned]


def tensor_core_alignment(model: nn.Module, dtype: str = "fp16", recent_gpu: bool = False) -> Alignment:
    """Check every Linear, Conv and Embedding dimension of ``model`` against the tensor-core multiple for ``dtype``.

    ``recent_gpu=True`` uses the stricter multiples that A100 and later GPUs prefer.
    The batch (or tokens) dimension is not a layer property: keep it a multiple too.
    """
    if dtype not in TENSOR_CORE_MULTIPLES:
        raise ValueError(f"no tensor-core rule for dtype {dtype!r}; choose one of {sorted(TENSOR_CORE_MULTIPLES)}")
    multiple = TENSOR_CORE_MULTIPLES[dtype][1 if recent_gpu else 0]
    rows = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            dims = {"in_features (K)": module.in_features, "out_features (N)": module.out_features}
        elif isinstance(module, CONVOLUTIONS):
            dims = {"in_channels": module.in_channels // module.groups, "out_channels": module.out_channels // module.groups}
        elif isinstance(module, nn.Embedding):
            dims = {"num_embeddings (vocab)": module.num_embeddings, "embedding_dim": module.embedding_dim}
        else:
            continue
        for dimension, size in dims.items():
            rows.append(LayerDimension(name or type(module).__name__, dimension, size, multiple, size % multiple == 0, pad_to_multiple(size, multiple)))
    return Alignment(rows, [f"rule for {dtype}: multiples of {multiple}" + (" (A100 and later)" if recent_gpu else "")
                            + "; NVIDIA's rule of thumb (its Matrix Multiplication Background guide), not measured here"])


# ---------------------------------------------------------------- what autocast runs in which format

_SHAPE_OPS = {"t", "view", "_unsafe_view", "detach", "transpose", "expand", "reshape", "permute", "unsqueeze", "squeeze", "alias", "slice", "select", "as_strided"}


@dataclass
class OpPrecision:
    op: str = column("aten op")
    inputs: str = column("reads")
    output: str = column("writes")
    runs_in: str = column("runs in")


class _DtypeLog(TorchDispatchMode):
    """Records each computing aten op with the dtypes of its tensor inputs and of its first output."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, list[torch.dtype], torch.dtype | None]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name not in _SHAPE_OPS:
            first = out[0] if isinstance(out, (tuple, list)) else out
            inputs = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
            self.ops.append((name, inputs, first.dtype if isinstance(first, torch.Tensor) else None))
        return out


class AutocastOps(Report):
    """Op by op, the formats autocast chose: which ops run in low precision and which stay in fp32."""

    title = "What autocast runs in which format"



def autocast_ops(fn: Callable, *args, device: str | torch.device | None = None, dtype: str | None = None) -> AutocastOps:
    """Run ``fn(*args)`` under autocast on ``device`` and record the format each aten op read and wrote.

    ``dtype`` defaults to bf16 on the CPU and fp16 on a GPU. The lists of ops that
    autocast lowers differ between devices: the table shows this device's.
    """
    device = pick_device(device)
    low = resolve_amp(True if dtype is None else dtype, device)
    with torch.autocast(device.type, dtype=low), _DtypeLog() as log:
        fn(*args)
    rows = []
    for name, inputs, output in log.ops:
        if name == "_to_copy":
            runs_in = "cast"
        elif output == low or low in inputs:
            runs_in = dtype_name(low)
        else:
            runs_in = dtype_name(output)
        shown = ", ".join(sorted({dtype_name(d) for d in inputs})) or "-"
        rows.append(OpPrecision(name, shown, dtype_name(output), runs_in))
    return AutocastOps(rows, [f"autocast on {device.type} with dtype {dtype_name(low)}"])


# ---------------------------------------------------------------- fp16 underflow and loss scaling


def almost_fitted_regression(device: torch.device, residual: float = 1e-3, width: int = 256, batch: int = 512, seed: int = 0):
    """An MLP and a batch whose targets it already fits up to ``residual``: late in training, gradients are tiny."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16)).to(device)
    x = torch.randn(batch, width, generator=generator).to(device)
    with torch.no_grad():
        y = model(x) + residual * torch.randn(batch, 16, generator=generator).to(device)
    return model, x, y


def _scaled_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, scale: float, low: torch.dtype | None, loss_weight: float) -> torch.Tensor:
    """All parameter gradients, flattened, from a backward pass of ``scale`` x the loss, divided by ``scale``."""
    model.zero_grad(set_to_none=True)
    with torch.autocast(x.device.type, dtype=low or torch.float32, enabled=low is not None):
        out = model(x)
    loss = loss_weight * nn.functional.mse_loss(out.float(), y)
    (loss * scale).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()]).float() / scale


@dataclass
class ScalingOutcome:
    strategy: str = column("loss scale")
    scale: float
    underflow_share: float = column("flushed to zero", ".2%")
    nonfinite_share: float = column("inf / nan", ".2%")
    relative_error: float | None = column("relative error", ".3g")
    verdict: str = column("verdict")


class LossScaling(Report):
    """Gradients of one backward pass in fp16 at several loss scales, against an fp32 reference."""

    title = "Loss scaling: fp16 gradients against the fp32 reference"

    def __init__(self, rows, reference: torch.Tensor, fmt: NumberFormat, notice: str | None):
        self.reference = reference
        self.format = fmt
        nonzero = reference[reference != 0].abs()
        self.below_subnormal_share = (nonzero < fmt.smallest_subnormal).float().mean().item()
        self.below_normal_share = (nonzero < fmt.smallest_normal).float().mean().item()
        notes = [f"{self.below_subnormal_share:.1%} of the fp32 reference gradients are below {fmt.name}'s smallest subnormal "
                 f"({fmt.smallest_subnormal:.3g}), {self.below_normal_share:.1%} below its smallest normal ({fmt.smallest_normal:.3g})"]
        super().__init__(rows, notes)
        self.notice = notice

    def plot(self, ax=None):
        magnitudes = self.reference[self.reference != 0].abs().log2().cpu().tolist()
        marks = {f"{self.format.name} smallest subnormal": math.log2(self.format.smallest_subnormal),
                 f"{self.format.name} smallest normal": math.log2(self.format.smallest_normal)}
        for row in self.rows:
            if row.scale > 1 and row.nonfinite_share == 0:
                marks[f"smallest gradient kept at scale {row.strategy}"] = math.log2(self.format.smallest_subnormal) - math.log2(row.scale)
                break
        return plots.log2_histogram(magnitudes, marks, ax, title="fp32 gradient magnitudes", xlabel="log2 |gradient|", ylabel="gradient entries")


def _power_of_two(scale: float) -> str:
    return "none (1)" if scale == 1 else f"2^{round(math.log2(scale))}"


def loss_scaling(
    device: str | torch.device | None = None,
    scales: Sequence[float] = (1, 2**8, 2**16, 2**32, 2**40),
    residual: float = 0.1,
    loss_weight: float = 2**-10,
    width: int = 256,
    batch: int = 512,
) -> LossScaling:
    """Backpropagate one batch of an almost-fitted regression in fp16 (autocast) at each loss scale, measured.

    ``loss_weight`` stands for a mean over many more values than one batch holds (or
    a down-weighted loss term): late in training, gradients are tiny. They flush to
    zero in fp16; multiplying the loss by S before backward and dividing the
    gradients by S afterwards lifts them into fp16's range, until S is so large
    that they overflow to inf.
    """
    device = pick_device(device)
    notice = None if is_gpu(device) else "fp16 on this CPU is emulated: slow, but it rounds exactly as a GPU's fp16 does"
    model, x, y = almost_fitted_regression(device, residual, width, batch)
    reference = _scaled_gradients(model, x, y, 1.0, None, loss_weight)
    nonzero = reference != 0
    rows = []
    for scale in scales:
        grads = _scaled_gradients(model, x, y, float(scale), torch.float16, loss_weight)
        finite = torch.isfinite(grads)
        underflow = ((grads == 0) & nonzero).float().mean().item()
        nonfinite = (~finite).float().mean().item()
        error = ((grads - reference).norm() / reference.norm()).item() if finite.all() else None
        if nonfinite > 0:
            verdict = "overflow: skip this step, lower the scale"
        elif underflow > 0.01:
            verdict = "gradients lost to underflow"
        else:
            verdict = "ok"
        rows.append(ScalingOutcome(_power_of_two(scale), float(scale), underflow, nonfinite, error, verdict))
    return LossScaling(rows, reference.cpu(), describe_format("fp16", torch.float16), notice)


@dataclass
class ScalePhase:
    first_step: int = column("from step")
    last_step: int = column("to step")
    scale: float = column("scale", _power_of_two)
    skipped_steps: int = column("skipped steps")


class DynamicScaling(Report):
    """The loss scale over a short training run: halved on overflow, doubled after a run of clean steps."""

    title = "Dynamic loss scaling"

    def __init__(self, rows, scales: list[float], skipped: list[bool], losses: list[float], growth_interval: int):
        super().__init__(rows, [f"{sum(skipped)} of {len(skipped)} steps skipped for overflow; growth interval {growth_interval} steps"])
        self.scales, self.skipped, self.losses = scales, skipped, losses

    def plot(self, ax=None):
        ax = plots.line_chart({"loss scale": (list(range(len(self.scales))), self.scales)}, ax, title=self.title, xlabel="step", ylabel="scale (log scale)")
        ax.set_yscale("log", base=2)
        for line in ax.get_lines():
            line.set_marker("")
        skipped = [i for i, s in enumerate(self.skipped) if s]
        ax.scatter(skipped, [self.scales[i] for i in skipped], color=plots.color_for("wrong"), zorder=3, label="skipped (overflow)")
        ax.legend()
        return ax


def scale_history(scales: Sequence[float], skipped: Sequence[bool], growth_interval: int, losses: Sequence[float] = ()) -> DynamicScaling:
    """Tabulate a dynamic loss-scaling run: the scale used at every step and whether that step was skipped.

    The run itself is the caller's (Lecture 5a writes the loop); this groups its
    steps into phases at one scale and plots the scale over the steps.
    """
    scales, skipped = [float(s) for s in scales], [bool(s) for s in skipped]
    if len(scales) != len(skipped) or not scales:
        raise ValueError(f"scale_history: give one scale and one skipped flag per step (got {len(scales)} and {len(skipped)})")
    return DynamicScaling(_phases(scales, skipped), scales, skipped, list(losses), growth_interval)


def _phases(scales: list[float], skipped: list[bool]) -> list[ScalePhase]:
    """Contiguous runs of steps taken at the same scale."""
    phases: list[ScalePhase] = []
    for step, (scale, skip) in enumerate(zip(scales, skipped)):
        if phases and phases[-1].scale == scale:
            phases[-1].last_step = step
            phases[-1].skipped_steps += skip
        else:
            phases.append(ScalePhase(step, step, scale, int(skip)))
    return phases
