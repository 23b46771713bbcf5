"""The Efficient Deep Learning Systems teaching kit: the helpers every lecture notebook calls.

Lecture-facing names come straight from the package (``from helpers import profile_ops,
timeit``); each course block's own names come from its subpackage (``helpers.hardware``,
``helpers.distributed``, ``helpers.training``, ``helpers.serving``, ``helpers.mlops``). Everything loads on first use, so
``import helpers`` is cheap.
"""
import logging

from helpers.core.lazy import lazy_exports

# torch warns on every import of its C++-extension module when no CUDA runtime is
# installed; on a GPU-less laptop that is noise, not news.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "helpers.core": ["BasicFCModel", "LeNet", "alexnet_2012", "models", "describe", "gpu_available", "launch", "match_threads_to_load",
                     "peak_flops", "pick_device", "synchronize", "timeit", "make_MNIST_loader",
                     "make_encoded_MNIST", "train", "train_on_devices", "bytes_per_param",
                     "measure_training_memory", "profile_layer_mem", "profile_mem", "training_memory"],
    "helpers.hardware": ["batch_throughput", "benchmark_mistakes", "caching_allocator_demo",
                         "copy_compute_overlap", "cudnn_benchmark_demo", "matmul_gflops", "matmul_sweep",
                         "tensor_core_shapes", "time_matmul", "transfer_sweep", "profile_ops", "fit_batch",
                         "profile_layer_alexnet", "alexnet_explorer", "starvation_sweep", "compare_dataflows",
                         "systolic_matmul", "estimate_training_for", "operator_roofline", "dtype_speed"],
    "helpers.training": ["autocast_ops", "loss_scaling", "number_formats",
                         "tensor_core_alignment", "amp_comparison", "step_memory",
                         "padding_strategies", "storage_formats", "synthetic_images",
                         "synthetic_sequences", "cprofile", "py_spy", "op_table",
                         "diagnose", "profile_patterns", "eager_vs_compiled"],
    "helpers.distributed": ["accumulation_memory", "checkpointing_memory", "precision_memory", "offload_memory",
                            "zero_check", "zero_memory", "pipeline_experiment", "pipeline_schedule",
                            "tensor_parallel_check", "alexnet_model_parallel"],
    "helpers.mlops": ["detect_drift"],
})
