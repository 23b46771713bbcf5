"""ZeRO: sharding optimizer state, gradients and parameters over data-parallel workers.

``zero_memory`` derives the bytes each worker holds per parameter at stages 0-3 against the
number of workers, from a bytes-per-parameter layout (``helpers.core.memory.bytes_per_param``'s rows).
``zero_check`` runs the real thing on a gloo group: plain DDP with Adam, ZeRO-1 with torch's
``ZeroRedundancyOptimizer``, and ZeRO-3 with FSDP2's ``fully_shard``; it measures every rank's
parameter, gradient and optimizer-state bytes against the formula and checks that all three
train to the same weights.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from helpers.core import plots
from helpers.core.memory import optimizer_state_tensors
from helpers.core.report import Report, column, format_bytes
from helpers.core.workers import launch
from helpers.distributed.ddp import mlp

STAGES = {
    0: ("plain data parallelism", "nothing"),
    1: ("ZeRO-1", "optimizer state"),
    2: ("ZeRO-2", "optimizer state, gradients"),
    3: ("ZeRO-3", "optimizer state, gradients, parameters"),
}


@dataclass(frozen=True)
class Layout:
    """Bytes per parameter of one training setup: the weights, their gradients, and the optimizer's state (master copy included)."""

    weights: float
    gradients: float
    optimizer_state: float
    name: str = ""

    @classmethod
    def from_row(cls, row: Any) -> "Layout":
        """From a ``bytes_per_param`` row: an fp32 master copy counts as optimizer state, as ZeRO counts it."""
        return cls(row.weights, row.gradients, row.master_weights + row.optimizer_state, row.setup)

    @classmethod
    def mixed_precision_adam(cls) -> "Layout":
        """fp16 weights and gradients; fp32 master weights and Adam's two fp32 moments (the ZeRO paper's setting)."""
        half, single = _element_bytes(torch.float16), _element_bytes(torch.float32)
        return cls(half, half, 3 * single, "mixed precision, Adam, fp32 master copy")

    @classmethod
    def fp32_adam(cls) -> "Layout":
        single = _element_bytes(torch.float32)
        return cls(single, single, 2 * single, "fp32, Adam")


def _element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def per_worker(stage: int, workers: int, layout: Layout) -> dict[str, float]:
    """Bytes per parameter one worker holds at ``stage``: optimizer state, then gradients, then weights are split N ways."""
    if stage not in STAGES:
        raise ValueError(f"ZeRO stages are 0 (plain data parallelism) to 3, got {stage}")
    if workers < 1:
        raise ValueError(f"need at least one worker, got {workers}")
    return {
        "weights": layout.weights / (workers if stage >= 3 else 1),
        "gradients": layout.gradients / (workers if stage >= 2 else 1),
        "optimizer state": layout.optimizer_state / (workers if stage >= 1 else 1),
    }


def formula(stage: int, layout: Layout) -> str:
    """The stage's bytes per parameter as an expression in N, e.g. '2 + 2 + 12/N'."""
    parts = per_worker(stage, 1, layout).values()
    sharded = [stage >= 3, stage >= 2, stage >= 1]
    kept = [f"{v:g}" for v, s in zip(parts, sharded) if not s]
    split = sum(v for v, s in zip(parts, sharded) if s)
    return " + ".join(kept + ([f"{split:g}/N"] if split else []))


@dataclass
class StageBytes:
    """One ZeRO stage: what it shards, bytes per parameter per worker for each N, and the model's bytes per worker."""

    label: str = column("stage")
    sharded: str = column("sharded over N")
    formula: str = column("B/param")
    per_param: dict[int, float] = column("N={}", ".3g", spread=True)  # workers N -> bytes per parameter on each
    model: dict[str, float] = column("{}", format_bytes, spread=True)  # '<model> at N=<largest N>' -> bytes on each worker
    stage: int = 0


class ZeroMemory(Report):
    """Bytes per parameter per worker at each ZeRO stage against the number of workers N, and the model's size per worker.

    ``find(stage=3).per_param[8]``: bytes per parameter on each of 8 workers at ZeRO-3.
    """

    def __init__(self, layout: Layout, workers: Sequence[int], params: int | None, model_name: str):
        self.layout, self.workers, self.params = layout, list(workers), params
        self.title = f"ZeRO: bytes per parameter on each worker ({layout.name or 'given layout'})"
        self.per_param = {(s, n): sum(per_worker(s, n, layout).values()) for s in STAGES for n in self.workers}
        largest = self.workers[-1]
        rows = [StageBytes(f"{stage}: {name}", sharded, formula(stage, layout), {n: self.per_param[stage, n] for n in self.workers},
                           {f"{model_name} at N={largest}": self.per_param[stage, largest] * params} if params else {}, stage)
                for stage, (name, sharded) in STAGES.items()]
        notes = []
        if params:
            notes.append(f"{model_name}: {params:,} parameters; at N = {self.workers[-1]} each worker holds "
                         + ", ".join(f"{format_bytes(self.per_param[s, self.workers[-1]] * params)} (stage {s})" for s in STAGES) + ".")
        notes.append("Activations come on top, at every stage; ZeRO-3 also gathers each layer's weights just before it runs.")
        super().__init__(rows, notes)

    def plot(self, ax=None):
        series = {f"stage {s}: {name}": (self.workers, [self.per_param[s, n] for n in self.workers]) for s, (name, _) in STAGES.items()}
        return plots.line_chart(series, ax, title="ZeRO: memory per worker", xlabel="workers N (log scale)",
                                ylabel="bytes per parameter on each worker", logx=True)


