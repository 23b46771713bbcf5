"""Lecture 5's figures: AMP memory by category, padding vs bucketing, storage formats, eager vs compiled."""
from __future__ import annotations

import random
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from helpers.core.device import gpu_available, pick_device
from helpers.training.amp import amp_comparison, compute_bound_width
from helpers.training.compiling import eager_vs_compiled
from helpers.training.data_pipelines import padding_strategies, padding_workload, storage_formats, synthetic_images
from helpers.training.sequences import pad_to, synthetic_sequences
from helpers.training.workloads import tiny_mlp

from . import BenchResult, Target, full_runs_only


def _timing_target(what: str, measured: float | None, minimum: float, quick: bool) -> Target:
    """A speed-up target; a quick run's problems are too small to time fairly (``full_runs_only``)."""
    return full_runs_only([Target.at_least(what, measured, minimum, "x")], quick)[0]


def _collate(samples):
    sequences, labels = zip(*samples)
    return pad_to(sequences, max(len(t) for t in sequences)), torch.stack(labels)


def _padding_loaders(data, batch_size: int) -> dict[str, DataLoader]:
    """The whole data set padded against batches of similar lengths (sorted, cut, shuffled), each padded to its longest."""
    by_length = sorted(range(len(data)), key=lambda i: len(data.tokens[i]))
    batches = [by_length[i:i + batch_size] for i in range(0, len(data), batch_size)]
    random.Random(0).shuffle(batches)
    return {"pad the whole data set": DataLoader(TensorDataset(*_collate([data[i] for i in range(len(data))])), batch_size=batch_size, shuffle=True),
            "bucket by length, pad each batch": DataLoader(data, batch_sampler=batches, collate_fn=_collate)}


def run(quick: bool) -> BenchResult:
    width, batch = (128, 1024) if quick else (256, 4096)  # narrow, deep, a large batch: activations dominate
    torch.manual_seed(0)
    mlp = nn.Sequential(*[layer for _ in range(4) for layer in (nn.Linear(width, width), nn.GELU())], nn.Linear(width, 10))
    amp = amp_comparison(mlp, torch.randn(batch, width), min_run_time=0.05 if quick else 0.5)
    count, padding_batch = (128, 32) if quick else padding_workload(pick_device(None))
    sequences = synthetic_sequences(count, max_length=64 if quick else 256)
    padding = padding_strategies(_padding_loaders(sequences, padding_batch), sequences.vocab, rounds=1 if quick else 2)
    with tempfile.TemporaryDirectory() as folder:
        storage = storage_formats(synthetic_images(16 if quick else 256, 64 if quick else 256), folder, min_run_time=0.02 if quick else 0.3)
    compiled = None if quick else eager_vs_compiled(tiny_mlp(), torch.randn(32, 32), program="narrow MLP (launch bound)", threads=1)

    whole, bucketed = padding.rows[0], padding.rows[-1]
    targets = [
        Target.at_least("bytes per parameter, fp32 + Adam", amp.fp32.memory.bytes_per_parameter, 15.9),
        Target.at_most("bytes per parameter, fp32 + Adam", amp.fp32.memory.bytes_per_parameter, 16.1),
        Target.at_least("bytes per parameter, AMP + Adam", amp.amp.memory.bytes_per_parameter, 15.9),
        Target.at_most("bytes per parameter, AMP + Adam", amp.amp.memory.bytes_per_parameter, 16.1),
        Target.at_most("AMP activations / fp32 activations", amp.amp.memory.activation_bytes / amp.fp32.memory.activation_bytes, 0.8),
        Target.at_most("padding share with length bucketing", bucketed.padding_share, 0.25),
        _timing_target("epoch speed-up, bucketing vs whole-data-set padding", bucketed.epoch_seconds and whole.epoch_seconds / bucketed.epoch_seconds, 2.0, quick),
        _timing_target("images/s, packed array vs PNG files", storage.find(format="packed array (mmap)").images_per_second / storage.find(format="PNG files").images_per_second, 3.0, quick),
    ]
    if compiled is None or compiled.fallback_reason:
        why = "quick run: no compilation" if compiled is None else "torch.compile could not run"
        targets.append(Target.not_here("torch.compile speed-up, narrow MLP", ">= 1.5x", why))
    else:
        targets.append(_timing_target("torch.compile speed-up, narrow MLP", compiled.compiled.speedup, 1.5, quick))
    speed = None
    if gpu_available() and not quick:  # the narrow MLP above is launch bound on a GPU: speed is checked on wide layers
        wide = compute_bound_width("cuda", batch)
        torch.manual_seed(0)
        speed = amp_comparison(nn.Sequential(nn.Linear(wide, wide), nn.GELU(), nn.Linear(wide, wide), nn.GELU(), nn.Linear(wide, 10)),
                               torch.randn(batch, wide), min_run_time=0.5)
        speed.title = f"AMP step speed on compute-bound layers (width {wide:,}, batch {batch:,}, from the GPU's peak)"
        targets.append(Target.at_least("AMP training-step speed-up on the GPU, compute-bound layers", speed.amp.speedup, 2.0, "x"))
    else:
        targets.append(Target.not_here("AMP training-step speed-up on the GPU, compute-bound layers", ">= 2x",
                                       "no GPU here" if not gpu_available() else "quick run"))
    reports = [amp, padding, storage] + ([compiled] if compiled else []) + ([speed] if speed else [])
    return BenchResult("efficient_training", reports, targets)
