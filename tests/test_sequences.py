"""helpers.training.sequences: synthetic variable-length data and the padding share of a batching."""
from __future__ import annotations

import pytest
import torch

from helpers.training.sequences import PAD, pad_to, padding_share, synthetic_sequences


def test_synthetic_sequences_have_a_long_tail_and_are_reproducible():
    data = synthetic_sequences(n=1000, vocab=50, median_length=20, max_length=300, seed=3)
    lengths = data.lengths
    assert len(data) == 1000 and lengths.min() >= 4 and lengths.max() <= 300
    assert lengths.float().mean() > lengths.float().median() and lengths.max() >= 4 * lengths.median()
    assert all(((t >= 1) & (t < 50)).all() for t in data.tokens), "tokens are 1..vocab-1; 0 is padding"
    assert set(data.labels.tolist()) == {0, 1}
    again = synthetic_sequences(n=1000, vocab=50, median_length=20, max_length=300, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(data.tokens, again.tokens))
    tokens, label = data[0]
    assert torch.equal(tokens, data.tokens[0]) and label == data.labels[0]


def test_pad_to_fills_after_each_end():
    out = pad_to([torch.tensor([5, 6]), torch.tensor([7])], 3)
    assert out.tolist() == [[5, 6, PAD], [7, PAD, PAD]]


def test_padding_share_counts_padded_positions():
    lengths = [1, 3, 2, 2]
    assert padding_share(lengths, [[0, 1]]) == pytest.approx(1 - 4 / 6)
    assert padding_share(lengths, [[0, 1], [2, 3]]) == pytest.approx(1 - 8 / 10)
    assert padding_share(lengths, [[0, 1, 2, 3]], padded_length=4) == pytest.approx(1 - 8 / 16)
    with pytest.raises(ValueError):
        padding_share(lengths, [])