def zero_memory(workers: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), layout: Layout | Any = None, params: int | None = None,
                model_name: str = "the model") -> ZeroMemory:
    """Bytes per parameter each worker holds at ZeRO stages 0-3 for each N (derived), and for a model of ``params`` parameters.

    ``layout`` is a ``Layout`` or a ``bytes_per_param`` row (default: mixed-precision Adam, 2 + 2 + 12 bytes).
    """
    if layout is None:
        layout = Layout.mixed_precision_adam()
    elif not isinstance(layout, Layout):
        layout = Layout.from_row(layout)
    return ZeroMemory(layout, sorted(workers), params, model_name)


# ---------------------------------------------------------------- the real thing on a process group


@dataclass
class ZeroRankRow:
    method: str = column("method")
    stage: int
    rank: int = column("rank")
    parameters: int = column("parameters", format_bytes)
    gradients: int = column("gradients", format_bytes)
    optimizer_state: int = column("optimizer state", format_bytes)
    total: int = column("total", format_bytes, init=False)
    formula_bytes: float = column("formula", format_bytes)
    max_weight_difference: float = column("max |w - w_DDP| after training", ".1e")

    def __post_init__(self):
        self.total = self.parameters + self.gradients + self.optimizer_state


class ZeroCheck(Report):
    """Every rank's parameter, gradient and optimizer-state bytes under DDP, ZeRO-1 and ZeRO-3, against the formula."""

    def __init__(self, rows: list[ZeroRankRow], notes: list[str], world_size: int):
        self.world_size = world_size
        self.title = f"ZeRO on a real process group: {world_size} gloo workers, bytes held by each rank"
        super().__init__(rows, notes)



def _local_bytes(tensors) -> int:
    """Bytes this rank stores for ``tensors`` (a sharded DTensor counts only its local shard)."""
    total = 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, batches) -> None:
    """Adam steps on this rank's batches; gradients stay in ``.grad`` after the last step, to be counted."""
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def _full_weights(model: nn.Module) -> list[torch.Tensor]:
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for p in model.parameters()]


def _zero_worker(width: int, depth: int, batch: int, steps: int, lr: float) -> list[dict]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    rank = dist.get_rank()
    torch.manual_seed(0)
    start = mlp(width, depth)
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)) for _ in range(steps)]

    def adam(params):
        return torch.optim.Adam(params, lr=lr)

    ddp = DistributedDataParallel(copy.deepcopy(start))
    plain = adam(ddp.parameters())
    zero1 = DistributedDataParallel(copy.deepcopy(start))
    sharded_adam = ZeroRedundancyOptimizer(zero1.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    zero3 = copy.deepcopy(start)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in zero3:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)  # one parameter group per layer: gathered just before it runs, freed after
    fully_shard(zero3, mesh=mesh)
    fsdp_adam = adam(zero3.parameters())
    runs = [("DDP + Adam", 0, ddp, plain, plain), ("ZeroRedundancyOptimizer (ZeRO-1)", 1, zero1, sharded_adam, sharded_adam.optim),
            ("FSDP2 fully_shard (ZeRO-3)", 3, zero3, fsdp_adam, fsdp_adam)]
    results = []
    for name, stage, model, optimizer, local_optimizer in runs:
        _train(model, optimizer, batches)
        results.append(dict(method=name, stage=stage, parameters=_local_bytes(model.parameters()),
                            gradients=_local_bytes(p.grad for p in model.parameters()),
                            optimizer_state=_local_bytes(optimizer_state_tensors(local_optimizer)), weights=_full_weights(model)))
    reference = results[0]["weights"]
    for r in results:
        r["max_weight_difference"] = max((w - ref).abs().max().item() for w, ref in zip(r.pop("weights"), reference))
    return results


def zero_check(world_size: int = 2, width: int = 256, depth: int = 4, batch: int = 8, steps: int = 3, lr: float = 1e-3,
               timeout: float = 120) -> ZeroCheck:
    """Train an MLP with DDP, ZeRO-1 and ZeRO-3 (FSDP2) on ``world_size`` gloo workers; bytes per rank against the formula.

    All three start from the same weights and see the same batches; ``max_weight_difference``
    says how far each ends from DDP's weights (rounding only: the same training).
    """
    if width % world_size:
        raise ValueError(f"width {width} must be a multiple of world_size {world_size}, so every rank holds an equal shard")
    per_rank = launch(_zero_worker, world_size, args=(width, depth, batch, steps, lr), timeout=timeout, echo=False)
    params = sum(p.numel() for p in mlp(width, depth).parameters())
    layout = Layout.fp32_adam()
    rows = []
    for rank, results in enumerate(per_rank):
        for r in results:
            expected = sum(per_worker(r["stage"], world_size, layout).values()) * params
            rows.append(ZeroRankRow(r["method"], r["stage"], rank, r["parameters"], r["gradients"], r["optimizer_state"], expected,
                                    r["max_weight_difference"]))
    rows.sort(key=lambda r: (r.stage, r.rank))
    notes = [f"An MLP of {depth} linear {width}x{width} layers ({params:,} parameters), fp32 Adam ({formula(0, layout)} B/param), "
             f"{steps} steps, each rank on its own batches; formula = the stage's bytes per parameter x parameters.",
             "ZeroRedundancyOptimizer gives each rank whole parameters (greedily, by size), so its shares are only as even as the "
             "parameters allow; FSDP2 splits every parameter's first dimension N ways. Adam's step counters add a few bytes."]
    return ZeroCheck(rows, notes, world_size)
