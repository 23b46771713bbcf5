"""Lecture 5: number formats and mixed precision, data pipelines, profiling, compilation, fused kernels.

Public face of ``helpers.training``; names load on first use.
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".precision": ["TENSOR_CORE_MULTIPLES", "almost_fitted_regression", "autocast_ops", "loss_scaling",
                   "number_formats", "scale_history", "tensor_core_alignment"],
    ".amp": ["amp_comparison", "compute_bound_width", "step_memory"],
    ".data_pipelines": ["padding_strategies", "padding_workload", "storage_formats",
                        "synthetic_images"],
    ".sequences": ["PAD", "SequenceData", "pad_to", "padding_share", "synthetic_sequences"],
    ".profiling": ["cprofile", "op_table", "py_spy"],
    ".patterns": ["diagnose", "metrics_from_profiler", "profile_patterns"],
    ".compiling": ["eager_vs_compiled"],
    ".fusion": ["GeneratedCode", "count_launches", "eager_kernels", "inductor_code"],
    ".workloads": ["make_compute_bound", "make_input_pipeline", "make_sync_bound", "tiny_mlp"],
    ".syncs": ["count_host_syncs"],
    ".launch_overhead": ["measure_launch_overhead"],
    ".kernel_table": ["classify_kernel", "cnn_training_step", "kernels_by_class"],
})
