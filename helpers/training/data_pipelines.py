"""Data pipelines, measured: storage formats and decoding cost of images, and padding a whole data set vs per batch vs
length bucketing for sequences.

The images are generated (smooth colour fields plus sensor-like noise, so PNG and JPEG compress them as they
would photos); the sequences are random tokens with log-normal lengths, as sentence lengths are.
"""
from __future__ import annotations

import io
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from helpers.core import plots
from helpers.core.device import is_gpu, pick_device, synchronize
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import timeit
from helpers.training.sequences import PAD

# ---------------------------------------------------------------- images: storage formats and decoding


def synthetic_images(n: int, size: int = 256, seed: int = 0) -> np.ndarray:
    """``n`` photo-like RGB images, uint8, n x size x size x 3: smooth colour waves plus noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    images = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        freq = rng.uniform(1, 6, (3, 2))
        phase = rng.uniform(0, 2 * math.pi, 3)
        waves = np.stack([np.sin(2 * math.pi * (freq[c, 0] * x + freq[c, 1] * y) + phase[c]) for c in range(3)], -1)
        images[i] = np.clip(127.5 + 80 * waves + rng.normal(0, 12, (size, size, 3)), 0, 255)
    return images


@dataclass
class StorageFormat:
    """How one way of storing a data set reads back: ``read_seconds`` to get the bytes, ``decode_seconds`` to get pixels."""

    format: str = column("stored as")
    files: int = column("files")
    disk_bytes: int = column("on disk", format_bytes)
    read_seconds: float = column("read", format_seconds)
    decode_seconds: float = column("decode", format_seconds)
    total_seconds: float = column("total", format_seconds, init=False)
    images_per_second: float | None = column("images/s", ",.0f", default=None)  # set by StorageFormats, which knows the count

    def __post_init__(self):
        self.total_seconds = self.read_seconds + self.decode_seconds


class StorageFormats(Report):
    """One epoch over the same images stored four ways: reading the bytes, then decoding them."""

    title = "Reading one epoch of images: storage format and decoding"
    def __init__(self, rows, images: int, directory: Path):
        for row in rows:
            row.images_per_second = images / row.total_seconds
        fastest = min(rows, key=lambda r: r.total_seconds)
        notes = [f"{images} images; files written under {directory}. They were just written, so they come from the OS page "
                 f"cache: this measures per-file overhead and decoding, not the disk (on network storage per-file costs grow).",
                 f"fastest: {fastest.format}"]
        super().__init__(rows, notes)
        self.images, self.directory = images, directory

    def plot(self, ax=None):
        names = [r.format for r in self.rows]
        parts = {"read": [r.read_seconds * 1e3 for r in self.rows], "decode": [r.decode_seconds * 1e3 for r in self.rows]}
        return plots.stacked_bars(names, parts, ax, title="One epoch of images", ylabel="milliseconds")


def _write_image_files(images: np.ndarray, directory: Path, fmt: str, **options) -> list[Path]:
    paths = []
    for i, image in enumerate(images):
        path = directory / f"{i:06d}.{fmt.lower()}"
        Image.fromarray(image).save(path, fmt, **options)
        paths.append(path)
    return paths


def _read_all(paths: Sequence[Path]) -> list[bytes]:
    return [p.read_bytes() for p in paths]


def _decode_images(blobs: Sequence[bytes]) -> list[np.ndarray]:
    return [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs]


def _decode_npy(blobs: Sequence[bytes]) -> list[np.ndarray]:
    return [np.load(io.BytesIO(b)) for b in blobs]


def storage_formats(images: np.ndarray, directory: str | Path, jpeg_quality: int = 90, min_run_time: float = 0.3) -> StorageFormats:
    """Write ``images`` as PNG files, JPEG files, one .npy file each, and one packed .npy array; time one epoch of each.

    Each epoch reads every image once in a shuffled order, as a training loader
    does. Reading and decoding are timed separately; the packed array is opened
    memory-mapped, so reading an image is a slice and there is nothing to decode.
    """
    directory = Path(directory)
    order = np.random.default_rng(0).permutation(len(images))
    rows = []
    for fmt, options in (("PNG", {}), ("JPEG", {"quality": jpeg_quality})):
        folder = directory / fmt.lower()
        folder.mkdir(parents=True, exist_ok=True)
        paths = _write_image_files(images, folder, fmt, **options)
        shuffled = [paths[i] for i in order]
        blobs = _read_all(shuffled)
        rows.append(StorageFormat(f"{fmt} files", len(paths), sum(len(b) for b in blobs),
                                  timeit(_read_all, shuffled, min_run_time=min_run_time).median,
                                  timeit(_decode_images, blobs, min_run_time=min_run_time).median))
    folder = directory / "npy"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, image in enumerate(images):
        paths.append(folder / f"{i:06d}.npy")
        np.save(paths[-1], image)
    shuffled = [paths[i] for i in order]
    blobs = _read_all(shuffled)
    rows.append(StorageFormat("npy per image", len(paths), sum(len(b) for b in blobs),
                              timeit(_read_all, shuffled, min_run_time=min_run_time).median,
                              timeit(_decode_npy, blobs, min_run_time=min_run_time).median))
    packed = directory / "packed.npy"
    np.save(packed, images)
    array = np.load(packed, mmap_mode="r")
    rows.append(StorageFormat("packed array (mmap)", 1, packed.stat().st_size,
                              timeit(lambda: [np.array(array[i]) for i in order], min_run_time=min_run_time).median, 0.0))
    return StorageFormats(rows, len(images), directory)


# ---------------------------------------------------------------- sequences: padding and length bucketing
# The data (synthetic_sequences), PAD, pad_to and padding_share live in helpers.training.sequences, shared with Assignment 2.
# The collate function and the length-bucketing sampler are Lecture 5a's, written in its cells: padding_strategies
# measures whatever loaders it is given.


class SequenceClassifier(nn.Module):
    """Embedding, one Transformer encoder layer (padding masked out), mean over real tokens, linear head."""

    def __init__(self, vocab: int = 1000, dim: int = 64, heads: int = 4, classes: int = 2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=PAD)
        self.encoder = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        padding = tokens == PAD
        hidden = self.encoder(self.embed(tokens), src_key_padding_mask=padding)
        keep = (~padding).unsqueeze(-1).to(hidden.dtype)
        return self.head((hidden * keep).sum(1) / keep.sum(1).clamp(min=1))


def padding_workload(device: torch.device) -> tuple[int, int]:
    """(sequences, batch size) for the padding demo on ``device``. A CPU: 384 in batches of 32. A GPU: 2,048 in batches
    of 256, so that a step's time is set by the positions it computes rather than by its kernel launches (at 32 a step
    took the same time whatever its padding, measured on an H100)."""
    return (2048, 256) if is_gpu(device) else (384, 32)


def classifier_for(device: torch.device, vocab: int) -> SequenceClassifier:
    """The padding demo's model, sized for the device: 64 wide on a CPU; 512 wide on a GPU, where a 64-wide layer's step
    is bound by kernel launches and padded positions would cost no time."""
    return SequenceClassifier(vocab, dim=512, heads=8) if is_gpu(device) else SequenceClassifier(vocab)


@dataclass
class PaddingRun:
    strategy: str = column("strategy")
    batches: int = column("batches")
    tokens: int = column("positions computed", ",d")
    padding_share: float = column("padding", ".1%")
    epoch_seconds: float = column("epoch time", format_seconds)
    speedup: float = column("speed-up", ".2f", default=1.0)


class PaddingStrategies(Report):
    """One training epoch of a small sequence model under three padding strategies."""

    title = "Padding: whole data set vs per batch vs length buckets"

    def __init__(self, rows, real_tokens: int, notes: Sequence[str] = ()):
        for row in rows:
            row.speedup = rows[0].epoch_seconds / row.epoch_seconds
        super().__init__(rows, [f"{real_tokens:,} real tokens per epoch", *notes])
        self.real_tokens = real_tokens

    def bucketing_sentence(self) -> str:
        """What the last strategy (bucketing) saved against the first (the whole data set padded), worded from the measured speed-up."""
        whole, bucketed = self.rows[0], self.rows[-1]
        head = f"{bucketed.strategy.capitalize()} computes {bucketed.tokens / whole.tokens:.0%} of the positions that '{whole.strategy}' does"
        if bucketed.speedup >= 1.15:
            return f"{head} and runs the epoch {bucketed.speedup:.2f}x as fast."
        timing = (f"at the same speed ({bucketed.speedup:.2f}x)" if bucketed.speedup > 0.87
                  else f"{1 / bucketed.speedup:.1f}x slower ({bucketed.speedup:.2f}x)")
        return (f"{head}, yet runs the epoch {timing}: each step of this small model is bound by per-step overhead "
                "(kernel launches, Python), not by the positions it computes (Lecture 5b), so the saving does not show "
                "in time here; it does once a step is compute bound (a larger model, or longer sequences).")

    def plot(self, ax=None):
        names = [f"{r.strategy}\n({r.padding_share:.0%} padding)" for r in self.rows]
        return plots.horizontal_bars(names, [r.epoch_seconds for r in self.rows], ax, title="Epoch time by padding strategy", xlabel="seconds per epoch")


def _train_epoch(model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader, device: torch.device) -> tuple[int, int, int, float]:
    """One epoch; returns (batches, positions computed, padding positions, seconds)."""
    batches = positions = padding = 0
    synchronize(device)
    start = time.perf_counter()
    for tokens, labels in loader:
        batches += 1
        positions += tokens.numel()
        padding += int((tokens == PAD).sum())  # counted on the host copy: no device sync inside the timed loop
        tokens, labels = tokens.to(device), labels.to(device)
        optimizer.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(tokens), labels).backward()
        optimizer.step()
    synchronize(device)
    return batches, positions, padding, time.perf_counter() - start


def padding_strategies(
    loaders: dict[str, Iterable],
    vocab: int,
    device: str | torch.device | None = None,
    model_factory: Callable[[], nn.Module] | None = None,
    rounds: int = 2,
    seed: int = 0,
) -> PaddingStrategies:
    """Train a fresh (identically initialised) sequence model on each of ``loaders``; measure padding and epoch time.

    ``loaders`` maps a strategy's name to a loader of (tokens padded with PAD, labels)
    batches: the first is the baseline the speed-ups are measured against. The
    strategies take turns for ``rounds`` epochs each and the fastest epoch counts,
    so a burst of load from other programs does not decide the ranking. The model
    masks padding out of its result, so all strategies compute the same function:
    they differ only in how many padded positions they pay for. The model is ``model_factory()``, by default
    ``classifier_for(device, vocab)``.
    """
    if not loaders:
        raise ValueError("padding_strategies: give at least one loader, {name: DataLoader of (tokens, labels)}")
    device = pick_device(device)
    factory = model_factory or (lambda: classifier_for(device, vocab))
    runs = {}
    for strategy, loader in loaders.items():
        torch.manual_seed(seed)
        model = factory().to(device)
        warm = next(iter(loader))[0][:2].to(device)  # first call: allocation and library set-up, not counted
        model(warm).sum().backward()
        model.zero_grad(set_to_none=True)
        runs[strategy] = (model, torch.optim.Adam(model.parameters(), lr=1e-3), loader)
    best: dict[str, PaddingRun] = {}
    for _ in range(rounds):
        for strategy, (model, optimizer, loader) in runs.items():
            batches, positions, padding, seconds = _train_epoch(model, optimizer, loader, device)
            if strategy not in best or seconds < best[strategy].epoch_seconds:
                best[strategy] = PaddingRun(strategy, batches, positions, padding / positions, seconds)
    real = next(iter(best.values()))
    real_tokens = real.tokens - round(real.padding_share * real.tokens)
    notes = [f"device {device}; fastest of {rounds} epochs per strategy"]
    return PaddingStrategies(list(best.values()), real_tokens, notes)
