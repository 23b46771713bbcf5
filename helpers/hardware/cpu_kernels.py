"""Three matrix-product loops compiled to machine code with numba, plus a cache-level read probe.

The three loops are written and run in Lecture 1b's cells (``03-gpu-programming-model.ipynb``); this module holds
the same text for ``make bench B=kernels`` and the tests, and ``tests/test_hardware_lecture_code.py`` keeps the two
identical.

The CPU analogue of the GPU's naive and tiled kernels. All compute C = A @ B on
float32 arrays (A is M x K, B is K x N, row-major) on one core:

* ``naive_ijk``: the textbook triple loop. The innermost loop walks *down a column*
  of B, one element per cache line, and chains every add to the previous one.
* ``reordered_ikj``: the same arithmetic with the two inner loops swapped: the
  innermost loop walks *along rows* of B and C, contiguous in memory, so the
  compiler turns it into SIMD instructions. But each row of C streams all of B.
* ``blocked_ikj``: the reordered loop over a panel of ``panel_rows`` rows of B at a
  time, sized to stay in the L2 cache while every row of A uses it: B is read from
  far memory once per panel instead of once per row of C.

Compiled code is cached under build/numba, so a second run loads it in milliseconds.
"""
from __future__ import annotations

import os

from helpers.core.paths import build_dir

os.environ.setdefault("NUMBA_CACHE_DIR", str(build_dir("numba")))  # read when numba is imported, just below

import numba  # noqa: E402
import numpy as np  # noqa: E402


@numba.njit(cache=True)
def naive_ijk(a, b, c):
    m, k_dim = a.shape
    n = b.shape[1]
    for i in range(m):
        for j in range(n):
            total = np.float32(0.0)
            for k in range(k_dim):
                total += a[i, k] * b[k, j]  # b[k, j] for k = 0, 1, ...: a stride of n floats
            c[i, j] = total


@numba.njit(cache=True)
def reordered_ikj(a, b, c):
    m, k_dim = a.shape
    n = b.shape[1]
    c[:, :] = 0
    for i in range(m):
        for k in range(k_dim):
            a_ik = a[i, k]
            for j in range(n):
                c[i, j] += a_ik * b[k, j]  # rows of B and C, contiguous: SIMD


@numba.njit(cache=True)
def blocked_ikj(a, b, c, panel_rows):
    m, k_dim = a.shape
    n = b.shape[1]
    c[:, :] = 0
    for k_start in range(0, k_dim, panel_rows):  # one panel of B: rows k_start .. k_end - 1
        k_end = min(k_start + panel_rows, k_dim)
        for i in range(m):  # every row of A and C uses the panel while it is still in cache
            for k in range(k_start, k_end):
                a_ik = a[i, k]
                for j in range(n):
                    c[i, j] += a_ik * b[k, j]


@numba.njit(cache=True, fastmath=True)
def read_sum(x, repeats):
    """Sum ``x`` ``repeats`` times: reads len(x) * repeats floats (fastmath lets the sum use SIMD lanes)."""
    total = np.float32(0.0)
    for _ in range(repeats):
        for i in range(x.shape[0]):
            total += x[i]
    return total
