"""Map-style against iterable data sets, and sharding a stream across DataLoader workers and ranks.

A map-style data set (``__len__`` and ``__getitem__``) lets a sampler pick any index in any order: the
DataLoader shuffles it, ``DistributedSampler`` splits it across ranks. An iterable data set is a stream: it
yields samples one after the other and nobody can ask it for sample 1234. Every copy of it, in every
DataLoader worker of every rank, starts the same stream from the beginning, so unless each copy keeps only
its own share, a job of R ranks with W workers each reads every sample R x W times per epoch.

The stream is the lecture's: a class ``Stream(digits, shard_by=..., seed=...)`` with ``set_epoch`` and ``order``,
yielding records with an ``index`` and the ``worker`` that read it; ``shard_by`` names the readers that split it
(``()``, ``("rank",)``, ``("rank", "worker")``). ``dataset_styles`` measures what a map-style data set and the
stream give a DataLoader; ``sharding_check`` counts, on real gloo ranks with real DataLoader workers, how often
each sample is read per epoch under each split.
"""
from __future__ import annotations

import contextlib
import hashlib
import multiprocessing as mp
import time
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, RandomSampler

from helpers.core import plots
from helpers.core.data import Digits
from helpers.core.report import Report, column, format_seconds
from helpers.core.workers import launch

SHARDINGS = {
    "none": (),
    "ranks only": ("rank",),
    "ranks and workers": ("rank", "worker"),
}


Stream = type[IterableDataset]  # Stream(digits, shard_by=(...), seed=...), with set_epoch(epoch) and order()


# ---------------------------------------------------------------- map-style against iterable


@dataclass
class StyleRow:
    style: str = column("data set")
    has_len: str = column("len()")
    random_access: str = column("dataset[i]")
    loader_shuffle: str = column("DataLoader(shuffle=True)")
    samples: int = column("samples / epoch", ",")
    distinct: int = column("distinct", ",")
    epochs_differ: bool = column("epoch 2 order differs")
    seconds: float = column("epoch time, fastest", format_seconds)
    slowest: float = column("slowest", format_seconds)
    samples_per_second: float = column("samples/s (fastest)", ",.0f")


class StylesReport(Report):
    """What a map-style data set and a stream each give a DataLoader: measured by trying, and timed over one epoch."""

    title = "Map-style against iterable data sets, on the same digits"

    def speed_verdict(self) -> str:
        """Which kind read an epoch faster: only where the ranges of epoch times do not overlap; else a tie."""
        mapped, stream = self.rows
        if stream.slowest < mapped.seconds:
            return f"the stream faster, {mapped.seconds / stream.seconds:.2f}x (its slowest epoch beat the map-style's fastest)"
        if mapped.slowest < stream.seconds:
            return f"the map-style set faster, {stream.seconds / mapped.seconds:.2f}x (its slowest epoch beat the stream's fastest)"
        return (f"a tie: the epoch times overlap ({format_seconds(mapped.seconds)} to {format_seconds(mapped.slowest)} against "
                f"{format_seconds(stream.seconds)} to {format_seconds(stream.slowest)})")


def _try(action) -> str:
    try:
        value = action()
    except Exception as err:  # noqa: BLE001 - the point is to show what each kind refuses
        return f"{type(err).__name__}"
    return f"{value:,}" if isinstance(value, int) else "works"


def _read_epoch(loader: DataLoader) -> tuple[list[int], float]:
    start, order = time.perf_counter(), []
    for batch in loader:
        order += batch["index"].tolist()
    return order, time.perf_counter() - start


