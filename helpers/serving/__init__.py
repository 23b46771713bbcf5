"""Lectures 6-8 and Assignment 3: serving the course's model, loading it, measuring where requests' time goes.

Public face of ``helpers.serving``; names load on first use.
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".model": ["ModelInfo", "ServedMLP", "flat_pixels", "load_model", "mnist_holdout", "mnist_model", "train_mnist_model"],
    ".service": ["MAX_BATCH", "create_app", "server_timing", "timing_entries"],
    ".server": ["start_app", "start_service"],
    ".experiments": ["batching_tradeoff", "compare_servers", "kit_vs_ray_serve"],
    ".ray_service": ["start_ray_service"],
    ".batching": ["DynamicBatcher"],
    ".export": ["file_sizes_and_accuracy", "parity"],
    ".runtimes": ["runtime_latency"],
    ".compression": ["compression_table", "latency_against"],
    ".smollm": ["ChatTokenizer", "LlamaConfig", "ModelFileError", "cached_weights", "load_tokenizer"],
    ".llama": ["Batch", "Llama", "load_llm"],
    ".llm_engine": ["AsyncEngine", "BlockPool", "Engine", "Request", "ngram_draft", "use_definitions"],
    ".llm_server": ["CompletionsSender", "create_llm_app", "start_llm_service"],
    ".open_loop": ["HttpSender", "OpenLoopReport", "closed_loop_test", "open_loop_test", "poisson_schedule"],
    ".load": ["LoadReport", "RequestBreakdown", "load_test", "read_metrics", "request_breakdown"],
    ".dockerfile": ["check_dockerfile", "packages_weight", "start_image_command"],
    ".grpc_service": ["grpc_predict", "stubs"],
})
