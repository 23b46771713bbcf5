"""Tensor parallelism, Megatron style: linear layers split by output columns or input rows across the ranks of a group.

Four autograd functions carry all the communication (run them inside ``helpers.core.workers`` workers):
``copy_to_parallel`` (Megatron's *f*: identity forward, all-reduce of the gradient backward),
``reduce_from_parallel`` (*g*: all-reduce forward, identity backward), ``gather_from_parallel``
(all-gather forward, keep one's own slice backward) and ``scatter_to_parallel`` (the reverse).
``exchange`` is the all-gather whose consumers differ per rank (the two AlexNet towers): its
backward sums everyone's gradient (reduce-scatter). Each call is noted in the active
``communication_log``. ``tensor_parallel_check`` runs the layers on real gloo workers against one
device, and torch's own ``parallelize_module`` beside them.
"""
from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.report import Report, column, format_bytes
from helpers.core.workers import launch
from helpers.distributed.comm_models import bytes_sent_per_worker

# ---------------------------------------------------------------- communication, noted as it happens


@dataclass
class CommLog:
    """The collectives one rank ran: (operation, phase, bytes of the full message) in order."""

    calls: list[tuple[str, str, int]] = field(default_factory=list)

    def of(self, phase: str) -> list[tuple[str, int]]:
        return [(op, nbytes) for op, p, nbytes in self.calls if p == phase]

    def describe(self, phase: str) -> str:
        """E.g. '2 all_gather (40.00 KiB)': each kind of collective, how often, and its messages' total size."""
        counts: dict[str, list[int]] = {}
        for op, nbytes in self.of(phase):
            counts.setdefault(op, []).append(nbytes)
        return ", ".join(f"{len(sizes)} {op} ({format_bytes(sum(sizes))})" for op, sizes in counts.items()) or "none"

    def bytes_sent(self, phase: str, world_size: int) -> float:
        """Bytes one rank sends for this phase's collectives, if each runs as a ring (all-reduce 2(N-1)/N, gathers (N-1)/N)."""
        ring = {"all_reduce": lambda n: bytes_sent_per_worker("ring", n, world_size),
                "all_gather": lambda n: n * (world_size - 1) / world_size,
                "reduce_scatter": lambda n: n * (world_size - 1) / world_size}
        return sum(ring[op](n) for op, n in self.of(phase))


_LOGS: list[CommLog] = []


@contextlib.contextmanager
def communication_log() -> Iterator[CommLog]:
    """Within the block, note every collective the tensor-parallel functions run."""
    log = CommLog()
    _LOGS.append(log)
    try:
        yield log
    finally:
        _LOGS.remove(log)


def _note(op: str, phase: str, t: torch.Tensor) -> None:
    for log in _LOGS:
        log.calls.append((op, phase, t.numel() * t.element_size()))


def _all_reduce(t: torch.Tensor, phase: str) -> torch.Tensor:
    _note("all_reduce", phase, t)
    t = t.contiguous().clone()
    dist.all_reduce(t)
    return t


def _all_gather(t: torch.Tensor, dim: int, phase: str) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    gathered = torch.cat(parts, dim)
    _note("all_gather", phase, gathered)
    return gathered


def _own_slice(t: torch.Tensor, dim: int) -> torch.Tensor:
    world = dist.get_world_size()
    if t.shape[dim] % world:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split evenly over {world} ranks")
    return t.chunk(world, dim)[dist.get_rank()].contiguous()


class _CopyToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad, "backward")


