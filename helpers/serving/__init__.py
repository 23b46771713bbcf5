"""Lectures 6-8 and Assignment 3: serving the course's model, loading it, measuring where requests' time goes.

Public face of ``helpers.serving``; names load on first use.
"""
from helpers.core.lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    ".model": ["ModelInfo", "ServedMLP", "flat_pixels", "load_model", "mnist_holdout", "mnist_model"],
    ".service": ["MAX_BATCH", "create_app", "server_timing"],
    ".server": ["start_service"],
    ".experiments": ["compare_servers", "http_vs_grpc"],
    ".load": ["LoadReport", "RequestBreakdown", "load_test", "read_metrics", "request_breakdown"],
    ".dockerfile": ["check_dockerfile"],
    ".grpc_service": ["grpc_predict"],
})
