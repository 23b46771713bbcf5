"""Pipeline parallelism: one stage of the model per worker, micro-batches flowing through, and the bubble.

A schedule is a function ``order(stage, stages, micro_batches)`` returning the stage's ops in order, each
``("F" or "B", micro-batch)``: the lecture writes GPipe's and 1F1B's. ``pipeline_schedule`` plays a schedule
on an idealised clock and draws it. ``pipeline_experiment`` runs it for real: one stage per
gloo worker, activations sent forward and their gradients sent back with send/recv, every
forward and backward timestamped (and its CPU time taken, to see how much of a core it got), so each
stage's busy and idle time is measured; the bubble is set beside (p - 1) / (m + p - 1) and beside the
schedule replayed with the measured op times, and the gradients beside the unsplit model's.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from helpers.core import load, plots
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.workers import launch
from helpers.distributed.collectives import count_traffic

Op = tuple[str, int]  # ("F" or "B", micro-batch index)
Schedule = Callable[[int, int, int], Sequence[Op]]  # (stage, stages, micro_batches) -> that stage's ops in order
KIND = {"F": "forward", "B": "backward"}


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """The idle share of a pipeline of equal stages: (p - 1) / (m + p - 1)."""
    _check(stages, micro_batches)
    return (stages - 1) / (micro_batches + stages - 1)


def _check(stages: int, micro_batches: int) -> None:
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need at least one stage and one micro-batch, got stages={stages}, micro_batches={micro_batches}")


def _name(schedule: Schedule) -> str:
    return getattr(schedule, "__name__", type(schedule).__name__)


def stage_orders(schedule: Schedule, stages: int, micro_batches: int) -> list[list[Op]]:
    """Every stage's order from ``schedule``, checked: each micro-batch's forward and backward exactly once, forward first."""
    _check(stages, micro_batches)
    orders = []
    for s in range(stages):
        order = [(str(kind), int(i)) for kind, i in schedule(s, stages, micro_batches)]
        wanted = sorted([("B", i) for i in range(micro_batches)] + [("F", i) for i in range(micro_batches)])
        if sorted(order) != wanted or any(order.index(("B", i)) < order.index(("F", i)) for i in range(micro_batches)):
            raise ValueError(f"{_name(schedule)}({s}, {stages}, {micro_batches}) returned {order}: a stage must run each micro-batch's "
                             "forward ('F', i) and then its backward ('B', i), each exactly once")
        orders.append(order)
    return orders


def ideal_timeline(schedule: Schedule, stages: int, micro_batches: int, forward: float | Sequence[float] = 1.0,
                   backward: float | Sequence[float] = 2.0, op_seconds: Sequence[dict] | None = None) -> list[list[tuple]]:
    """Start and end of every op per stage when each forward takes ``forward`` and each backward ``backward``, communication free.

    Durations are one number for all stages or one per stage, or, with ``op_seconds``, each op's own
    (per stage, a dict from ("F" or "B", micro-batch) to seconds). An op starts when its stage is
    free and its input is ready: a forward needs the previous stage's forward of the same
    micro-batch, a backward the next stage's backward.
    """
    forward = [forward] * stages if isinstance(forward, (int, float)) else list(forward)
    backward = [backward] * stages if isinstance(backward, (int, float)) else list(backward)
    orders = stage_orders(schedule, stages, micro_batches)
    done: dict[tuple[str, int, int], float] = {}
    timeline: list[list[tuple]] = [[] for _ in range(stages)]
    position, free = [0] * stages, [0.0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] == len(orders[s]):
                continue
            kind, i = orders[s][position[s]]
            needs = ("F", s - 1, i) if kind == "F" and s > 0 else ("B", s + 1, i) if kind == "B" and s < stages - 1 else None
            if needs is not None and needs not in done:
                continue
            start = max(free[s], done.get(needs, 0.0))
            end = start + (op_seconds[s][kind, i] if op_seconds is not None else forward[s] if kind == "F" else backward[s])
            done[kind, s, i], free[s] = end, end
            timeline[s].append((kind, i, start, end))
            position[s] += 1
            progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks: a stage waits for an op that never runs")
    return timeline


def bubble_of(timeline: Sequence[Sequence[tuple]]) -> float:
    """The idle share of a timeline, 1 - busy / (stages x makespan), from (kind, micro-batch, start, end) events per stage."""
    starts = [e[2] for lane in timeline for e in lane]
    ends = [e[3] for lane in timeline for e in lane]
    busy = sum(e[3] - e[2] for lane in timeline for e in lane)
    return 1 - busy / (len(timeline) * (max(ends) - min(starts)))


def _held(order: Sequence[Op]) -> int:
    """The most micro-batches whose activations a stage holds at once (forwarded, not yet backpropagated)."""
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    return peak


def _gantt(timeline: Sequence[Sequence[tuple]], ax, title: str, unit: str, scale: float = 1.0):
    lanes = {f"stage {s}": [(start * scale, end * scale, f"{kind}{i}", KIND[kind]) for kind, i, start, end, *_ in lane]
             for s, lane in enumerate(timeline)}
    return plots.gantt(lanes, ax, title=title, xlabel=unit)


@dataclass
class StageWork:
    """One stage of an idealised schedule."""

    stage: int = column("stage")
    order: str = column("order of work")
    busy: float = column("busy", ".3g")
    idle: float = column("idle", ".3g")
    held: int = column("activations held (micro-batches)")


class PipelineSchedule(Report):
    """A pipeline schedule on an idealised clock: each stage's order of work, busy and idle time, the bubble."""

    def __init__(self, schedule: Schedule, stages: int, micro_batches: int, forward: float, backward: float):
        self.stages, self.micro_batches, self.schedule = stages, micro_batches, schedule
        self.timeline = ideal_timeline(schedule, stages, micro_batches, forward, backward)
        self.makespan = max(e[3] for lane in self.timeline for e in lane)
        self.bubble = bubble_of(self.timeline)
        self.formula = bubble_fraction(stages, micro_batches)
        self.title = f"{_name(schedule)} schedule: p = {stages} stages, m = {micro_batches} micro-batches (forward {forward:g}, backward {backward:g} time units)"
        rows = []
        for s, lane in enumerate(self.timeline):
            busy = sum(e[3] - e[2] for e in lane)
            rows.append(StageWork(stage=s, order=" ".join(f"{k}{i}" for k, i, _, _ in lane), busy=busy, idle=self.makespan - busy,
                                  held=_held(stage_orders(schedule, stages, micro_batches)[s])))
        notes = [f"Idle share (the bubble): {self.bubble:.3f}; (p - 1) / (m + p - 1) = {stages - 1}/{micro_batches + stages - 1} = {self.formula:.3f}."]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        return _gantt(self.timeline, ax, f"{_name(self.schedule)}: p = {self.stages}, m = {self.micro_batches}, bubble {self.bubble:.0%}", "time (units)")


