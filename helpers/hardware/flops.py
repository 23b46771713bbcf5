"""Per-layer operation counts (``profile_ops``): the lecture's classic convention, true FLOPs, and MACs.

One forward pass on fake tensors (no memory, no compute, so meta-device models work
too) is watched at the level of aten operators. Each operator is charged to the
innermost module running it; its count comes from two sources:

- "flops": torch.utils.flop_counter.FlopCounterMode, so the total is FlopCounterMode's
  own. It counts matrix products and convolutions (2 FLOPs per multiply-accumulate) and
  nothing else: element-wise work is free in this convention. Attention's two products
  are counted on every device: the fused CPU kernel, which torch has no formula for,
  gets torch's own SDPA formula (``flop_counter``).
- "macs": multiply-accumulates, half of FlopCounterMode's count (every operator it
  counts is a sum of products).
- "classic": the lecture's hand-count: convolution = MACs + 1 per output with a bias;
  linear = in_features x outputs (bias not counted); ReLU = 2 per element; max-pool =
  kernel elements - 1 per output; average-pool = kernel elements per output; batch-norm
  = 2 per element; element-wise add/mul = 1 per element. Other operators are listed as
  not counted.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.utils import flop_counter as torch_flop_counter
from torch.utils.flop_counter import FlopCounterMode

from helpers.core import plots
from helpers.core.fake import ExampleInput, explain_fake_failures, fake_run, module_hooks
from helpers.core.report import Report, column
from helpers.core.torch_adapters.dispatch import TorchDispatchMode, is_view

CONVENTIONS = ("classic", "flops", "macs")
aten = torch.ops.aten


# ---------------------------------------------------------------- attention that FlopCounterMode leaves out


def _sdpa_formulas() -> dict:
    """torch's own SDPA formulas for the fused attention operators its registry has none for (the CPU one among them).

    FlopCounterMode counts the CUDA flash, memory-efficient and cuDNN kernels, but not
    ``_scaled_dot_product_flash_attention_for_cpu`` (nor the MPS and out-of-tree ones):
    on a CPU, attention's two matrix products would count 0. Each of these takes query,
    key and value first (the backward ones: the output's gradient, then query, key, value),
    as the registered ones do, so the same formulas apply.
    """
    forward = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_fused_attention_overrideable",
               "_scaled_dot_product_attention_math_for_mps")
    backward = ("_scaled_dot_product_flash_attention_for_cpu_backward", "_scaled_dot_product_fused_attention_overrideable_backward")
    formulas = {}
    for names, formula in ((forward, torch_flop_counter.sdpa_flop), (backward, torch_flop_counter.sdpa_backward_flop)):
        for name in names:
            op = getattr(aten, name, None)
            if op is not None and op not in torch_flop_counter.flop_registry:  # torch's own registration wins once it has one
                formulas[op] = _already_shape_wrapped(formula)
    return formulas


def _already_shape_wrapped(formula: Callable) -> Callable:
    """torch's registered formulas already turn tensors into shapes: tell FlopCounterMode not to wrap them again."""
    def counted(*args, **kwargs):
        return formula(*args, **kwargs)
    counted._get_raw = True
    return counted


def flop_counter(**options) -> FlopCounterMode:
    """A FlopCounterMode that also counts fused attention on every device (``options`` go to FlopCounterMode)."""
    return FlopCounterMode(**{"display": False, **options}, custom_mapping=_sdpa_formulas())


# ---------------------------------------------------------------- the classic convention, one rule per operator


def _prod(values) -> int:
    return math.prod(int(v) for v in values)


def _kernel_elements(kernel_size, spatial_dims: int) -> int:
    sizes = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size]
    return _prod(sizes * spatial_dims if len(sizes) == 1 else sizes)


def _conv(args, out) -> int:
    x, weight, bias, transposed = args[0], args[1], args[2], args[6]
    per_kernel = weight.shape[1] * _prod(weight.shape[2:])  # (in_channels / groups) x kernel elements
    macs = (x.numel() if transposed else out.numel()) * per_kernel
    return macs + (out.numel() if bias is not None else 0)


def _mm(a, b) -> int:
    return _prod(a.shape) * b.shape[-1]  # (batch x) m x k x n


def _max_pool(dims: int) -> Callable:
    return lambda args, out: out[0].numel() * (_kernel_elements(args[1], dims) - 1)


