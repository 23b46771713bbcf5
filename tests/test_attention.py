"""Lecture 8c's apparatus: the SDPA check tells a wrong attention from a right one, and the peak sees the n x n scores."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from helpers.core.memory import peak_bytes
from helpers.hardware import attention_sweep, max_error


def _plain(q, k, v, scale=True):
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.shape[-1]) if scale else 1.0)  # (heads, n, n)
    return torch.softmax(scores, -1) @ v


def test_the_check_against_sdpa_passes_attention_and_fails_a_forgotten_scale():
    assert max_error(_plain, 70) < 1e-5
    assert max_error(lambda q, k, v: _plain(q, k, v, scale=False), 70) > 1e-2  # softmax without 1/sqrt(d) is other attention
    with pytest.raises(ValueError, match=r"shape \(2, 70\).*\(heads, n, head_dim\)"):
        max_error(lambda q, k, v: _plain(q, k, v).sum(-1), 70)


def test_the_peak_counts_what_a_call_allocates_and_not_what_was_live_before():
    held = torch.ones(2**20)  # 4 MiB live before: not counted
    peak, result = peak_bytes(lambda: torch.ones(2**20) + held)
    assert 4 * 2**20 <= peak < 9 * 2**20 and result.shape == held.shape, peak  # the new tensor (and ones' temporary)
    assert peak_bytes(lambda: held.sum())[0] < 2**12


def test_the_sweep_sees_the_scores_of_plain_attention_and_not_of_sdpa():
    sweep = attention_sweep({"plain": _plain, "SDPA": lambda q, k, v: F.scaled_dot_product_attention(q, k, v)}, [256, 512], rounds=1)
    assert [(r.method, r.n) for r in sweep.rows] == [("plain", 256), ("SDPA", 256), ("plain", 512), ("SDPA", 512)]
    for n in (256, 512):
        plain, sdpa = sweep.get("plain", n), sweep.get("SDPA", n)
        assert plain.scores_bytes == n * n * 4 and plain.peak_bytes >= plain.scores_bytes > sdpa.peak_bytes, (plain, sdpa)
        assert 0 < plain.seconds <= plain.median
    with pytest.raises(ValueError, match="at least one function"):
        attention_sweep({}, [256])
