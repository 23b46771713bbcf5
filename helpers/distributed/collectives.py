"""Tools that run inside workers to watch and time collectives; the algorithms themselves are written in the lectures.

``count_traffic`` records every byte a rank sends, so the cost formulas of ``helpers.distributed.comm_models``
can be checked on real runs of a lecture's (or a student's) all-reduce; ``point_to_point_only`` makes every
collective raise, for exercises built from send/recv; ``sends_scaled`` changes what every message carries, so a
check can see that a result really travelled in the messages; ``all_reduce_calls`` records (and can scale) every
all-reduce; ``collective_calls`` names every collective, so a check can count them per forward or backward pass.
All watch torch's dispatcher, where every route meets.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from helpers.core.fake import tensor_bytes
from helpers.core.torch_adapters.dispatch import TorchDispatchMode
from helpers.core.torch_adapters.op_overrides import calls_wrapped, kernels_replaced, op_names


def torch_all_reduce(tensor: torch.Tensor, average: bool = False) -> torch.Tensor:
    """torch.distributed's own all_reduce (gloo or NCCL pick the algorithm), in place, for side-by-side timing."""
    dist.all_reduce(tensor)
    if average:
        tensor.div_(dist.get_world_size())
    return tensor


# ---------------------------------------------------------------- watching the traffic

COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")  # where torch registers its communication operators


@dataclass
class Traffic:
    """What this rank sent while counting: bytes and messages per destination rank."""

    bytes_to: Counter = field(default_factory=Counter)
    messages_to: Counter = field(default_factory=Counter)

    @property
    def bytes_sent(self) -> int:
        return sum(self.bytes_to.values())

    @property
    def messages(self) -> int:
        return sum(self.messages_to.values())

    @property
    def peers(self) -> set[int]:
        return set(self.bytes_to)


class _Watch(TorchDispatchMode):
    """Sees every c10d operation of this process at torch's dispatcher, whichever Python name called it."""

    def __init__(self, on_op: Callable[[str, tuple], None]):
        super().__init__()
        self.on_op = on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in COLLECTIVE_NAMESPACES:
            self.on_op(func.__name__.split(".")[0], args)
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Within the block, record every tensor this process sends point to point (``send``, ``isend``, by any route)."""
    traffic = Traffic()

    def record(op: str, args: tuple) -> None:
        if op == "send":  # c10d::send(Tensor[] tensors, ProcessGroup group, int dst, int tag): dst ranks in the group
            tensors, dst = args[0], args[2]
            traffic.bytes_to[dst] += sum(map(tensor_bytes, tensors))
            traffic.messages_to[dst] += 1

    with _Watch(record):
        yield traffic


POINT_TO_POINT = {"send", "recv_", "recv_any_source_"}


def _refusal(op: str) -> str:
    return f"the collective {op} is not allowed here: build the algorithm from dist.send/recv/isend/irecv only"


@contextlib.contextmanager
def point_to_point_only() -> Iterator[None]:
    """Within the block, every collective raises: only send/recv (and isend/irecv) work.

    Checked at torch's dispatcher, where every route to a collective meets (``dist.all_reduce``,
    ``torch.distributed.distributed_c10d``, a process group's own methods, ``torch.distributed.nn``,
    object collectives, barriers), and in every thread of the process: for this thread by a dispatch mode,
    for the others by kernels that refuse in place of each collective's own until the block ends.
    """
    def refuse(op: str, args: tuple) -> None:
        if op not in POINT_TO_POINT:
            raise RuntimeError(_refusal(f"c10d.{op}"))

    def refusing_kernel(op: str):
        def kernel(*args, **kwargs):
            raise RuntimeError(_refusal(op) + " (on any thread)")
        return kernel

    collectives = [op for op in op_names(COLLECTIVE_NAMESPACES) if op.partition("::")[2] not in POINT_TO_POINT]
    with kernels_replaced({op: refusing_kernel(op) for op in collectives}), _Watch(refuse):
        yield


@contextlib.contextmanager
def sends_scaled(factor: float) -> Iterator[None]:
    """Within the block, every floating-point tensor this process sends (any thread, any route) arrives times ``factor``.

    The sender's own tensor is left as it was; integer tensors travel unchanged. A sum or a broadcast built from
    send/recv changes with the factor on every rank that received; a result passed some other way (a file,
    shared memory) does not, whatever traffic went alongside it.
    """
    def scaled_send(original, tensors, group, dst, tag):
        return original([t * factor if t.is_floating_point() else t for t in tensors], group, dst, tag)

    with calls_wrapped({"c10d::send": scaled_send}):
        yield


@contextlib.contextmanager
def all_reduce_calls(scale: float = 1.0) -> Iterator[list[int]]:
    """Within the block, the bytes of every all-reduce this process starts (any thread, any route), in order.

    With ``scale``, each call's tensors are multiplied by it in place just before they are reduced: a result
    built from the all-reduce comes out ``scale`` times larger; one passed some other way (a file, shared
    memory) does not, whatever calls went alongside it.
    """
    calls: list[int] = []

    def recorded(original, tensors, *rest):
        calls.append(sum(map(tensor_bytes, tensors)))
        if scale != 1.0:
            for tensor in tensors:
                tensor.mul_(scale)
        return original(tensors, *rest)

    with calls_wrapped({"c10d::allreduce_": recorded}):
        yield calls


NOT_COLLECTIVES = {"send", "recv_", "recv_any_source_", "check_for_nan", "isend", "irecv", "batch_p2p_ops", "wait_tensor",
                   "_wrap_tensor_autograd"}  # messages, checks and bookkeeping


@contextlib.contextmanager
def collective_calls() -> Iterator[list[str]]:
    """Within the block, the name of every collective this process starts (any thread, any route), in order.

    Point-to-point messages are not collectives and are not listed; torch's functional collectives
    (``_c10d_functional``) are, under their own names.
    """
    calls: list[str] = []

    def recorded_as(op: str):
        def recorded(original, *args):
            calls.append(op)
            return original(*args)
        return recorded

    ops = [op for op in op_names(COLLECTIVE_NAMESPACES[:2]) if op.partition("::")[2] not in NOT_COLLECTIVES]
    with calls_wrapped({op: recorded_as(op) for op in ops}):
        yield calls


def time_collective(fn: Callable[[torch.Tensor], torch.Tensor], numel: int, repeats: int = 5, dtype=torch.float32) -> float:
    """Median seconds of ``fn(tensor)`` across ranks (the slowest rank's time each round), after one warm-up."""
    tensor = torch.ones(numel, dtype=dtype)
    fn(tensor)
    times = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        fn(tensor)
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        times.append(elapsed.item())
    return sorted(times)[len(times) // 2]


def ping_pong(numel: int, repeats: int = 5) -> float:
    """One-way seconds for a message of ``numel`` float32 between ranks 0 and 1: half the fastest round trip.

    The fastest, not the median: other processes on the machine only ever add time, and the link's own
    latency and bandwidth are what the alpha-beta model wants.
    """
    rank, buffer = dist.get_rank(), torch.zeros(numel)
    times = []
    for _ in range(repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(buffer, 1)
            dist.recv(buffer, 1)
        elif rank == 1:
            dist.recv(buffer, 0)
            dist.send(buffer, 0)
        times.append((time.perf_counter() - start) / 2)
    return min(times[1:])
