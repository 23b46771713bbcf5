"""Two matrix-product kernels written in Triton, a naive one and a tiled one, and the launches that run them.

Their source is Lecture 1b's cells (``03-gpu-programming-model.ipynb``), where they are
written and run; this module is the same code for ``make bench B=kernels`` and the tests,
and ``tests/test_hardware_lecture_code.py`` checks that the two are identical.

Triton programs are written per *program instance* (a CUDA thread block): the launch
grid says how many instances run, ``tl.program_id`` says which one this is, and
each instance works on whole blocks of values at once (Triton spreads a block over
the threads of its warps). Both kernels compute C = A @ B with A (M x K), B (K x N).

* ``naive_matmul_kernel``: one instance per output element C[row, col]. It walks
  row ``row`` of A and column ``col`` of B straight from global memory (HBM, cached
  by L2 at best); nothing it loads is shared with any other instance, so every
  element of A is fetched N times and every element of B M times.
* ``tiled_matmul_kernel``: one instance per BLOCK_M x BLOCK_N tile of C. It loads a
  BLOCK_M x BLOCK_K block of A and a BLOCK_K x BLOCK_N block of B, multiplies them
  with ``tl.dot`` (the compiler stages the blocks in shared memory and feeds the
  tensor cores or FMA units from registers) and moves along K. Each loaded value
  is reused BLOCK_N (or BLOCK_M) times, which is the whole point.

``triton.jit`` compiles them for the GPU, or, when TRITON_INTERPRET=1 was set before
triton was imported, runs them in Triton's interpreter on CPU tensors (numpy, slow: for
checking, never for timing; ``python -m helpers.hardware.triton_kernels`` does that in a
fresh process). This module needs ``triton`` and is imported only where it can be.
"""
import argparse
import json
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def naive_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                        BLOCK_K: tl.constexpr):
    row = tl.program_id(0)  # this instance computes C[row, col] and nothing else
    col = tl.program_id(1)
    partial = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        inside = ks < K  # the last step may run past K: masked lanes read 0
        a = tl.load(a_ptr + row * stride_am + ks * stride_ak, mask=inside, other=0.0)  # part of row `row` of A
        b = tl.load(b_ptr + ks * stride_bk + col * stride_bn, mask=inside, other=0.0)  # part of column `col` of B
        partial += a.to(tl.float32) * b.to(tl.float32)
    tl.store(c_ptr + row * stride_cm + col * stride_cn, tl.sum(partial, axis=0).to(c_ptr.dtype.element_ty))


@triton.jit
def tiled_matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PRECISION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # this instance's tile of C
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # the tile's running sum, kept in registers
    for k_start in range(0, K, BLOCK_K):
        ks = k_start + tl.arange(0, BLOCK_K)
        a_block = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak,
                          mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)  # BLOCK_M x BLOCK_K of A
        b_block = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
                          mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)  # BLOCK_K x BLOCK_N of B
        acc = tl.dot(a_block, b_block, acc, input_precision=PRECISION)  # every loaded value is used many times
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def naive_matmul(a, b):
    """C = A @ B by the naive kernel: a grid of M x N programs, one per element of C."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    naive_matmul_kernel[(m, n)](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(), BLOCK_K=32, num_warps=1)
    return c


def tiled_matmul(a, b, BLOCK_M=64, BLOCK_N=64, BLOCK_K=32):
    """C = A @ B by the tiled kernel: one program per BLOCK_M x BLOCK_N tile of C."""
    (m, k), n = a.shape, b.shape[1]
    c = torch.empty(m, n, dtype=a.dtype, device=a.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))  # tiles at the edges run past C: the masks cover them
    precision = "ieee" if a.dtype == torch.float32 else None  # fp32 as torch computes it by default: no TF32 rounding
    tiled_matmul_kernel[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                              BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PRECISION=precision)
    return c


def main(argv: list[str] | None = None) -> None:
    """Run both kernels on random inputs of the given shape (on CPU tensors under TRITON_INTERPRET=1); print max errors as JSON."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--m", type=int, default=37)
    parser.add_argument("--n", type=int, default=29)
    parser.add_argument("--k", type=int, default=45)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(args.m, args.k, generator=generator).to(args.device)
    b = torch.randn(args.k, args.n, generator=generator).to(args.device)
    expected = a @ b
    errors = {}
    from helpers.hardware.kernels import kernel_matmul  # the public entry: its checks run too

    for kernel in ("naive", "tiled"):
        blocks = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16} if kernel == "tiled" else None  # small tiles: several, ragged edges
        errors[kernel] = (kernel_matmul(a, b, f"triton {kernel}", blocks=blocks) - expected).abs().max().item()
    json.dump({"shape": [args.m, args.n, args.k], "max_error": errors}, sys.stdout)


if __name__ == "__main__":
    main()
