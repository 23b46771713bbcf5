"""Datasheet peaks of common GPUs, for "% of peak" figures.

Dense (no structured sparsity) tensor-core throughput in TFLOP/s and memory
bandwidth in GB/s, from the vendors' datasheets. A GPU not listed here gets no
peak (shown as n/a); add a row to support it.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPUSpec:
    """Peak figures of one GPU model; ``tflops`` maps a dtype name to dense TFLOP/s."""

    name: str
    match: tuple[str, ...]  # every substring must occur in torch.cuda.get_device_name()
    tflops: dict[str, float]
    bandwidth_gbs: float
    memory_gb: float


# Order matters: the first row whose substrings all match wins (e.g. "H200 NVL" before "H200").
GPU_SPECS: tuple[GPUSpec, ...] = (
    GPUSpec("H200 NVL", ("H200", "NVL"), {"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1671}, 4800, 141),
    GPUSpec("H200 SXM", ("H200",), {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}, 4800, 141),
    GPUSpec("H100 NVL", ("H100", "NVL"), {"fp32": 60, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1671}, 3900, 94),
    GPUSpec("H100 PCIe", ("H100", "PCIe"), {"fp32": 51, "tf32": 378, "bf16": 756, "fp16": 756, "fp8": 1513}, 2000, 80),
    GPUSpec("H100 SXM", ("H100",), {"fp32": 67, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}, 3350, 80),
    GPUSpec("A100 SXM 80GB", ("A100", "SXM", "80GB"), {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 2039, 80),
    GPUSpec("A100 PCIe 80GB", ("A100", "80GB"), {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 1935, 80),
    GPUSpec("A100 40GB", ("A100",), {"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312}, 1555, 40),
    GPUSpec("L40S", ("L40S",), {"fp32": 91.6, "tf32": 183, "bf16": 362, "fp16": 362, "fp8": 733}, 864, 48),
    GPUSpec("L40", ("L40",), {"fp32": 90.5, "tf32": 90.5, "bf16": 181, "fp16": 181, "fp8": 362}, 864, 48),
    GPUSpec("L4", ("NVIDIA L4",), {"fp32": 30.3, "tf32": 60, "bf16": 121, "fp16": 121, "fp8": 242.5}, 300, 24),
    GPUSpec("V100 SXM2", ("V100", "SXM2"), {"fp32": 15.7, "fp16": 125}, 900, 16),
    GPUSpec("V100 PCIe", ("V100",), {"fp32": 14, "fp16": 112}, 900, 16),
    GPUSpec("T4", ("Tesla T4",), {"fp32": 8.1, "fp16": 65}, 320, 16),
    GPUSpec("RTX 4090", ("RTX 4090",), {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2}, 1008, 24),
    GPUSpec("RTX 3090", ("RTX 3090",), {"fp32": 35.6, "tf32": 35.6, "bf16": 71, "fp16": 71}, 936, 24),
)

# The card AlexNet was trained on (Krizhevsky et al., 2012): two of them, 3 GB each.
GTX_580_3GB = GPUSpec("GTX 580 (3 GB)", ("GTX 580",), {"fp32": 1.581}, 192.4, 3)


def lookup_gpu(device_name: str) -> GPUSpec | None:
    """The spec whose substrings all occur in ``device_name`` (case-insensitive), or None."""
    name = device_name.lower()
    for spec in GPU_SPECS:
        if all(part.lower() in name for part in spec.match):
            return spec
    return None