def pipeline_schedule(schedule: Schedule, stages: int = 4, micro_batches: int = 4, forward: float = 1.0, backward: float = 2.0) -> PipelineSchedule:
    """Play ``schedule`` (``order(stage, stages, micro_batches)``) for ``micro_batches`` through ``stages`` equal stages; ``.plot()`` draws it."""
    return PipelineSchedule(schedule, stages, micro_batches, forward, backward)


# ---------------------------------------------------------------- the real pipeline


def pipeline_model(stages: int, layers_per_stage: int = 2, width: int = 512, seed: int = 0) -> nn.Sequential:
    """An MLP cut into ``stages`` equal stages (an nn.Sequential of nn.Sequentials), seeded so every process builds the same."""
    torch.manual_seed(seed)
    return nn.Sequential(*(nn.Sequential(*(m for _ in range(layers_per_stage) for m in (nn.Linear(width, width), nn.ReLU())))
                           for _ in range(stages)))


def pipeline_batch(batch: int, width: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, width, generator=g), torch.randn(batch, width, generator=g)


def _run_stage(stage: nn.Module, order: Sequence[Op], micro_batches: int, x: torch.Tensor, y: torch.Tensor) -> list[tuple]:
    """This rank's part of one pipelined forward and backward; returns (kind, micro-batch, start, end, CPU seconds) of its compute."""
    rank, last = dist.get_rank(), dist.get_rank() == dist.get_world_size() - 1
    xs, ys = x.chunk(micro_batches), y.chunk(micro_batches)
    cpu_clock = time.thread_time if torch.get_num_threads() == 1 else time.process_time  # one thread: its own CPU time, no helper threads'
    inputs: dict[int, torch.Tensor] = {}
    outputs: dict[int, torch.Tensor] = {}
    sends, events = [], []
    t0 = 0.0  # perf_counter is the machine's monotonic clock, shared by the stages' processes: their events line up
    for kind, i in order:
        if kind == "F":
            if rank == 0:
                inputs[i] = xs[i]
            else:
                inputs[i] = torch.empty_like(xs[i])
                dist.recv(inputs[i], rank - 1)  # waiting here is idle time
                inputs[i].requires_grad_()
            start, cpu = time.perf_counter(), cpu_clock()
            out = stage(inputs[i])
            outputs[i] = nn.functional.mse_loss(out, ys[i]) / micro_batches if last else out  # equal chunks: sum = the batch's mean loss
            events.append(("F", i, start - t0, time.perf_counter() - t0, cpu_clock() - cpu))
            if not last:
                sends.append(dist.isend(out.detach(), rank + 1))
        else:
            grad = None
            if not last:
                grad = torch.empty_like(outputs[i])
                dist.recv(grad, rank + 1)
            start, cpu = time.perf_counter(), cpu_clock()
            outputs.pop(i).backward(grad)
            events.append(("B", i, start - t0, time.perf_counter() - t0, cpu_clock() - cpu))
            if rank > 0:
                sends.append(dist.isend(inputs[i].grad, rank - 1))
    for request in sends:
        request.wait()
    return events


