"""The same model behind Ray Serve with ``@serve.batch``: ``python -m helpers.serving.ray_service --port P``.

Ray Serve is what a team reaches for when one process is not enough: replicas across processes and
machines, and the same dynamic batching as ``helpers/serving/batching.py``. Here it runs on this machine
only (a local Ray instance on 127.0.0.1), as a child process that the kit stops with its whole tree, so
that the kit's batcher can be measured against it under the same load.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

from helpers.core.procs import LOOPBACK, free_port, stop_tree

# Ray on Linux replaces a loopback node address by the machine's reachable one (and its servers then listen there);
# with clusters off it keeps 127.0.0.1, and so does every server it starts (GCS, raylet, agents, workers).
SINGLE_MACHINE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def own_auth_token() -> dict[str, str]:
    """Token authentication with a token of this service's own, in its environment (Ray's processes inherit it).

    Ray 2.60 turns token authentication on for every new local cluster and, unless told a token, writes one to
    ``~/.ray/auth_token``: a file outside the project that every run on the machine then shares and that outlives
    them all. An explicit ``RAY_AUTH_MODE`` (token or disabled) is left as it is."""
    if "RAY_AUTH_MODE" in os.environ:
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}


def replicas_on_loopback() -> None:
    """Ray's worker setup hook: a Serve replica's inter-deployment gRPC server on 127.0.0.1, not on every interface.

    Ray Serve (2.60) binds that server to ``[::]:0`` with no setting to change it; this narrows the address it
    is given. The lecture 7 notebook test checks that every process of the service listens on the loopback only."""
    from ray.serve._private import replica

    bind = replica.add_port_to_grpc_server
    replica.add_port_to_grpc_server = lambda server, address: bind(server, address.replace("[::]", LOOPBACK))


def build_app(model_path: str, max_batch_size: int, max_wait_ms: float):
    """A Serve application answering POST /predict ({"inputs": [[784 floats]]}) with batched model calls."""
    from ray import serve
    from starlette.responses import JSONResponse

    @serve.deployment(max_ongoing_requests=256)
    class DigitClassifier:
        def __init__(self):
            from helpers.serving.model import load_model

            torch.set_num_threads(1)
            self.model = load_model(model_path)

        @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=max_wait_ms / 1000)
        async def predict(self, requests: list[torch.Tensor]) -> list[list[int]]:
            with torch.inference_mode():
                digits = self.model(torch.cat(requests)).argmax(1).tolist()
            answers, start = [], 0
            for pixels in requests:
                answers.append(digits[start:start + len(pixels)])
                start += len(pixels)
            return answers

        async def __call__(self, request):
            body = await request.json()
            digits = await self.predict(torch.tensor(body["inputs"], dtype=torch.float32))
            return JSONResponse({"predictions": digits})

    return DigitClassifier.bind()


AGENT_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port", "runtime_env_agent_port")


def agents_on_ports_chosen_here() -> None:
    """Ray's agents (metrics, dashboard, runtime env) get free ports chosen before the raylet starts, and the raylet is
    told all of them.

    Left to choose their own (``ray.init``'s default), each agent writes its port to a file, and Ray 2.60's raylet
    waits a fixed 15 s for each file, then aborts ("Timed out waiting for file .../metrics_agent_port_..." in
    raylet.out): on a busy 2-core machine the agents' Python start-up takes longer. Given the ports, the raylet waits
    for none. ``ray.init`` takes no such options, so they are set on the parameters it builds, and the one port
    Ray 2.60 forgets to pass the raylet (the dashboard agent's) is added to its command line. In this process only."""
    from ray._private import parameter, ray_constants, services

    chosen: dict[str, int] = {}
    build, launch = parameter.RayParams.__init__, services.start_ray_process

    def build_with_ports(params, *args, **kwargs) -> None:
        build(params, *args, **kwargs)
        chosen.update({name: free_port() for name in AGENT_PORTS})
        for name, port in chosen.items():
            setattr(params, name, port)

    def launch_raylet_with_ports(command, process_type, *args, **kwargs):
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = [*command, f"--dashboard_agent_listen_port={chosen['dashboard_agent_listen_port']}"]
        return launch(command, process_type, *args, **kwargs)

    parameter.RayParams.__init__ = build_with_ports
    services.start_ray_process = launch_raylet_with_ports


def start_ray(ray, scratch: str) -> None:
    """``ray.init`` on this machine only, its agents on ports chosen here; a node that fails to start raises (the
    caller, ``start_ray_service``, starts the whole service again afresh)."""
    agents_on_ports_chosen_here()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _node_ip_address=LOOPBACK, _temp_dir=scratch,
             runtime_env={"worker_process_setup_hook": replicas_on_loopback})


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m helpers.serving.ray_service", description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-wait-ms", type=float, default=2.0)
    parser.add_argument("--scratch", help="folder for Ray's session files (default: a new one, removed on exit)")
    args = parser.parse_args()
    os.environ.update(SINGLE_MACHINE)  # before Ray reads it (also when this module is run by hand)
    os.environ.update(own_auth_token())

    import ray
    from ray import serve

    from helpers.serving.model import mnist_model

    _, info = mnist_model()
    # Ray's own processes (GCS, raylet, workers) on the loopback address only, and its session files in a folder of
    # this run's own that goes when the run does (Ray's default, /tmp/ray/session_*, would stay behind). A caller that
    # passes --scratch removes it itself, after this process and Ray's have all stopped (start_ray_service does).
    scratch = args.scratch or tempfile.mkdtemp(prefix="edl-ray-")  # short: Ray's unix sockets live below it
    try:
        try:
            start_ray(ray, scratch)
            serve.start(http_options={"host": LOOPBACK, "port": args.port})
            serve.run(build_app(info.path, args.batch_size, args.max_wait_ms), route_prefix="/predict")
        except BaseException:  # a node that failed to start is not stopped by ray.shutdown(): its processes are ours
            for leftover in psutil.Process().children():
                stop_tree(leftover.pid)
            raise
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        print(f"Ray Serve on http://{LOOPBACK}:{args.port}/predict", flush=True)
        stop.wait()
        serve.shutdown()
        ray.shutdown()
    finally:  # also when Ray fails to start
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)