def dataset_styles(digits: Digits, records_class: type[Dataset], stream_class: Stream, batch_size: int = 64, seed: int = 0,
                   epochs: int = 5) -> StylesReport:
    """The same digits as the lecture's map-style data set (``records_class(digits)``, shuffled by a sampler) and its
    stream (``stream_class(digits, seed=...)``, ordered by epoch), side by side.

    The two are read in turns, ``epochs`` epochs each; the fastest epoch of each is kept (a burst of load on a
    busy machine then cannot fall on one kind only), and the first two epochs' orders are compared.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: a batch holds at least one sample.")
    if not isinstance(epochs, int) or epochs < 2:
        raise ValueError(f"epochs={epochs!r}: need at least 2 epochs to compare their orders.")
    mapped, stream = records_class(digits), stream_class(digits, seed=seed)
    loaders = {"mapped": DataLoader(mapped, batch_size=batch_size, sampler=RandomSampler(mapped, generator=torch.Generator().manual_seed(seed))),
               "stream": DataLoader(stream, batch_size=batch_size)}
    orders: dict[str, list[list[int]]] = {name: [] for name in loaders}
    seconds: dict[str, list[float]] = {name: [] for name in loaders}
    for epoch in range(epochs):
        stream.set_epoch(epoch)
        for name, loader in loaders.items():
            order, took = _read_epoch(loader)
            orders[name].append(order)
            seconds[name].append(took)
    rows = []
    for name, label, data in (("mapped", f"map-style ({records_class.__name__} + RandomSampler)", mapped), ("stream", f"iterable ({stream_class.__name__}, set_epoch)", stream)):
        first, second = orders[name][:2]
        fastest = min(seconds[name])
        rows.append(StyleRow(label, _try(lambda: len(data)), _try(lambda: data[1234 % len(digits.labels)]),
                             _try(lambda: DataLoader(data, batch_size=batch_size, shuffle=True)),
                             len(first), len(set(first)), first != second, fastest, max(seconds[name]), len(first) / fastest))
    notes = [f"data: {digits.description}; epoch time: the fastest and slowest of {epochs}, the two kinds read in turns.",
             "A stream has no length and no index: the DataLoader cannot shuffle it (it raises), so the stream orders itself, by epoch."]
    return StylesReport(rows, notes)


# ---------------------------------------------------------------- counting reads across ranks and workers


@dataclass
class ShardingRow:
    sharding: str = column("split by")
    epoch: int = column("epoch")
    readers: int = column("readers")
    read: int = column("samples read", ",")
    distinct: int = column("distinct", ",")
    duplicates: int = column("read twice or more", ",")
    missing: int = column("never read", ",")
    per_reader: str = column("read per (rank, worker)")
    max_reads: int = 0


class ShardingReport(Report):
    """How often each sample was read per epoch, by sharding: measured on real ranks with real DataLoader workers."""

    title = "One epoch of a stream on ranks x DataLoader workers: who reads what"

    def __init__(self, rows: Sequence[ShardingRow], size: int, world_size: int, workers: int, orders_agree: bool,
                 epochs_differ: bool, ranks_disjoint: bool, data: str):
        self.size, self.world_size, self.workers = size, world_size, workers
        self.orders_agree, self.epochs_differ, self.ranks_disjoint = orders_agree, epochs_differ, ranks_disjoint
        notes = [f"data: {data}; {world_size} gloo ranks x {workers} DataLoader workers each = {world_size * workers} readers.",
                 f"sharded by ranks and workers: every rank computed the same epoch order: {orders_agree}; "
                 f"the epochs' orders differ: {epochs_differ}; no sample went to two ranks: {ranks_disjoint}."]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        names = list(SHARDINGS)
        first = {name: next(r for r in self.rows if r.sharding == name) for name in names}
        ax = plots.grouped_bars(names, {"samples read in epoch 0": [first[n].read for n in names],
                                        "distinct samples": [first[n].distinct for n in names]}, ax,
                                title=f"{self.world_size} ranks x {self.workers} DataLoader workers read one epoch",
                                xlabel="which readers split the stream", ylabel="samples")
        plots.horizontal_line(ax, self.size, f"data set: {self.size:,} samples")
        return ax

    def exactly_once(self, sharding: str = "ranks and workers") -> bool:
        """True when, in every epoch, each sample was read exactly once under ``sharding``."""
        rows = [r for r in self.rows if r.sharding == sharding]
        return bool(rows) and all(r.read == self.size and r.distinct == self.size and r.max_reads == 1 for r in rows)


def _order_digest(order: torch.Tensor) -> str:
    return hashlib.sha256(order.numpy().tobytes()).hexdigest()[:16]


@contextlib.contextmanager
def _may_start_children():
    """Let this process start DataLoader workers although ``launch`` made it a daemonic process.

    multiprocessing refuses children to a daemonic process, lest they be orphaned when it is stopped. DataLoader
    workers check on their parent and exit when it is gone, and the launched rank itself exits with its launcher.
    """
    config = mp.current_process()._config
    was = config.get("daemon", False)
    config["daemon"] = False
    try:
        yield
    finally:
        config["daemon"] = was


def _read_shardings(stream_class: Stream, digits: Digits, workers: int, batch_size: int, epochs: int, seed: int) -> dict:
    """On one rank: every sharding, every epoch, through a DataLoader with ``workers`` workers; what each worker read."""
    with _may_start_children():
        return _read_each_sharding(stream_class, digits, workers, batch_size, epochs, seed)


def _read_each_sharding(stream_class: Stream, digits: Digits, workers: int, batch_size: int, epochs: int, seed: int) -> dict:
    found: dict = {"rank": dist.get_rank(), "reads": {}, "orders": {}}
    for name, shard_by in SHARDINGS.items():
        stream = stream_class(digits, shard_by=shard_by, seed=seed)
        # Fresh workers, each with its own copy of the stream, every epoch. They are forked from this rank: a launched
        # rank is a fresh process that has touched no GPU, and a fork costs milliseconds where a forkserver child
        # costs seconds on a loaded machine.
        loader = DataLoader(stream, batch_size=batch_size, num_workers=workers, multiprocessing_context="fork" if workers else None)
        for epoch in range(epochs):
            stream.set_epoch(epoch)
            found["orders"][name, epoch] = _order_digest(stream.order())
            reads: list[tuple[int, int]] = []
            for batch in loader:
                reads += list(zip(batch["index"].tolist(), batch["worker"].tolist()))
            found["reads"][name, epoch] = reads
    return found


def sharding_check(digits: Digits, stream_class: Stream, world_size: int = 2, workers: int = 2, batch_size: int = 50, epochs: int = 2,
                   seed: int = 0, timeout: float = 120.0) -> ShardingReport:
    """Read ``epochs`` epochs of ``stream_class`` on ``world_size`` gloo ranks with ``workers`` DataLoader workers each.

    Every sharding in ``SHARDINGS`` is read; the report counts, per epoch, the samples read, how many were
    distinct, read more than once, or never read, and checks that the ranks agreed on each epoch's order.
    """
    if not isinstance(workers, int) or workers < 0:
        raise ValueError(f"workers={workers!r}: 0 (read in the rank's own process) or a positive number of DataLoader workers.")
    if not isinstance(epochs, int) or epochs < 2:
        raise ValueError(f"epochs={epochs!r}: need at least 2 epochs to compare their orders.")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size}: a batch holds at least one sample.")
    results = launch(_read_shardings, world_size, args=(stream_class, digits, workers, batch_size, epochs, seed), backend="gloo", timeout=timeout, echo=False)
    size, rows = len(digits.labels), []
    for name in SHARDINGS:
        for epoch in range(epochs):
            counts: Counter = Counter()
            per_reader = []
            for result in results:
                reads = result["reads"][name, epoch]
                counts.update(index for index, _ in reads)
                by_worker = Counter(worker for _, worker in reads)
                per_reader += [by_worker[w] for w in range(max(workers, 1))]
            read = sum(counts.values())
            rows.append(ShardingRow(name, epoch, world_size * max(workers, 1), read, len(counts),
                                    sum(1 for c in counts.values() if c > 1), size - len(counts),
                                    "/".join(f"{n:,}" for n in per_reader), max(counts.values(), default=0)))
    good = "ranks and workers"
    orders_agree = all(len({r["orders"][good, e] for r in results}) == 1 for e in range(epochs))
    epochs_differ = all(len({tuple(i for i, _ in r["reads"][good, e]) for e in range(epochs)}) == epochs for r in results)
    ranks_disjoint = all(
        not ({i for i, _ in a["reads"][good, e]} & {i for i, _ in b["reads"][good, e]})
        for e in range(epochs) for a in results for b in results if a["rank"] < b["rank"])
    return ShardingReport(rows, size, world_size, workers, orders_agree, epochs_differ, ranks_disjoint, digits.description)
