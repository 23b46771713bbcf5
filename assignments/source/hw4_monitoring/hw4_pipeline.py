"""Assignment 4's small training pipeline: the code your tests in part 1 must check. Do not edit it.

Four functions a real pipeline would have: scale pixels, split a data set, batch it, score predictions.
"""
from __future__ import annotations

import torch


def scale_pixels(images: torch.Tensor) -> torch.Tensor:
    """uint8 images (N, 28, 28) -> float pixels (N, 784) in 0..1."""
    if images.dtype != torch.uint8:
        raise TypeError(f"scale_pixels takes uint8 images, got {images.dtype}")
    return images.reshape(len(images), -1).float() / 255.0


def split_indices(n: int, test_share: float, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A random split of range(n) into (train, test) index tensors, disjoint, covering everything; test has round(n * share).

    Deterministic: the same (n, test_share, seed) always gives the same split, in any process.
    """
    if not 0 < test_share < 1:
        raise ValueError(f"test_share must lie in (0, 1), got {test_share}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    test = round(n * test_share)
    return order[test:], order[:test]


def batches(pixels: torch.Tensor, labels: torch.Tensor, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Consecutive (pixels, labels) batches of ``size``; the last one may be smaller; nothing dropped or repeated."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    return [(pixels[i:i + size], labels[i:i + size]) for i in range(0, len(labels), size)]


def accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """Share of rows whose largest logit is at the label."""
    if len(logits) != len(labels):
        raise ValueError(f"{len(logits)} rows of logits for {len(labels)} labels")
    return (logits.argmax(1) == labels).float().mean().item()