def _pipeline_worker(layers_per_stage: int, width: int, batch: int, micro_batch_counts: Sequence[int], schedule: Schedule, repeats: int) -> dict:
    rank, stages = dist.get_rank(), dist.get_world_size()
    stage = pipeline_model(stages, layers_per_stage, width)[rank]
    x, y = pipeline_batch(batch, width)
    out = {}
    for m in micro_batch_counts:
        order = stage_orders(schedule, stages, m)[rank]
        attempts = []
        for _ in range(repeats + 1):  # the first is a warm-up
            stage.zero_grad(set_to_none=True)
            dist.barrier()
            with count_traffic() as traffic:
                attempts.append(_run_stage(stage, order, m, x, y))
        out[m] = dict(attempts=attempts[1:], bytes_sent=traffic.bytes_sent, held=_held(order),
                      grads=[p.grad.clone() for p in stage.parameters()], threads=torch.get_num_threads())
    return out


def _range(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.3f}-{pair[1]:.3f}"


@dataclass
class PipelineRow:
    micro_batches: int = column("m")
    micro_batch_size: int = column("micro-batch")
    formula_bubble: float = column("bubble (p-1)/(m+p-1)", ".3f")
    expected_bubble: float = column("bubble from op times", ".3f")
    measured_bubble: float = column("bubble measured", ".3f")
    measured_range: tuple[float, float] = column("measured, over the repeats", _range)
    makespan: float = column("time per batch", format_seconds)
    busy_per_stage: str = column("busy per stage")
    work_per_micro_batch: float = column("compute per micro-batch", format_seconds)
    wait_per_micro_batch: float = column("time beyond op times, per micro-batch", format_seconds)
    core_share: float = column("core share in ops", ".0%")
    held: int = column("activations held on stage 0")
    bytes_per_boundary: int = column("sent per stage boundary", format_bytes)
    same_gradients: bool = column("same gradients as unsplit")
    # not shown in the table; read by the lecture's verdicts
    busy_total: float = 0.0  # the ops' time summed over all stages
    replayed_makespan: float = 0.0  # the schedule replayed with this run's op times, messages free
    makespan_range: tuple[float, float] = (0.0, 0.0)  # time per batch over the repeats
    alone_slowdown: float | None = None  # ops alone, time per row of the batch, against the same ops at the first m
    overlap_slowdown: float | None = None  # ops beside another stage's ops, against the same stage's same kind of op alone


