"""The digit service over gRPC: the contract in digits.proto, answered from the same model as HTTP.

The Python stubs are generated from digits.proto with grpcio-tools on first use, into build/ (they are
build artefacts, never committed). Bad input is answered with INVALID_ARGUMENT and a message, as HTTP
answers 422.
"""
from __future__ import annotations

import importlib
import sys
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Callable

import grpc
import torch

from helpers.core.load import keep_torch_threads
from helpers.core.paths import build_dir
from helpers.serving.model import INPUTS

PROTO = Path(__file__).with_name("digits.proto")


def stubs() -> tuple[ModuleType, ModuleType]:
    """(digits_pb2, digits_pb2_grpc), generated from digits.proto when missing or older than it."""
    out = build_dir("serving", "grpc")
    generated = out / "digits_pb2_grpc.py"
    if not generated.exists() or generated.stat().st_mtime < PROTO.stat().st_mtime:
        from grpc_tools import protoc

        code = protoc.main(["grpc_tools.protoc", f"-I{PROTO.parent}", f"--python_out={out}",
                            f"--grpc_python_out={out}", str(PROTO)])
        if code != 0:
            raise RuntimeError(f"grpc_tools.protoc could not compile {PROTO} (exit code {code})")
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))  # the generated code imports digits_pb2 as a top-level module
    return importlib.import_module("digits_pb2"), importlib.import_module("digits_pb2_grpc")


def check_images(images, max_batch: int) -> str | None:
    """Why a request's images are unusable, or None."""
    if not 1 <= len(images) <= max_batch:
        return f"send 1 to {max_batch} images, got {len(images)}"
    for i, image in enumerate(images):
        if len(image.pixels) != INPUTS:
            return f"inputs[{i}] has {len(image.pixels)} pixels; each image needs {INPUTS} values in 0..1"
    return None


def serve_grpc(predict: Callable[[torch.Tensor], list[int]], port: int, host: str = "127.0.0.1",
               max_batch: int = 1024, threads: int = 4) -> grpc.Server:
    """Start a gRPC server on ``host:port`` answering with ``predict`` (pixels (N, 784) -> digits); return it running."""
    pb2, pb2_grpc = stubs()

    class DigitClassifier(pb2_grpc.DigitClassifierServicer):
        def Predict(self, request, context):
            problem = check_images(request.inputs, max_batch)
            if problem:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            pixels = torch.tensor([list(image.pixels) for image in request.inputs], dtype=torch.float32)
            if not bool(((pixels >= 0) & (pixels <= 1)).all()):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "pixel values must lie in 0..1 (and not be NaN)")
            return pb2.PredictReply(predictions=predict(pixels))

    # each handler thread takes the process's torch thread count (set_num_threads holds only in the thread that calls it)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads, initializer=keep_torch_threads))
    pb2_grpc.add_DigitClassifierServicer_to_server(DigitClassifier(), server)
    if server.add_insecure_port(f"{host}:{port}") == 0:
        raise OSError(f"gRPC could not listen on {host}:{port}: is the port taken?")
    server.start()
    return server


def grpc_predict(address: str, pixels: torch.Tensor, timeout: float = 30.0) -> list[int]:
    """Ask the gRPC service at ``address`` (host:port) for the digits in ``pixels`` (N, 784)."""
    pb2, pb2_grpc = stubs()
    request = pb2.PredictRequest(inputs=[pb2.Image(pixels=row) for row in pixels.tolist()])
    with grpc.insecure_channel(address) as channel:
        return list(pb2_grpc.DigitClassifierStub(channel).Predict(request, timeout=timeout).predictions)
