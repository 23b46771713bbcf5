"""The core every course block builds on: reports, devices, timing, fake tensors, training steps, processes.

Public face of ``helpers.core``; names load on first use (see ``helpers.core.lazy``).
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".report": ["Report", "column", "format_bytes", "format_seconds", "startswith"],
    ".device": ["cpu_clock_ghz", "cpu_flags", "cpu_threads", "cpu_fp32_flops_per_cycle", "describe", "gpu_available", "peak_flops", "pick_device",
                "synchronize"],
    ".timing": ["Measurement", "range_verdict", "time_interleaved", "time_once", "timeit"],
    ".load": ["LOAD_NOTE", "OtherLoad", "in_fresh_thread", "keep_torch_threads", "match_threads_to_load", "take_load_note"],
    ".workers": ["WorkerError", "WorkerTimeout", "launch"],
    ".models": ["BasicFCModel", "LeNet", "alexnet_2012", "count_parameters", "transformer_lm"],
    ".data": ["load_digits", "make_MNIST_loader", "make_encoded_MNIST"],
    ".training_loop": ["train", "train_on_devices"],
    ".step": ["forward_backward", "resolve_amp", "training_step"],
    ".memory": ["allocation_timeline", "bytes_kept", "bytes_per_param", "measure_training_memory", "peak_bytes", "profile_layer_mem", "profile_mem",
                "training_memory"],
    ".paths": ["build_dir"],
    ".procs": ["LOOPBACK", "available_cores", "free_port"],
    ".torch_adapters.dispatch": ["TorchDispatchMode"],
    ".torch_adapters.op_overrides": ["kernels_replaced"],
    "helpers.core": ["models", "plots"],
})
