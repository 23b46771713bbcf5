"""Serve the course's MNIST model over HTTP: ``python -m helpers.serving.server --port 8000`` (``make serve``).

Listens on 127.0.0.1 unless told otherwise, trains the model first if it is not cached, and stops
cleanly on Ctrl-C (SIGINT) or SIGTERM. ``--workers N`` runs N processes behind one port (uvicorn's
supervisor); their Prometheus metrics are added up on /metrics.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Mapping

import torch
import uvicorn

from helpers.core.paths import build_dir
from helpers.core.procs import LOOPBACK, ServedProcess, free_port

ENV_MODEL, ENV_THREADS, ENV_TORCH_THREADS = "EDL_SERVE_MODEL", "EDL_SERVE_THREADS", "EDL_SERVE_TORCH_THREADS"
ENV_GRPC, ENV_BATCH, ENV_WAIT = "EDL_SERVE_GRPC_PORT", "EDL_SERVE_BATCH_SIZE", "EDL_SERVE_MAX_WAIT_MS"


def app_from_env():
    """The app, configured from the environment: what each uvicorn worker process calls."""
    from helpers.serving.model import load_model
    from helpers.serving.service import create_app

    torch.set_num_threads(int(os.environ.get(ENV_TORCH_THREADS, "1")))
    metrics_body = None
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import CollectorRegistry, generate_latest, multiprocess

        def metrics_body() -> bytes:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
    return create_app(load_model(os.environ[ENV_MODEL]), threads=int(os.environ.get(ENV_THREADS, "1")),
                      metrics_body=metrics_body, grpc_port=int(os.environ.get(ENV_GRPC, "0")) or None,
                      batch_size=int(os.environ.get(ENV_BATCH, "0")), max_wait_ms=float(os.environ.get(ENV_WAIT, "2")))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m helpers.serving.server", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    parser.add_argument("--host", default=LOOPBACK, help="address to listen on (default 127.0.0.1: this machine only)")
    parser.add_argument("--workers", type=int, default=1, help="server processes behind the port (default 1)")
    parser.add_argument("--threads", type=int, default=1, help="model calls at once per process, each in a thread (default 1)")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads per process (default 1)")
    parser.add_argument("--grpc-port", type=int, default=0, help="also serve gRPC (digits.proto) on this port (default: no gRPC)")
    parser.add_argument("--batch-size", type=int, default=0, help="batch concurrent requests up to this many inputs (default 0: off)")
    parser.add_argument("--max-wait-ms", type=float, default=2.0, help="longest a request waits for a batch to fill (default 2 ms)")
    args = parser.parse_args(argv)
    if args.batch_size < 0 or args.max_wait_ms < 0:
        parser.error("--batch-size and --max-wait-ms cannot be negative")
    for name in ("workers", "threads", "torch_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 <= args.port <= 65535:
        parser.error(f"--port must be 0..65535, got {args.port}")
    return args


WORKER_PING_TIMEOUT_S = 120  # how long a worker may take to answer the supervisor, its start included


def main(argv: list[str] | None = None) -> None:
    from helpers.serving.model import mnist_model

    args = parse_args(argv)
    _, info = mnist_model()  # trains and caches it on first use
    port = args.port or free_port()
    os.environ.update({ENV_MODEL: info.path, ENV_THREADS: str(args.threads), ENV_TORCH_THREADS: str(args.torch_threads),
                       ENV_GRPC: str(args.grpc_port), ENV_BATCH: str(args.batch_size), ENV_WAIT: str(args.max_wait_ms)})
    if args.workers > 1:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="edl-metrics-", dir=build_dir("serving"))
    print(f"serving the MNIST model ({info.data} digits, held-out accuracy {info.holdout_accuracy:.1%}) on "
          f"http://{args.host}:{port} with {args.workers} worker(s) x {args.threads} thread(s)"
          + (f", gRPC on {args.host}:{args.grpc_port}" if args.grpc_port else "") + "; Ctrl-C stops it",
          flush=True)
    # uvicorn's supervisor kills a worker that does not answer its ping within timeout_worker_healthcheck (5 s by
    # default), and a worker answers only once it has imported this module, torch included: on a busy machine that
    # takes longer, and every worker was killed and started again, for ever. A hung worker is found a little later.
    uvicorn.run("helpers.serving.server:app_from_env", factory=True, host=args.host, port=port,
                workers=args.workers, log_level="warning", timeout_worker_healthcheck=WORKER_PING_TIMEOUT_S)
    print("server stopped", flush=True)


def start_service(port: int | None = None, workers: int = 1, threads: int = 1, torch_threads: int = 1,
                  grpc: bool = False, batch_size: int = 0, max_wait_ms: float = 2.0,
                  startup_timeout: float = 90.0) -> ServedProcess:
    """The service as a child process on 127.0.0.1 (a free port unless given), healthy when this returns.

    With ``grpc=True`` it also answers gRPC on another free port: ``service.grpc_address``; with
    ``batch_size`` > 0 it batches concurrent requests (waiting at most ``max_wait_ms``).
    Use it in a ``with`` block, or call ``.stop()``; it also stops when its owner (a notebook kernel,
    a test) exits, and its log is kept under build/serving/.
    """
    from helpers.serving.model import mnist_model

    mnist_model()  # train here, once, rather than racing in the child
    port = port or free_port()
    command = [sys.executable, "-m", "helpers.serving.server", "--port", str(port), "--workers", str(workers),
               "--threads", str(threads), "--torch-threads", str(torch_threads),
               "--batch-size", str(batch_size), "--max-wait-ms", str(max_wait_ms)]
    grpc_port = free_port() if grpc else 0
    if grpc_port:
        command += ["--grpc-port", str(grpc_port)]
    service = ServedProcess(command, port, health_path="/health", log_path=build_dir("serving") / f"server-{port}.log",
                            startup_timeout=startup_timeout)
    service.grpc_address = f"{LOOPBACK}:{grpc_port}" if grpc_port else None
    return service


def start_app(source: str | Path, app: str = "app", *, workers: int = 1, env: Mapping[str, str] | None = None,
              startup_timeout: float = 90.0) -> ServedProcess:
    """Serve the ASGI object ``app`` of the Python file ``source`` with uvicorn: a child process on 127.0.0.1, a free port.

    ``env`` is added to the child's environment (how a service file is configured); ``workers`` > 1 runs that many
    processes behind the port. Healthy (GET /health answered 200) when this returns; stops as ``start_service``'s does.
    """
    source = Path(source).resolve()
    if source.suffix != ".py" or not source.is_file():
        raise FileNotFoundError(f"no Python file at {source}: write the service there first (e.g. with %%writefile)")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    port = free_port()
    command = [sys.executable, "-m", "uvicorn", f"{source.stem}:{app}", "--app-dir", str(source.parent),
               "--host", LOOPBACK, "--port", str(port), "--workers", str(workers), "--log-level", "warning"]
    return ServedProcess(command, port, health_path="/health", env=dict(env or {}), startup_timeout=startup_timeout,
                         log_path=build_dir("serving") / f"{source.stem}-{port}.log")


if __name__ == "__main__":
    main()
