"""Collectives written by hand with point-to-point messages, and tools to watch the traffic: run inside workers.

``ring_all_reduce`` is the bandwidth-optimal algorithm of Horovod and NCCL (reduce-scatter, then all-gather,
around a ring); ``parameter_server_all_reduce`` is the centralised pattern it replaced. ``count_traffic``
records every byte a rank sends, so the cost formulas of ``helpers.distributed.comm_models`` can be checked on real runs.
"""
from __future__ import annotations

import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist


def ring_all_reduce(tensor: torch.Tensor, average: bool = False) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place, with isend/recv around a ring only; returns it.

    The flat tensor is cut into ``world_size`` chunks (sizes may differ by one element). Reduce-scatter:
    in N-1 steps each rank passes a partial sum to its right neighbour, after which rank r holds the full
    sum of chunk r+1. All-gather: N-1 more steps pass the finished chunks around. Each rank sends
    2(N-1)/N of the tensor in all, whatever N is.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce works in place on a contiguous tensor; pass tensor.contiguous() and use the result")
    chunks = list(tensor.view(-1).tensor_split(world))
    right, left = (rank + 1) % world, (rank - 1) % world
    inbox = torch.empty_like(chunks[0])
    for step in range(world - 1):  # reduce-scatter
        send, recv = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        _exchange(send, inbox[: recv.numel()], right, left)
        recv.add_(inbox[: recv.numel()])
    for step in range(world - 1):  # all-gather
        send, recv = chunks[(rank + 1 - step) % world], chunks[(rank - step) % world]
        _exchange(send, recv, right, left)
    if average:
        tensor.div_(world)
    return tensor


def _exchange(send: torch.Tensor, recv: torch.Tensor, to: int, source: int) -> None:
    """Send one buffer and receive another at the same time (a blocking send on every rank would deadlock)."""
    request = dist.isend(send, to) if send.numel() else None
    if recv.numel():
        dist.recv(recv, source)
    if request is not None:
        request.wait()


def parameter_server_all_reduce(tensor: torch.Tensor, server: int = 0, average: bool = False) -> torch.Tensor:
    """Sum ``tensor`` over all ranks in place, parameter-server style: everyone sends to ``server``, which sends the sum back.

    The server's link carries (N-1) full tensors in and (N-1) out, so its time grows with N: the
    bottleneck the ring removes.
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if rank == server:
        inbox = torch.empty_like(tensor)
        for peer in (p for p in range(world) if p != server):
            dist.recv(inbox, peer)
            tensor.add_(inbox)
        if average:
            tensor.div_(world)
        requests = [dist.isend(tensor, peer) for peer in range(world) if peer != server]
        for request in requests:
            request.wait()
    else:
        dist.send(tensor, server)
        dist.recv(tensor, server)
    return tensor


def torch_all_reduce(tensor: torch.Tensor, average: bool = False) -> torch.Tensor:
    """torch.distributed's own all_reduce (gloo or NCCL pick the algorithm), in place, for side-by-side timing."""
    dist.all_reduce(tensor)
    if average:
        tensor.div_(dist.get_world_size())
    return tensor


ALL_REDUCES: dict[str, Callable[..., torch.Tensor]] = {
    "ring (send/recv)": ring_all_reduce,
    "parameter server (send/recv)": parameter_server_all_reduce,
    "dist.all_reduce": torch_all_reduce,
}


# ---------------------------------------------------------------- watching the traffic


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


@contextlib.contextmanager
def count_traffic() -> Iterator[Traffic]:
    """Within the block, record every ``dist.send`` and ``dist.isend`` of this process (then restore them)."""
    traffic = Traffic()
    originals = {name: getattr(dist, name) for name in ("send", "isend")}

    def counted(original):
        def wrapper(tensor, dst=None, *args, **kwargs):
            traffic.bytes_to[dst] += tensor.numel() * tensor.element_size()
            traffic.messages_to[dst] += 1
            return original(tensor, dst, *args, **kwargs)
        return wrapper

    for name, original in originals.items():
        setattr(dist, name, counted(original))
    try:
        yield traffic
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


COLLECTIVES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "all_gather_object", "gather_object", "scatter_object_list",
    "broadcast_object_list",
)


@contextlib.contextmanager
def point_to_point_only() -> Iterator[None]:
    """Within the block, every torch.distributed collective raises: only send/recv (and isend/irecv) work.

    For exercises that ask for an algorithm built from point-to-point messages.
    """
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def refuse(name):
        def collective(*args, **kwargs):
            raise RuntimeError(f"dist.{name} is not allowed here: build the algorithm from dist.send/recv/isend/irecv only")
        return collective

    for name in originals:
        setattr(dist, name, refuse(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


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
