"""Variable-length token sequences, and how much of a padded batch is padding.

Text and audio come as sequences of very different lengths: most are short, a few
are long. A batch is a rectangle, so shorter sequences are padded to the longest one,
and every padded position is computed on and thrown away. ``padding_share`` measures
that waste for any batching (whole data set padded to its longest sequence, random
batches padded each to their own longest, batches of similar lengths).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import torch

PAD = 0  # the padding token; real tokens are 1..vocab-1


@dataclass
class SequenceData:
    """A map-style data set of (tokens, label): ``tokens`` are 1-D int64 tensors of varying length."""

    tokens: list[torch.Tensor]
    labels: torch.Tensor
    vocab: int

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[index], self.labels[index]

    @property
    def lengths(self) -> torch.Tensor:
        return torch.tensor([len(t) for t in self.tokens])


def synthetic_sequences(n: int = 2048, vocab: int = 1000, median_length: int = 30, spread: float = 0.7, max_length: int = 400, seed: int = 0) -> SequenceData:
    """``n`` random token sequences with log-normal lengths (a long tail up to ``max_length``) and a learnable label.

    The label says whether a sequence holds more tokens from the lower half of the
    vocabulary than from the upper half, so a model must read every token.
    """
    generator = torch.Generator().manual_seed(seed)
    log_lengths = torch.randn(n, generator=generator) * spread + torch.log(torch.tensor(float(median_length)))
    lengths = log_lengths.exp().round().clamp(4, max_length).long()
    tokens = [torch.randint(1, vocab, (int(length),), generator=generator) for length in lengths]
    labels = torch.tensor([int((t < vocab // 2).sum() * 2 > len(t)) for t in tokens])
    return SequenceData(tokens, labels, vocab)


def pad_to(sequences: Sequence[torch.Tensor], length: int) -> torch.Tensor:
    """Stack 1-D sequences into a [len(sequences), length] tensor, filled with PAD after each sequence's end."""
    out = torch.full((len(sequences), length), PAD, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        out[row, : len(sequence)] = sequence
    return out


def padding_share(lengths: torch.Tensor | Sequence[int], batches: Iterable[Sequence[int]], padded_length: int | None = None) -> float:
    """Fraction of all batch positions that are padding, for ``batches`` of indices into ``lengths``.

    Each batch is padded to its own longest sequence, or to ``padded_length`` when
    given (the whole data set padded to one length).
    """
    lengths = torch.as_tensor(lengths)
    real = positions = 0
    for batch in batches:
        batch_lengths = lengths[torch.as_tensor(list(batch), dtype=torch.long)]
        real += int(batch_lengths.sum())
        positions += len(batch_lengths) * (padded_length or int(batch_lengths.max()))
    if positions == 0:
        raise ValueError("padding_share needs at least one non-empty batch")
    return 1 - real / positions