class PipelineRun(Report):
    """Measured pipelines, one row per number of micro-batches: the bubble beside the formula, and the gradients checked."""

    def __init__(self, rows: list[PipelineRow], timelines: dict[int, list[list[tuple]]], stages: int, schedule: Schedule, notes: list[str]):
        self.timelines, self.stages, self.schedule = timelines, stages, schedule
        self.title = f"{_name(schedule)} on {stages} real processes (one stage each): measured bubble against the formula"
        super().__init__(rows, notes)

    def plot(self, ax=None):
        """The bubble against m: measured, and the formula."""
        ms = [r.micro_batches for r in self.rows]
        formula, replayed = "(p - 1) / (m + p - 1)", "replayed from measured op times"
        ax = plots.line_chart({"measured": (ms, [r.measured_bubble for r in self.rows]), formula: (ms, [r.formula_bubble for r in self.rows]),
                               replayed: (ms, [r.expected_bubble for r in self.rows])}, ax, styles={formula: "--", replayed: ":"},
                              title=f"Pipeline bubble, p = {self.stages} stages", xlabel="micro-batches m (log scale)",
                              ylabel="idle share of the stages", logx=True)
        ax.fill_between(ms, [r.measured_range[0] for r in self.rows], [r.measured_range[1] for r in self.rows], alpha=0.2,
                        color=ax.lines[0].get_color(), label="measured, range over the repeats")
        ax.legend()
        ax.set_ylim(bottom=0)
        return ax

    def plot_timeline(self, micro_batches: int | None = None, ax=None):
        """Each stage's forwards and backwards on the measured clock (milliseconds)."""
        m = micro_batches or max(self.timelines)
        return _gantt(self.timelines[m], ax, f"Measured {_name(self.schedule)}: p = {self.stages}, m = {m}, bubble {self.find(micro_batches=m).measured_bubble:.0%}",
                      "time since the start (ms)", scale=1e3)


def _replayed(timeline: list[list[tuple]], micro_batches: int, schedule: Schedule) -> tuple[float, float, float]:
    """The schedule replayed with this run's own op times and free messages: its bubble, its time per batch, and the
    slower stage's median forward + backward of one micro-batch. The replay's busy time is the run's, so every
    difference between the two is time outside the ops."""
    def median_of(lane, kind):
        return statistics.median(e[3] - e[2] for e in lane if e[0] == kind)

    op_seconds = [{(e[0], e[1]): e[3] - e[2] for e in lane} for lane in timeline]
    replay = ideal_timeline(schedule, len(timeline), micro_batches, op_seconds=op_seconds)
    work = max(median_of(lane, "F") + median_of(lane, "B") for lane in timeline)
    return bubble_of(replay), max(e[3] for lane in replay for e in lane), work


def _overlaps(timeline: list[list[tuple]]) -> list[list[float]]:
    """For every op, the share of its time during which another stage was computing too."""
    shares = []
    for s, lane in enumerate(timeline):
        others = [e for t, other in enumerate(timeline) if t != s for e in other]
        shares.append([sum(max(0.0, min(e[3], o[3]) - max(e[2], o[2])) for o in others) / max(e[3] - e[2], 1e-12) for e in lane])
    return shares


def _alone_and_beside(timeline: list[list[tuple]]) -> dict[tuple[int, str], tuple[list[float], list[float]]]:
    """Per (stage, kind): durations of the ops that ran alone (under 10% overlap) and beside another stage's (over 50%)."""
    groups: dict[tuple[int, str], tuple[list[float], list[float]]] = {}
    for s, (lane, shares) in enumerate(zip(timeline, _overlaps(timeline))):
        for e, share in zip(lane, shares):
            alone, beside = groups.setdefault((s, e[0]), ([], []))
            (alone if share < 0.1 else beside if share > 0.5 else []).append(e[3] - e[2])
    return groups


def _slowdowns(timeline: list[list[tuple]], micro_batches: int, first: list[list[tuple]], first_m: int) -> tuple[float | None, float | None]:
    """Two causes of slower ops, from the timelines: ops alone, per row of the batch, against the first m's alone ops (the
    micro-batch's size), and ops beside another stage's against the same stage's same kind alone (stages sharing the machine)."""
    now, before = _alone_and_beside(timeline), _alone_and_beside(first)
    size = [statistics.median(now[k][0]) * micro_batches / (statistics.median(before[k][0]) * first_m)
            for k in now if now[k][0] and k in before and before[k][0]]
    beside = [statistics.median(b) / statistics.median(a) for a, b in now.values() if a and b]
    return (statistics.median(size) if size else None), (statistics.median(beside) if beside else None)


def _from_zero(timeline: list[list[tuple]]) -> list[list[tuple]]:
    """Events on the shared clock, shifted so that the first op of any stage starts at zero."""
    origin = min(e[2] for lane in timeline for e in lane)
    return [[(k, i, start - origin, end - origin, *rest) for k, i, start, end, *rest in lane] for lane in timeline]


