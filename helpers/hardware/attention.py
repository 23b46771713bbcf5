"""Lecture 8c's apparatus: attention functions written in the notebook, checked against SDPA and measured.

The notebook writes attention plainly and in tiles (FlashAttention's online softmax); this module only
checks what they compute against ``F.scaled_dot_product_attention`` and measures them as the sequence grows:
seconds per call (interleaved rounds, the fastest and the median) and the allocator's peak during one call
(torch.profiler's memory events on a CPU, ``max_memory_allocated`` on a GPU), which is where the n x n scores
show.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import torch
import torch.nn.functional as F

from helpers.core import plots
from helpers.core.device import pick_device
from helpers.core.memory import peak_bytes
from helpers.core.report import Report, column, format_bytes, format_seconds
from helpers.core.timing import time_interleaved

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (q, k, v) -> output, each (heads, n, d)


def random_qkv(n: int, heads: int = 1, head_dim: int = 64, *, seed: int = 0, device: str | torch.device = "cpu",
               dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random queries, keys and values, each (heads, n, head_dim), the same for a given seed."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(heads, n, head_dim, generator=generator).to(device=device, dtype=dtype) for _ in range(3))


def max_error(attention: Attention, n: int, heads: int = 2, head_dim: int = 64, *, causal: bool = False, seed: int = 0,
              device: str | torch.device = "cpu") -> float:
    """Largest |difference| between ``attention(q, k, v)`` and SDPA's answer on random inputs of length ``n``."""
    q, k, v = random_qkv(n, heads, head_dim, seed=seed, device=device)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    got = attention(q, k, v)
    if got.shape != expected.shape:
        raise ValueError(f"the attention returned shape {tuple(got.shape)}; SDPA's is {tuple(expected.shape)} (heads, n, head_dim)")
    return (got.float() - expected.float()).abs().max().item()


@dataclass(frozen=True)
class AttentionRow:
    method: str = column("attention")
    n: int = column("n", ",")
    seconds: float = column("time (fastest)", format_seconds)
    median: float = column("time (median)", format_seconds)
    peak_bytes: int = column("peak memory", format_bytes)
    scores_bytes: int = column("scores (heads x n x n)", format_bytes)


class AttentionSweep(Report):
    """Seconds and peak bytes of each attention function at each sequence length."""

    title = "Attention as the sequence grows: time per call and the allocator's peak during one call"

    def get(self, method: str, n: int) -> AttentionRow:
        return self.find(method=method, n=n)

    @property
    def methods(self) -> list[str]:
        return list(dict.fromkeys(r.method for r in self.rows))

    def plot(self):
        _, (left, right) = plots.plt.subplots(1, 2, figsize=(11, 4))
        for ax, field, unit, what in ((left, "peak_bytes", "bytes", "peak memory of one call"), (right, "seconds", "seconds", "time per call (fastest)")):
            series = {m: ([r.n for r in self.rows if r.method == m], [getattr(r, field) for r in self.rows if r.method == m]) for m in self.methods}
            plots.line_chart(series, ax, title=what, xlabel="sequence length n", logx=True, logy=True, yunit=unit)
        return left

    def records(self) -> list[dict]:
        return [{"method": r.method, "n": r.n, "seconds": r.seconds, "peak_bytes": r.peak_bytes, "scores_bytes": r.scores_bytes} for r in self.rows]


def attention_sweep(functions: Mapping[str, Attention], lengths: Sequence[int], heads: int = 1, head_dim: int = 64, *,
                    rounds: int = 3, device: str | torch.device | None = None, dtype: torch.dtype = torch.float32) -> AttentionSweep:
    """Time each function (``rounds`` interleaved rounds) and take its allocator peak at every length in ``lengths``.

    The inputs (heads, n, head_dim) of ``dtype`` are allocated before the peak is taken, so it counts what one
    call adds: its scores, its temporaries and its output.
    """
    if not functions or not lengths:
        raise ValueError("attention_sweep needs at least one function and one sequence length")
    device = pick_device(device)
    rows = []
    for n in lengths:
        q, k, v = random_qkv(n, heads, head_dim, device=device, dtype=dtype)
        turns = time_interleaved({name: (lambda fn=fn: fn(q, k, v)) for name, fn in functions.items()}, device=device, rounds=rounds)
        for name, fn in functions.items():
            peak, _ = peak_bytes(lambda fn=fn: fn(q, k, v), device)
            rows.append(AttentionRow(name, n, turns[name].fastest, turns[name].median, peak, heads * n * n * q.element_size()))
    notes = [f"{heads} head(s) of dimension {head_dim}, {str(dtype).removeprefix('torch.')}, on {device}; peak memory: "
             + ("torch.cuda.max_memory_allocated during one call" if device.type == "cuda" else "torch.profiler's CPU allocator events during one call")]
    return AttentionSweep(rows, notes)