RAY_LOGS_KEPT = ("raylet.out", "raylet.err", "gcs_server.out", "gcs_server.err", "dashboard_agent.log",
                 "runtime_env_agent.log", "python-core-driver-*.log")
# A line of Ray's C++ logs at level error, fatal or check failure: "[2026-11-29 16:16:37,983 E 29335 29335] ..."
SEVERE = re.compile(r"^\[[\d-]+ [\d:,]+ [EFC] \d+ \d+\]")


def keep_ray_logs(scratch: str, into: Path) -> str:
    """Copy the logs of Ray's session in ``scratch`` that tell why a node died into ``into``; what to read there.

    The raylet's and GCS's first errors are quoted (a node's end is logged long after what caused it), then the
    raylet's last lines and where the logs are kept."""
    logs = Path(scratch) / "session_latest" / "logs"
    found = [log for pattern in RAY_LOGS_KEPT for log in logs.glob(pattern)]
    if not found:
        return f"Ray left no session logs in {logs}"
    into.mkdir(parents=True, exist_ok=True)
    for log in found:
        shutil.copy(log, into)
    said = []
    for name in ("raylet.out", "gcs_server.out"):
        errors = [line for line in _lines(into / name) if SEVERE.match(line)][:4]
        if errors:
            said += [f"{name}'s first errors:", *errors]
    return "\n".join([*said, "raylet.out ends with:", *_lines(into / "raylet.out")[-6:],
                      f"Ray's session logs are kept in {into}"])


def _lines(log: Path) -> list[str]:
    return log.read_text(errors="replace").splitlines() if log.exists() else []


def start_ray_service(batch_size: int = 32, max_wait_ms: float = 2.0, startup_timeout: float = 420.0, attempts: int = 3):
    """Ray Serve with the model as a child process on a free port (a ServedProcess; ``.url`` + "/predict").

    A service that exits before it is healthy is started again, afresh (new port, new Ray session), up to
    ``attempts`` times; the logs of each failed Ray session are kept in ``build/serving/ray-<port>-logs/``."""
    import sys

    from helpers.core.paths import build_dir
    from helpers.core.procs import ServedProcess
    from helpers.serving.model import mnist_model

    mnist_model()
    for attempt in range(1, attempts + 1):
        port = free_port()
        scratch = tempfile.mkdtemp(prefix="edl-ray-")  # Ray's session files: removed once the whole tree has stopped
        command = [sys.executable, "-m", "helpers.serving.ray_service", "--port", str(port), "--batch-size", str(batch_size),
                   "--max-wait-ms", str(max_wait_ms), "--scratch", scratch]
        logs = build_dir("serving") / f"ray-{port}-logs"
        try:
            return ServedProcess(command, port, health_path="/-/healthz", log_path=build_dir("serving") / f"ray-{port}.log",
                                 env={"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}, startup_timeout=startup_timeout,
                                 owned_folders=[scratch], diagnose=functools.partial(keep_ray_logs, scratch, logs))
        except RuntimeError as err:  # it exited before it was healthy (not healthy in time raises TimeoutError)
            if attempt == attempts:
                raise
            print(f"Ray Serve exited while starting (attempt {attempt} of {attempts}); starting it again in "
                  f"{10 * attempt} s. {str(err).splitlines()[-1]}", flush=True)
            time.sleep(10 * attempt)  # what crowded the machine (another run's start-up, a load test) may pass meanwhile


if __name__ == "__main__":
    main()