def _reference_gradients(stages: int, layers_per_stage: int, width: int, batch: int) -> list[list[torch.Tensor]]:
    """Gradients of the whole, unsplit model on the whole batch (mean squared error), per stage."""
    model = pipeline_model(stages, layers_per_stage, width)
    x, y = pipeline_batch(batch, width)
    nn.functional.mse_loss(model(x), y).backward()
    return [[p.grad for p in stage.parameters()] for stage in model]


def pipeline_experiment(schedule: Schedule, stages: int = 2, micro_batches: Sequence[int] = (1, 2, 4, 8), batch: int = 1024, width: int = 1024,
                        layers_per_stage: int = 4, repeats: int = 3, timeout: float = 180) -> PipelineRun:
    """Run an MLP as a ``stages``-stage pipeline on real workers for each number of micro-batches; measure its bubble.

    For each m: ``repeats`` timed runs after a warm-up; the table shows the run with the median time per batch and
    the range of the measured bubble over all of them. Busy time is compute (forward, loss, backward); waiting in
    recv counts as idle. The CPU time of each op over its wall time (per thread) is the share of a core it got.
    """
    for m in micro_batches:
        stage_orders(schedule, stages, m)  # checks the schedule before any worker starts
        if batch % m:
            raise ValueError(f"the batch of {batch} does not split into {m} equal micro-batches; use divisors of it")
    with load.OtherLoad() as other:
        per_rank = launch(_pipeline_worker, stages, args=(layers_per_stage, width, batch, list(micro_batches), schedule, max(repeats, 1)),
                          timeout=timeout, echo=False)
    load.record(other.cores)  # the table then says when other programs shared the CPU
    reference = _reference_gradients(stages, layers_per_stage, width, batch)
    rows, timelines = [], {}
    for m in micro_batches:
        attempts = [_from_zero([per_rank[s][m]["attempts"][a] for s in range(stages)]) for a in range(len(per_rank[0][m]["attempts"]))]
        spans = [max(e[3] for lane in t for e in lane) - min(e[2] for lane in t for e in lane) for t in attempts]
        chosen = attempts[spans.index(statistics.median_low(spans))]
        timelines[m] = chosen
        bubbles = [bubble_of(t) for t in attempts]
        expected, replayed_span, work = _replayed(chosen, m, schedule)
        same = all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for s in range(stages) for g, r in zip(per_rank[s][m]["grads"], reference[s]))
        busy = ", ".join(f"{sum(e[3] - e[2] for e in lane) * 1e3:.1f} ms" for lane in chosen)
        wall = sum(e[3] - e[2] for lane in chosen for e in lane)
        cpu = sum(e[4] / per_rank[s][m]["threads"] for s, lane in enumerate(chosen) for e in lane)
        both_ways = sum(per_rank[s][m]["bytes_sent"] for s in range(stages)) // max(stages - 1, 1)
        span = statistics.median_low(spans)
        alone, beside = _slowdowns(chosen, m, timelines[micro_batches[0]], micro_batches[0])
        rows.append(PipelineRow(m, batch // m, bubble_fraction(stages, m), expected, bubble_of(chosen), (min(bubbles), max(bubbles)),
                                span, busy, work, (span - replayed_span) / m, cpu / wall, per_rank[0][m]["held"], both_ways, same,
                                busy_total=wall, replayed_makespan=replayed_span, makespan_range=(min(spans), max(spans)),
                                alone_slowdown=alone, overlap_slowdown=beside))
    threads = per_rank[0][micro_batches[0]]["threads"]
    notes = [f"An MLP of {stages * layers_per_stage} linear {width}x{width} layers, {layers_per_stage} per stage, batch {batch}; "
             f"each stage a process with {threads} CPU thread(s); activations go forward and their gradients back "
             "with isend/recv (counted: 'sent per stage boundary', both directions).",
             f"Bubble measured = 1 - (busy time of all stages) / (stages x time per batch), waiting for a message counting as idle: "
             f"the run with the median time of {max(repeats, 1)}, and the range over all of them. 'From op times' replays the schedule "
             "with this run's own op times and free messages: the formula assumes equal ops, and these are not (the first stage "
             "computes no gradient for its input, the last adds the loss, and some ops ran slower than others).",
             "Time beyond op times = (measured time per batch - the replay's) / m, never below zero: messages, and waiting for a core. "
             "Core share = CPU time / wall time of the ops, per thread: below 100% when other work took the CPU."]
    return PipelineRun(rows, timelines, stages, schedule, notes)
