"""Lecture 1, the hardware-ecosystem lecture and 8c: benchmarks, rooflines, op counts, working sets, AlexNet, systolic
arrays, attention's time and memory.

Public face of ``helpers.hardware``; names load on first use.
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".matmuls": ["MatmulSweep", "matmul_gflops", "matmul_point", "matmul_sweep", "tensor_core_shapes", "time_matmul"],
    ".mistakes": ["benchmark_mistakes"],
    ".allocator": ["caching_allocator_demo"],
    ".transfers": ["copy_compute_overlap", "transfer_sweep"],
    ".autotune": ["cudnn_benchmark_demo"],
    ".batches": ["batch_throughput"],
    ".flops": ["flop_counter", "profile_ops"],
    ".roofline": ["Workload", "attention_workload", "conv_workload", "default_workloads", "elementwise_workload",
                  "matmul_workload", "measure_bandwidth", "measure_roofline", "operator_roofline", "ridge_point", "roof"],
    ".native_dtypes": ["dtype_speed"],
    ".oom": ["fit_batch"],
    ".alexnet": ["profile_layer_alexnet"],
    ".attention": ["AttentionSweep", "attention_sweep", "max_error", "random_qkv"],
    ".widgets": ["alexnet_explorer"],
    ".starvation": ["starvation_sweep"],
    ".systolic": ["compare_dataflows", "systolic_matmul"],
    ".sparsity": ["sparse_matmul"],
    ".workingset": ["cpu_caches", "estimate_training_for", "memory_levels"],
    ".hierarchy": ["memory_spaces"],
    ".kernels": ["NOTICEABLE", "gpu_kernel_timings", "kernel_matmul", "launch_plan", "matmul_kernels", "triton_check", "triton_for"],
})