def _avg_pool(dims: int) -> Callable:
    return lambda args, out: out.numel() * _kernel_elements(args[1], dims)


def _per_element(n: int, of: str = "out") -> Callable:
    return lambda args, out: n * (args[0].numel() if of == "in" else out.numel())


CLASSIC_RULES: dict = {
    aten.convolution: _conv,
    aten.addmm: lambda args, out: _mm(args[1], args[2]),
    aten.mm: lambda args, out: _mm(args[0], args[1]),
    aten.bmm: lambda args, out: _mm(args[0], args[1]),
    aten.baddbmm: lambda args, out: _mm(args[1], args[2]),
    aten.relu: _per_element(2),
    aten.relu_: _per_element(2),
    aten.max_pool1d_with_indices: _max_pool(1),
    aten.max_pool2d_with_indices: _max_pool(2),
    aten.max_pool3d_with_indices: _max_pool(3),
    aten.avg_pool1d: _avg_pool(1),
    aten.avg_pool2d: _avg_pool(2),
    aten.avg_pool3d: _avg_pool(3),
    aten._adaptive_avg_pool2d: _per_element(1, of="in"),  # each input element is added once
    aten.mean: _per_element(1, of="in"),
    aten.native_batch_norm: _per_element(2, of="in"),
    aten._native_batch_norm_legit: _per_element(2, of="in"),
    aten._native_batch_norm_legit_no_training: _per_element(2, of="in"),
    aten.add: _per_element(1),
    aten.add_: _per_element(1),
    aten.mul: _per_element(1),
    aten.mul_: _per_element(1),
}
# Operators that do no arithmetic (allocation, copies, casts, lookups): never reported as "not counted".
NO_ARITHMETIC = {aten.empty, aten.empty_strided, aten.zeros, aten.ones, aten.full, aten.arange, aten.scalar_tensor,
                 aten.clone, aten.copy_, aten._to_copy, aten.detach, aten.lift_fresh, aten.constant_pad_nd, aten.cat,
                 aten._unsafe_view, aten.embedding}


# ---------------------------------------------------------------- counting


@dataclass
class OpRow:
    layer: str = column("layer")
    type: str = column("type")
    classic: int
    flops: int
    macs: int
    ops: int = 0  # the count in the report's convention
    counted: dict[str, int] = column("{}", ",", spread=True, default_factory=dict)  # {unit: ops}: the column is headed by the unit
    share: float = column("share", ".1f", default=0.0)  # percent of the report's total


class _OpCounter(TorchDispatchMode):
    """Charges every aten operator to the innermost running module, in all three conventions."""

    def __init__(self, model: nn.Module, flop_counter: FlopCounterMode):
        super().__init__()
        self.flop_counter = flop_counter
        self.stack: list[str] = []
        self.leaf = {name: not any(True for _ in m.children()) for name, m in model.named_modules()}
        self.type = {name: type(m).__name__ for name, m in model.named_modules()}
        self.rows: dict[tuple[str, str], OpRow] = {}
        self.uncounted: Counter = Counter()

    def watching(self, model: nn.Module):
        """Within the block, the stack of running modules follows ``model``'s forward."""
        return module_hooks(model.named_modules(), before=lambda name, m: self.stack.append(name),
                            after=lambda name, m, inputs, output: self.stack.pop())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        before = self.flop_counter.get_total_flops()
        out = func(*args, **(kwargs or {}))
        if func.namespace == "prim":  # metadata queries such as prim::device
            return out
        flops = self.flop_counter.get_total_flops() - before
        packet = func.overloadpacket
        rule = CLASSIC_RULES.get(packet)
        classic = rule(args, out) if rule else 0
        arithmetic_not_counted = rule is None and packet not in NO_ARITHMETIC and not is_view(func)
        if arithmetic_not_counted:
            self.uncounted[packet.__name__] += 1
        if classic or flops or arithmetic_not_counted:
            row = self._row(packet.__name__)
            row.classic += classic
            row.flops += flops
        return out

    def _row(self, op_name: str) -> OpRow:
        module = self.stack[-1] if self.stack else ""
        # A leaf module's operators are that layer's; a container's own operators are functional calls in its forward.
        key = (module, "" if self.leaf.get(module, False) else op_name)
        if key not in self.rows:
            label = module or "(model)"
            kind = self.type.get(module, "") if not key[1] else f"{op_name.lstrip('_')} (functional)"
            self.rows[key] = OpRow(label, kind, 0, 0, 0)
        return self.rows[key]