class _ReduceFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _all_reduce(x, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad


class _GatherFromParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return _all_gather(x, dim, "forward")

    @staticmethod
    def backward(ctx, grad):
        return _own_slice(grad, ctx.dim), None


class _ScatterToParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return _own_slice(x, dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_gather(grad, ctx.dim, "backward"), None


class _Exchange(_GatherFromParallel):
    """The same all-gather forward; backward sums, over the ranks, the gradients for this rank's slice."""

    @staticmethod
    def backward(ctx, grad):
        parts = [p.contiguous() for p in grad.chunk(dist.get_world_size(), ctx.dim)]
        _note("reduce_scatter", "backward", grad)
        mine = torch.empty_like(parts[dist.get_rank()])
        dist.reduce_scatter(mine, parts)
        return mine, None


def copy_to_parallel(x: torch.Tensor) -> torch.Tensor:
    """f: the same input enters every rank's shard; in backward their input gradients are summed (all-reduce)."""
    return _CopyToParallel.apply(x)


def reduce_from_parallel(x: torch.Tensor) -> torch.Tensor:
    """g: the ranks' partial results are summed (all-reduce); in backward the gradient passes through unchanged."""
    return _ReduceFromParallel.apply(x)


def gather_from_parallel(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """All-gather the ranks' slices along ``dim`` for a consumer that every rank runs identically; backward keeps one's own slice."""
    return _GatherFromParallel.apply(x, dim)


def scatter_to_parallel(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Keep this rank's slice of a replicated tensor along ``dim``; backward all-gathers the slices' gradients."""
    return _ScatterToParallel.apply(x, dim)


def exchange(x: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """All-gather for consumers that differ per rank: backward sums every rank's gradient for this rank's slice (reduce-scatter)."""
    return _Exchange.apply(x, dim)


# ---------------------------------------------------------------- the layers


# ---------------------------------------------------------------- checked against one device


@dataclass
class TensorParallelRow:
    layer: str = column("layer")
    world_size: int = column("N")
    same_output: bool = column("same output")
    same_gradients: bool = column("same gradients")
    weights_per_rank: float = column("weights per rank", ".0%")  # share of the full layer's weight bytes
    forward: str = column("forward: collectives per rank")
    backward: str = column("backward: collectives per rank")
    sent_per_rank: float | None = column("sent per rank (ring)", format_bytes)  # None where the collectives were only counted


class TensorParallelCheck(Report):
    """Split layers on real processes against the unsplit layers on one: outputs, gradients, and the communication each needs."""

    title = "Tensor parallelism on real processes, against one device"


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def _pairs(split: nn.Module, full: nn.Module, column_layer: type, row_layer: type) -> list[tuple[nn.Parameter, nn.Parameter, int | None]]:
    """(shard, full parameter, dimension it was split along or None) for a split layer, or a Sequential of them, and its source.

    A column-parallel layer holds its rank's rows of the weight and of the bias; a row-parallel one its rank's columns
    of the weight and the whole bias.
    """
    if isinstance(split, column_layer):
        return [(split.weight, full.weight, 0), (split.bias, full.bias, 0)]
    if isinstance(split, row_layer):
        return [(split.weight, full.weight, 1), (split.bias, full.bias, None)]
    return [pair for s, f in zip(split.children(), full.children()) for pair in _pairs(s, f, column_layer, row_layer)]


def _case(name: str, split: nn.Module, full: nn.Module, x: torch.Tensor, column_layer: type, row_layer: type) -> dict:
    """Run ``split`` and ``full`` on ``x``; compare outputs, input gradients, and each weight shard's gradient with its slice."""
    shards = _pairs(split, full, column_layer, row_layer)
    xs, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    with communication_log() as log:
        out = split(xs)
        out.pow(2).sum().backward()
    ref = full(xf)
    ref.pow(2).sum().backward()
    grads = xs.grad is not None and _close(xs.grad, xf.grad) and all(mine.grad is not None and _close(mine.grad, whole.grad if dim is None else _own_slice(whole.grad, dim))
                                             for mine, whole, dim in shards)
    held = sum(mine.numel() for mine, _, _ in shards) / sum(whole.numel() for _, whole, _ in shards)
    world = dist.get_world_size()
    return dict(layer=name, same_output=_close(out, ref), same_gradients=grads, weights_per_rank=held, forward=log.describe("forward"),
                backward=log.describe("backward"), sent=log.bytes_sent("forward", world) + log.bytes_sent("backward", world))


def _torch_tp(fc1: nn.Linear, fc2: nn.Linear, x: torch.Tensor) -> dict:
    """The same MLP through torch.distributed.tensor.parallel (ColwiseParallel, RowwiseParallel), counted by CommDebugMode."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    full = nn.Sequential(fc1, nn.GELU(), fc2)
    model = parallelize_module(copy.deepcopy(full), init_device_mesh("cpu", (dist.get_world_size(),)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
    xs, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    counter = CommDebugMode()
    with counter:
        out = model(xs)
        forward = counter.get_total_counts()
        out.pow(2).sum().backward()
    full(xf).pow(2).sum().backward()
    total = counter.get_total_counts()
    ops = ", ".join(sorted({str(op).split(".")[-1] for op in counter.get_comm_counts()}))
    return dict(layer="MLP via torch parallelize_module (Colwise, Rowwise)", same_output=_close(out.full_tensor() if hasattr(out, "full_tensor") else out, full(xf)),
                same_gradients=_close(xs.grad, xf.grad), weights_per_rank=model[0].weight.to_local().numel() / fc1.weight.numel(),
                forward=f"{forward} {ops}", backward=f"{total - forward} {ops}", sent=None)


def _tp_worker(column_layer: type, row_layer: type, batch: int, width: int, hidden: int, with_torch: bool) -> list[dict]:
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(width, hidden), nn.Linear(hidden, width)
    x, h = torch.randn(batch, width), torch.randn(batch, hidden)
    fresh = copy.deepcopy  # every case starts from gradient-free copies of the same two layers
    cases = [
        _case("column-parallel linear, output gathered", column_layer(fc1), fresh(fc1), x, column_layer, row_layer),
        _case("row-parallel linear, input split on entry", row_layer(fc2), fresh(fc2), h, column_layer, row_layer),
        # Megatron's MLP: the column-parallel output stays split, exactly as the row-parallel layer wants its input
        _case("MLP: column-parallel, GELU, row-parallel", nn.Sequential(column_layer(fc1, gather_output=False), nn.GELU(), row_layer(fc2, input_is_parallel=True)),
              nn.Sequential(fresh(fc1), nn.GELU(), fresh(fc2)), x, column_layer, row_layer),
    ]
    return cases + ([_torch_tp(fresh(fc1), fresh(fc2), x)] if with_torch else [])


def tensor_parallel_check(column_layer: type, row_layer: type, world_sizes: tuple[int, ...] = (2, 4), batch: int = 8, width: int = 64, hidden: int = 256,
                          with_torch: bool = True, timeout: float = 120) -> TensorParallelCheck:
    """A cell's column- and row-parallel layers, and Megatron's MLP of them, on N gloo workers against the same layers on one device.

    ``column_layer(full_linear, gather_output=True)`` and ``row_layer(full_linear, input_is_parallel=False)`` build this rank's
    part of an ``nn.Linear`` (attributes ``weight`` and ``bias``); they communicate through ``copy_to_parallel``,
    ``reduce_from_parallel``, ``gather_from_parallel`` and ``scatter_to_parallel``, which log every collective.

    Checks the output, the input's gradient and every weight shard's gradient, and notes each
    collective per rank (``with_torch``: also torch's ``parallelize_module``, counted by CommDebugMode).
    """
    rows = []
    for n in world_sizes:
        if width % n or hidden % n:
            raise ValueError(f"width {width} and hidden {hidden} must be multiples of every world size (got {n})")
        per_rank = launch(_tp_worker, n, args=(column_layer, row_layer, batch, width, hidden, with_torch), timeout=timeout, echo=False)
        for i, case in enumerate(per_rank[0]):
            agree = [r[i] for r in per_rank]
            rows.append(TensorParallelRow(case["layer"], n, all(c["same_output"] for c in agree), all(c["same_gradients"] for c in agree),
                                          case["weights_per_rank"], case["forward"], case["backward"], case["sent"]))
    act, hid = batch * width * 4, batch * hidden * 4
    notes = [f"x: {batch} x {width} (fp32, {format_bytes(act)}), hidden layer {hidden} wide ({format_bytes(hid)} per batch). Collectives are "
             "listed with their full message size; 'sent per rank' is what each rank sends if every collective runs as a ring.",
             "Megatron's pairing needs no communication between the two layers: the column-parallel layer leaves its output split "
             "exactly as the row-parallel layer wants its input, so one all-reduce forward and one backward serve the whole MLP.",
             "Every rank also needs the full input x and produces the full output: tensor parallelism splits weights and compute, "
             "not the activations at the block's edges."]
    return TensorParallelCheck(rows, notes)
