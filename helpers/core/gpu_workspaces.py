"""Memory the caching allocator holds on a GPU that no tensor accounts for: cuBLAS workspaces, one per thread.

PyTorch gives every (thread, stream) that runs a cuBLAS call its own handle and workspace, allocated
through the caching allocator: in a training step that is the main thread (forward) and the autograd
engine's device thread (backward). Their size comes from torch's own configuration, read here the way
torch reads it (aten/src/ATen/cuda/CublasHandlePool.cpp):

* cuBLAS: ``CUBLAS_WORKSPACE_CONFIG`` as ``:SIZE_KIB:COUNT`` pairs, summed; by default 32 MiB on
  compute capability 9.0 and newer (Hopper), else 4096 KiB x 2 + 16 KiB x 8;
* cuBLASLt: ``CUBLASLT_WORKSPACE_SIZE`` in KiB (default 1024). With ``TORCH_CUBLASLT_UNIFIED_WORKSPACE``
  on (the default of open-source CUDA builds) it reuses the cuBLAS allocation and adds nothing.

On a GPU the live values come from ``torch.backends.cuda.cublas_workspace_size()`` and
``cublaslt_workspace_size()``; the derivation below is their fallback and what the CPU tests check.
cuDNN workspaces (convolutions) are chosen per call and are reported as a bound, not added.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

KIB, MIB = 1024, 1024 * 1024
PAIR = re.compile(r":(\d+):(\d+)")


def cublas_workspace_bytes(capability: tuple[int, int], env: Mapping[str, str] | None = None) -> int:
    """One cuBLAS handle's workspace, from CUBLAS_WORKSPACE_CONFIG or torch's default for ``capability``."""
    env = os.environ if env is None else env
    config = env.get("CUBLAS_WORKSPACE_CONFIG", "")
    pairs = PAIR.findall(config)
    if pairs and "".join(f":{s}:{c}" for s, c in pairs) == config.strip():
        return sum(int(size) * KIB * int(count) for size, count in pairs)
    return 32 * MIB if capability[0] >= 9 else 4096 * KIB * 2 + 16 * KIB * 8


def cublaslt_extra_bytes(cublas_bytes: int, env: Mapping[str, str] | None = None) -> int:
    """What one cuBLASLt workspace adds beyond the cuBLAS one (nothing when the workspace is unified)."""
    env = os.environ if env is None else env
    if env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1").strip().lower() not in ("0", "false", "no", "off"):
        return 0
    kib = env.get("CUBLASLT_WORKSPACE_SIZE") or env.get("TORCH_CUBLASLT_WORKSPACE_SIZE") or "1024"
    try:
        return int(kib) * KIB
    except ValueError:
        return 1024 * KIB


@dataclass(frozen=True)
class BlasWorkspaces:
    """The cuBLAS (+ cuBLASLt) workspaces one training step makes the allocator hold on one GPU."""

    per_thread: int
    threads: int
    source: str

    @property
    def total(self) -> int:
        return self.per_thread * self.threads

    def label(self) -> str:
        return f"cuBLAS workspaces ({self.threads} thread{'s' if self.threads > 1 else ''})"


def blas_workspaces(capability: tuple[int, int], training: bool = True, env: Mapping[str, str] | None = None,
                    live: tuple[int, int] | None = None) -> BlasWorkspaces:
    """Workspaces for a step: forward on the main thread, backward on the autograd device thread when ``training``.

    ``live`` = (cuBLAS bytes, cuBLASLt bytes) read from torch on a GPU; otherwise derived from ``env``.
    """
    if live is not None:
        cublas, lt = live
        unified = (os.environ if env is None else env).get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "1").strip() not in ("0",)
        per_thread, source = cublas + (0 if unified else lt), "torch.backends.cuda.cublas_workspace_size()"
    else:
        cublas = cublas_workspace_bytes(capability, env)
        per_thread, source = cublas + cublaslt_extra_bytes(cublas, env), "derived from CUBLAS_WORKSPACE_CONFIG and torch's defaults"
    return BlasWorkspaces(per_thread, 2 if training else 1, source)


def live_workspaces(device, training: bool = True) -> BlasWorkspaces:
    """The workspaces on a real CUDA ``device``, from torch's own accessors when it has them."""
    import torch

    capability = torch.cuda.get_device_capability(device)
    try:
        live = (torch.backends.cuda.cublas_workspace_size(), torch.backends.cuda.cublaslt_workspace_size())
    except (AttributeError, RuntimeError):
        live = None
    return blas_workspaces(capability, training, live=live)