class OpsProfile(Report):
    """Operations per layer of one forward pass; ``.total`` in the chosen convention, ``.totals`` in all three."""

    def __init__(self, rows: list[OpRow], convention: str, model_name: str, input_shapes: list[tuple], uncounted: Counter):
        self.convention = convention
        self.model_name = model_name
        self.input_shapes = input_shapes
        self.totals = {c: sum(getattr(r, c) for r in rows) for c in CONVENTIONS}
        self.total = self.totals[convention]
        for r in rows:
            r.ops = getattr(r, convention)
            r.counted = {UNITS[convention]: r.ops}
            r.share = 100 * r.ops / self.total if self.total else 0.0
        self.title = f"Operations per layer of {model_name} ({convention} convention)"
        shapes = ", ".join(str(tuple(s)) for s in input_shapes)
        notes = [f"Input size: {shapes}", f"Total: {self.total:,} {UNITS[convention]} (approx. {self.total / 1e9:.3g} G)"]
        if convention == "classic" and uncounted:
            listed = ", ".join(f"{name} (x{n})" for name, n in sorted(uncounted.items()))
            notes.append(f"Not counted by the classic convention: {listed}.")
        if convention in ("flops", "macs"):
            notes.append("Counted by torch.utils.flop_counter.FlopCounterMode: matrix products and convolutions only, "
                         "attention's two products (Q·Kᵀ and the weighted sum of V) included on every device.")
            missed = sorted({r.type for r in rows if "attention" in r.type and r.flops == 0})
            if missed:
                notes.append(f"FlopCounterMode counted no FLOPs inside {', '.join(missed)}: a fused kernel it has no formula for; these layers' FLOPs are missing.")
        super().__init__(rows, notes)

    def by_type(self) -> dict[str, int]:
        """Ops summed per layer type (Conv2d, ReLU, ... and functional operators)."""
        totals: Counter = Counter()
        for r in self.rows:
            totals[r.type] += r.ops
        return dict(totals.most_common())

    def plot(self, ax=None, smallest_share: float = 0.05):
        """A pie of ops by layer type; types under ``smallest_share`` of the total are merged into one slice."""
        shares = self.by_type()
        small = [t for t, v in shares.items() if v < smallest_share * self.total]
        if len(small) > 1:
            shares = {t: v for t, v in shares.items() if t not in small}
            shares["other: " + ", ".join(small)] = sum(self.by_type()[t] for t in small)
        return plots.pie_chart(shares, ax, title=f"{self.model_name}: {UNITS[self.convention]} by layer type")


UNITS = {"classic": "ops", "flops": "FLOPs", "macs": "MACs"}


FUSED_IN_EVAL = (nn.MultiheadAttention, nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.TransformerEncoder)


def _without_fused_fast_paths(model: nn.Module) -> nn.Module:
    """Take attention's training path (matmuls FlopCounterMode can count), not its fused inference kernel.

    In eval mode under no_grad, these modules call native_multi_head_attention / the fused encoder layer,
    for which FlopCounterMode has no formula: projections and attention products would all vanish. Only
    their own ``training`` flag is set; dropout and batch norm keep inference behaviour.
    """
    for module in model.modules():
        if isinstance(module, FUSED_IN_EVAL):
            module.training = True
    return model


def profile_ops(model: nn.Module, shape: tuple | ExampleInput | None = None, convention: str = "classic") -> OpsProfile:
    """Count the operations of one forward pass of ``model`` per layer, in the ``convention`` asked for.

    ``shape`` is the input's shape (batch first, float input) or example input tensors;
    by default one sample of the model's ``input_shape``. Runs on fake tensors, so it
    costs no memory and works on meta-device models; the model itself is not changed.
    """
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown convention {convention!r}; choose one of {CONVENTIONS}")
    run = fake_run(model, shape, training=False, prepare=_without_fused_fast_paths)
    flops = flop_counter()
    counter = _OpCounter(run.model, flops)
    with counter.watching(run.model), run.mode, torch.no_grad(), explain_fake_failures(model, "counted"), flops, counter:
        run.model(*run.args, **run.kwargs)
    rows = list(counter.rows.values())
    for r in rows:
        r.macs = r.flops // 2
    return OpsProfile(rows, convention, type(model).__name__, run.input_shapes, counter.uncounted)
