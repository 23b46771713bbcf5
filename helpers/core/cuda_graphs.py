"""CUDA graphs: record a function's GPU kernels once, replay them with one launch (Lectures 1b and 5b use it).

The argument checks run without a GPU, so they are tested on any machine; capture itself needs one.
"""
from __future__ import annotations

import time
from typing import Callable

import torch


class CapturedGraph:
    """A CUDA graph of ``fn`` with its static input and output buffers. Calling it copies the new input into the
    static input, replays the graph (one launch for all its kernels) and returns the static output, which the
    next call overwrites: clone it to keep it."""

    def __init__(self, graph, static_input: torch.Tensor, static_output, capture_seconds: float):
        self.graph, self.static_input, self.static_output = graph, static_input, static_output
        self.capture_seconds = capture_seconds

    def __call__(self, x: torch.Tensor):
        self.static_input.copy_(x)
        self.graph.replay()
        return self.static_output

    def replay(self) -> None:
        """One launch of every captured kernel, on the static input as it is."""
        self.graph.replay()


def check_capture_arguments(fn: Callable, example: torch.Tensor, warmup: int) -> None:
    """The argument checks of ``capture_cuda_graph``, which run (and are tested) without a GPU."""
    if not callable(fn):
        raise TypeError(f"capture_cuda_graph: fn must be callable (a function or module), got {type(fn).__name__}.")
    if not isinstance(example, torch.Tensor):
        raise TypeError(f"capture_cuda_graph: example must be a torch.Tensor (the input whose shape the graph "
                        f"keeps), got {type(example).__name__}.")
    if not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"capture_cuda_graph: warmup={warmup!r}; give at least 1 warm-up call (3 is usual) so that "
                         f"lazy initialisation (cuBLAS handles, allocator pools) happens before capture.")
    if example.device.type != "cuda":
        raise ValueError(f"capture_cuda_graph: the example tensor is on {example.device}, but CUDA graphs record "
                         f"GPU kernels only. Move it with .to('cuda') on a machine with a GPU; on a CPU, "
                         f"torch.compile (default mode) is the way to cut per-op overhead.")


def capture_cuda_graph(fn: Callable, example: torch.Tensor, warmup: int = 3) -> CapturedGraph:
    """Capture ``fn(static_input)`` as a CUDA graph: warm-up calls on a side stream, then one captured call.

    The warm-up runs on a side stream (as PyTorch's documentation prescribes)
    so that one-off work is done before capture and the capture stream starts
    clean. The graph replays with the same memory addresses, hence the static
    input buffer: new data is copied into it, never passed as a new tensor.
    """
    check_capture_arguments(fn, example, warmup)
    start = time.perf_counter()
    static_input = example.clone()
    side = torch.cuda.Stream(device=example.device)
    side.wait_stream(torch.cuda.current_stream(example.device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(static_input)
    torch.cuda.current_stream(example.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_output = fn(static_input)
    torch.cuda.synchronize(example.device)
    return CapturedGraph(graph, static_input, static_output, time.perf_counter() - start)
