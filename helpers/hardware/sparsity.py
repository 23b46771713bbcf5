"""Do zeros make a matmul faster? Weights pruned to a density, multiplied by a dense kernel and by a sparse (CSR) one.

A dense kernel multiplies every stored number, zero or not, so pruning alone saves no time;
only a kernel (or hardware) built to skip zeros turns them into speed, and a sparse format
pays for its indices in bytes and in irregular memory access. ``sparse_matmul`` measures
both kernels at several densities on this device and says from the numbers where, if
anywhere, sparsity starts to pay.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from helpers.core.device import pick_device
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import time_interleaved

SAME_TIME = 1.15  # time ratios within this factor of 1 count as the same time


@dataclass
class SparseTiming:
    """One density: the stored bytes and the time of each kernel, against the dense kernel on dense weights."""

    density: float = column("non-zero share", ".0%")
    dense_bytes: int = column("dense storage", format_bytes)
    csr_bytes: int = column("CSR storage", format_bytes)
    dense_seconds: float = column("dense kernel", format_seconds)
    csr_seconds: float = column("CSR kernel", format_seconds)
    dense_vs_full: float = column("dense kernel vs full weights", ".2f")
    csr_vs_full: float = column("CSR kernel vs full weights", ".2f")


class SparseMatmul(Report):
    """Dense and CSR kernels on pruned weights; ``sentences()`` words what the numbers show."""

    def __init__(self, rows: list[SparseTiming], n: int, device: torch.device):
        self.n, self.device = n, device
        self.title = f"Pruned weights ({n} x {n}, fp32) times a {n} x {n} input on {device.type}: dense and CSR kernels"
        super().__init__(rows, ["Weights pruned at random (unstructured); times are the fastest block of interleaved rounds "
                                f"({'one CPU thread' if device.type == 'cpu' else 'the GPU'}); "
                                "'vs full weights' divides by the dense kernel's time on unpruned weights.",
                                *self.sentences(rows)])

    @staticmethod
    def sentences(rows: Sequence[SparseTiming]) -> list[str]:
        """What the timings show: whether zeros sped up the dense kernel, and from which density the CSR kernel wins."""
        pruned = [r for r in rows if r.density < 1]
        if not pruned:
            return []
        sparsest = min(pruned, key=lambda r: r.density)
        if sparsest.dense_vs_full >= 1 / SAME_TIME:
            dense = (f"The dense kernel took {sparsest.dense_vs_full:.2f}x its full-weights time even with {sparsest.density:.0%} "
                     "non-zeros: it multiplies every stored number, zero or not.")
        else:
            dense = (f"The dense kernel ran {1 / sparsest.dense_vs_full:.1f}x faster with {sparsest.density:.0%} non-zeros than "
                     "on the full weights. A dense kernel multiplies every stored number, so either this device's arithmetic "
                     "skips zeros or other work on the machine disturbed the timings: compare the rows, and rerun.")
        winners = [r for r in pruned if r.csr_vs_full < 1 / SAME_TIME]
        if winners:
            densest = max(winners, key=lambda r: r.density)
            csr = (f"The CSR kernel beat dense weights from {densest.density:.0%} non-zeros down ({1 / densest.csr_vs_full:.1f}x "
                   f"faster there), storing {densest.csr_bytes / densest.dense_bytes:.0%} of the dense bytes.")
        else:
            csr = ("The CSR kernel never beat the dense kernel here: its indices and irregular memory access cost more than "
                   "the skipped multiplications saved.")
        return [dense, csr]


def sparse_matmul(n: int = 512, densities: Sequence[float] = (1.0, 0.5, 0.1, 0.01), device: str | torch.device | None = None,
                  min_run_time: float = 0.1, rounds: int = 3, seed: int = 0) -> SparseMatmul:
    """Time W @ X with W (n x n) pruned to each density, by the dense kernel and by torch's CSR kernel, in interleaved rounds."""
    if n < 1 or any(not 0 < d <= 1 for d in densities) or 1.0 not in densities:
        raise ValueError(f"n must be positive and densities in (0, 1] including 1.0 (the baseline); got n={n}, densities={list(densities)}")
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    device = pick_device(device)
    generator = torch.Generator().manual_seed(seed)
    full = torch.randn(n, n, generator=generator)
    keep = torch.rand(n, n, generator=generator)
    x = torch.randn(n, n, generator=generator).to(device)
    weights = {d: (full * (keep < d)).to(device) for d in densities}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        sparse = {d: w.to_sparse_csr() for d, w in weights.items()}
    calls = {(d, kind): (lambda w=w: w @ x) if kind == "dense" else (lambda s=sparse[d]: torch.sparse.mm(s, x))
             for d, w in weights.items() for kind in ("dense", "csr")}
    turns = time_interleaved(calls, device, rounds, min_run_time=min_run_time, cpu_threads=1 if device.type == "cpu" else None)
    seconds = {key: t.fastest for key, t in turns.items()}
    base = seconds[(1.0, "dense")]
    rows = []
    for d in sorted(densities, reverse=True):
        s = sparse[d]
        csr_bytes = sum(t.numel() * t.element_size() for t in (s.values(), s.col_indices(), s.crow_indices()))
        rows.append(SparseTiming(d, n * n * full.element_size(), csr_bytes, seconds[(d, "dense")], seconds[(d, "csr")],
                                 seconds[(d, "dense")] / base, seconds[(d, "csr")] / base))
    return SparseMatmul(rows, n, device)
