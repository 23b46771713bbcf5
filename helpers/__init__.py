"""The Efficient Deep Learning Systems teaching kit: the helpers every lecture notebook calls.

Import what a notebook needs straight from the package, e.g.
``from helpers import describe, timeit, matmul_sweep``.
"""
import logging

# torch warns on every import of its C++-extension module when no CUDA runtime is
# installed; on a GPU-less laptop that is noise, not news.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

from .bench import (  # noqa: E402
    batch_throughput,
    benchmark_mistakes,
    caching_allocator_demo,
    copy_compute_overlap,
    cudnn_benchmark_demo,
    matmul_gflops,
    matmul_sweep,
    tensor_core_shapes,
    time_matmul,
    timeit,
    transfer_sweep,
)
from . import models  # noqa: E402
from .device import describe, gpu_available, peak_flops, pick_device, synchronize  # noqa: E402
from .launch import launch  # noqa: E402
from .models import BasicFCModel, LeNet, alexnet_2012  # noqa: E402
from .flops import profile_ops  # noqa: E402
from .memory import (  # noqa: E402
    bytes_per_param,
    measure_training_memory,
    profile_layer_mem,
    profile_mem,
    training_memory,
)
from .oom import fit_batch  # noqa: E402
from .alexnet import profile_layer_alexnet  # noqa: E402
from .widgets import alexnet_explorer  # noqa: E402
from .data import make_encoded_MNIST, make_MNIST_loader  # noqa: E402
from .starvation import starvation_sweep  # noqa: E402
from .systolic import compare_dataflows, systolic_matmul  # noqa: E402
from .train import train, train_on_devices  # noqa: E402
from .workingset import estimate_training_for  # noqa: E402
from .precision import autocast_ops, dynamic_loss_scaling, loss_scaling, number_formats, tensor_core_alignment  # noqa: E402
from .amp import amp_comparison, step_memory  # noqa: E402
from .pipelines import BucketBatchSampler, pad_batch, padding_strategies, storage_formats, synthetic_images  # noqa: E402
from .sequences import synthetic_sequences  # noqa: E402
from .profiling import anomaly_demo, cprofile, py_spy, torch_profile  # noqa: E402
from .patterns import diagnose, profile_patterns  # noqa: E402
from .compiling import eager_vs_compiled  # noqa: E402
from .memsave import accumulation_memory, checkpointing_memory, precision_memory  # noqa: E402
from .offload import offload_memory  # noqa: E402
from .zero import zero_check, zero_memory  # noqa: E402
from .pipeline_parallel import pipeline_experiment, pipeline_schedule  # noqa: E402
from .tensor_parallel import tensor_parallel_check  # noqa: E402
from .alexnet_parallel import alexnet_model_parallel  # noqa: E402

__all__ = [
    "batch_throughput",
    "BasicFCModel",
    "LeNet",
    "alexnet_2012",
    "models",
    "benchmark_mistakes",
    "caching_allocator_demo",
    "copy_compute_overlap",
    "cudnn_benchmark_demo",
    "describe",
    "gpu_available",
    "launch",
    "matmul_gflops",
    "matmul_sweep",
    "peak_flops",
    "pick_device",
    "synchronize",
    "tensor_core_shapes",
    "time_matmul",
    "timeit",
    "transfer_sweep",
    "profile_ops",
    "profile_layer_mem",
    "profile_mem",
    "training_memory",
    "measure_training_memory",
    "bytes_per_param",
    "fit_batch",
    "profile_layer_alexnet",
    "alexnet_explorer",
    "compare_dataflows",
    "estimate_training_for",
    "make_encoded_MNIST",
    "make_MNIST_loader",
    "starvation_sweep",
    "systolic_matmul",
    "train",
    "train_on_devices",
    # Lecture 5: mixed precision, data pipelines, profiling, compilation
    "BucketBatchSampler",
    "amp_comparison",
    "anomaly_demo",
    "autocast_ops",
    "cprofile",
    "diagnose",
    "dynamic_loss_scaling",
    "eager_vs_compiled",
    "loss_scaling",
    "number_formats",
    "pad_batch",
    "padding_strategies",
    "profile_patterns",
    "py_spy",
    "synthetic_sequences",
    "step_memory",
    "storage_formats",
    "synthetic_images",
    "tensor_core_alignment",
    "torch_profile",
    "accumulation_memory",
    "checkpointing_memory",
    "precision_memory",
    "offload_memory",
    "zero_check",
    "zero_memory",
    "pipeline_experiment",
    "pipeline_schedule",
    "tensor_parallel_check",
    "alexnet_model_parallel",
]
