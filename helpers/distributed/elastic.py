"""Elastic training under torchrun: a worker killed mid-run, the group restarted, training resumed from its checkpoint.

``elastic_demo()`` runs one small training job (``helpers.distributed.elastic_train``, 2 workers, gloo on the CPU)
twice under real ``torchrun`` with a c10d rendezvous on 127.0.0.1 at a free port: once uninterrupted, and once
with a worker that SIGKILLs itself on the first attempt. torchrun notices the dead worker, stops the other one,
rendezvouses again and restarts both; they resume from the last checkpoint. The report reads everything from
the workers' event logs and compares the two runs' final weights tensor by tensor.

No process outlives a run: torchrun starts in its own session and dies with the caller (``helpers.core.procs``),
each worker dies with torchrun, and when a run ends (finished, failed, timed out or interrupted) whatever is
still running with the run's folder on its command line is stopped.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import psutil
import torch

from helpers.core import plots
from helpers.core.data import Digits, normalise
from helpers.core.paths import build_dir
from helpers.core.procs import LOOPBACK, free_port, start_process, stop_tree
from helpers.core.report import Report, column, format_seconds
from helpers.core.workers import launch, loopback_interface, loopback_store
from helpers.distributed import elastic_train
from helpers.distributed.elastic_train import DATA, FINAL

SCRIPT = "helpers.distributed.elastic_train"
STORE_IS_OURS = "--rdzv-conf=is_host=false"  # torchrun joins the rendezvous store as a client (run_elastic serves it)


# ---------------------------------------------------------------- running torchrun


def torchrun_command(script_args: Sequence[str], *, nproc: int = 2, max_restarts: int = 1, port: int | None = None,
                     run_id: str = "edl-elastic", monitor_interval: float = 0.1, store_is_ours: bool = False) -> list[str]:
    """The torchrun command line: one node, ``nproc`` workers, ``max_restarts`` restarts, c10d rendezvous on 127.0.0.1.

    ``store_is_ours``: the caller already serves the rendezvous store at ``port`` (``run_elastic`` does, on the
    loopback address only: torchrun's own store would listen on every interface); torchrun joins it as a client.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc={nproc!r}: torchrun needs at least one worker per node (a positive integer).")
    if not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts!r}: give 0 (fail on the first worker failure) or a positive number of restarts.")
    if monitor_interval <= 0:
        raise ValueError(f"monitor_interval={monitor_interval!r}: torchrun checks its workers every so many seconds, a positive number.")
    port = free_port() if port is None else port
    ours = [STORE_IS_OURS] if store_is_ours else []
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc-per-node={nproc}",
            f"--max-restarts={max_restarts}", "--rdzv-backend=c10d", f"--rdzv-endpoint={LOOPBACK}:{port}", *ours,
            f"--local-addr={LOOPBACK}", f"--rdzv-id={run_id}", f"--monitor-interval={monitor_interval:g}", "-m", SCRIPT, *script_args]


def _environment() -> dict[str, str]:
    """This interpreter's folder first on PATH, one thread per worker, the agent's restarts in its log, loopback only.

    TORCH_DISABLE_SHARE_RDZV_TCP_STORE: the agent then hosts no store of its own for the workers (it would listen on
    every interface); rank 0 hosts the group's store, on the loopback address (elastic_train.join_group).
    """
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "OMP_NUM_THREADS": "1", "LOGLEVEL": "INFO", "PYTHONUNBUFFERED": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    if "GLOO_SOCKET_IFNAME" not in os.environ and (loopback := loopback_interface()):
        env["GLOO_SOCKET_IFNAME"] = loopback
    return env


def processes_of(run_dir: Path) -> list[psutil.Process]:
    """Running processes with ``run_dir`` (or a path inside it) as an argument: the workers of that run, and its torchrun."""
    marker = str(Path(run_dir).resolve())
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and any(part == marker or part.startswith(marker + os.sep) for part in proc.info["cmdline"] or ()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def stop_leftovers(run_dir: Path) -> int:
    """Stop every process still running for ``run_dir`` (and its children); how many there were."""
    leftovers = processes_of(run_dir)
    for proc in leftovers:
        stop_tree(proc.pid, grace=2.0)
    return len(leftovers)


@dataclass
class ElasticRun:
    """One torchrun job: its folder, exit code, wall time, the workers' events and the agent's log."""

    name: str
    run_dir: Path
    returncode: int
    seconds: float
    events: list[dict]
    log: str
    command: list[str]

    def shell_command(self) -> str:
        """The torchrun command as one would type it (``python`` for this interpreter's full path; typed by hand,
        torchrun hosts the rendezvous store itself, so the flag that made it a client of ``run_elastic``'s goes)."""
        return " ".join("python" if part == sys.executable else part for part in self.command if part != STORE_IS_OURS)

    def attempts(self) -> list[int]:
        return sorted({e["attempt"] for e in self.events})

    def of(self, attempt: int, event: str | None = None) -> list[dict]:
        return [e for e in self.events if e["attempt"] == attempt and (event is None or e["event"] == event)]

    def losses(self) -> dict[int, float]:
        """Loss per step as the run finally computed it (a redone step keeps its last value)."""
        return {e["step"]: e["loss"] for e in sorted(self.events, key=lambda e: (e["attempt"], e["time"])) if e["event"] == "step" and e["rank"] == 0}

    def final_weights(self) -> dict[str, torch.Tensor] | None:
        path = self.run_dir / FINAL
        return torch.load(path) if path.exists() else None

    def agent_lines(self, words: Sequence[str] = ("attempts left", "restart", "Rendezvous complete", "FAILED", "exitcode", "closing signal")) -> list[str]:
        """The messages of torchrun's own log that tell the failure and restart story, without their
        level/time/source prefix ("I1124 08:37:57.021000 15079 torch/.../api.py:553]"); workers' lines left out."""
        return [line.split("] ", 1)[-1].strip() for line in self.log.splitlines()
                if any(w in line for w in words) and not line.lstrip().startswith("[rank")]


def _read_events(run_dir: Path) -> list[dict]:
    events = []
    for path in sorted((run_dir / "events").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                events.append(json.loads(line))
    return sorted(events, key=lambda e: e["time"])


def run_elastic(name: str, run_dir: str | Path, digits: Digits, *, steps: int = 40,
                checkpoint_every: int = 5, kill_at_step: int | None = None, kill_rank: int = 1, nproc: int = 2,
                max_restarts: int = 1, batch_size: int = 32, seed: int = 0, timeout: float = 180.0) -> ElasticRun:
    """Run the training script under torchrun in a fresh ``run_dir``; return its events, log and exit code.

    Raises TimeoutError (after stopping everything) when the job has not ended within ``timeout`` seconds.
    A failed job is returned, not raised: its ``returncode`` and ``log`` say what happened.
    """
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps={steps!r}: train for at least one step.")
    if not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise ValueError(f"checkpoint_every={checkpoint_every!r}: checkpoint every k >= 1 steps.")
    if kill_at_step is not None and not 0 <= kill_at_step < steps:
        raise ValueError(f"kill_at_step={kill_at_step}: the run has steps 0..{steps - 1}; pick one of them, or None for no failure.")
    if kill_at_step is not None and not 0 <= kill_rank < nproc:
        raise ValueError(f"kill_rank={kill_rank}: the run has ranks 0..{nproc - 1}.")
    if timeout <= 0:
        raise ValueError(f"timeout={timeout!r}: give the job a positive number of seconds.")
    if len(digits.labels) < batch_size * nproc:
        raise ValueError(f"{len(digits.labels)} digits do not fill one global batch ({batch_size} per rank x {nproc} ranks): use more digits or a smaller batch.")
    run_dir = _fresh_run_dir(run_dir, digits)
    script_args = ["--run-dir", str(run_dir), "--steps", str(steps), "--checkpoint-every", str(checkpoint_every),
                   "--batch-size", str(batch_size), "--seed", str(seed)]
    if kill_at_step is not None:
        script_args += ["--kill-at-step", str(kill_at_step), "--kill-rank", str(kill_rank)]
    rendezvous = loopback_store(timeout)  # served from here for the whole job, restarts included
    command = torchrun_command(script_args, nproc=nproc, max_restarts=max_restarts, port=rendezvous.port,
                               run_id=f"edl-{uuid.uuid4().hex[:8]}", store_is_ours=True)
    log_path = run_dir / "torchrun.log"
    start = time.perf_counter()
    process = start_process(command, log_path=log_path, env=_environment(), cwd=run_dir)
    try:
        returncode = process.wait(timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"the torchrun job {name!r} had not ended after {timeout:g} s; it and its workers were stopped. "
                           f"Its log ({log_path}) ends with:\n" + "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])) from None
    finally:
        stop_tree(process.pid, grace=2.0)  # also on Ctrl-C: torchrun and the workers it still has
        stop_leftovers(run_dir)  # workers torchrun lost track of, whoever their parent is now
        time.sleep(0.3)
        stop_leftovers(run_dir)  # and one torchrun was starting as it was stopped
        process.poll()
        del rendezvous
    return ElasticRun(name, run_dir, returncode, time.perf_counter() - start, _read_events(run_dir),
                      log_path.read_text(errors="replace"), command)


def _fresh_run_dir(run_dir: str | Path, digits: Digits) -> Path:
    """An empty ``run_dir`` (a stale checkpoint would make a fresh run resume) holding the training data."""
    run_dir = Path(run_dir).resolve()
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    torch.save({"inputs": normalise(digits.images).unsqueeze(1), "labels": digits.labels}, run_dir / DATA)
    return run_dir


def run_launched(name: str, run_dir: str | Path, digits: Digits, *, steps: int = 40, checkpoint_every: int = 5, nproc: int = 2,
                 batch_size: int = 32, seed: int = 0, timeout: float = 180.0, train: Callable | None = None) -> ElasticRun:
    """The same training, uninterrupted, on workers from the kit's launcher (``launch``): no torchrun, no restarts.

    ``launch`` forks its workers from a process that has already imported torch, where torchrun starts fresh
    interpreters, so the reference costs less start-up; the seed is the same, and the training function is
    ``train`` (Lecture 3b passes its cell's), by default the script's own ``elastic_train.train``.
    """
    if len(digits.labels) < batch_size * nproc:
        raise ValueError(f"{len(digits.labels)} digits do not fill one global batch ({batch_size} per rank x {nproc} ranks): use more digits or a smaller batch.")
    run_dir = _fresh_run_dir(run_dir, digits)
    start = time.perf_counter()
    launch(train or elastic_train.train, nproc, kwargs=dict(run_dir=str(run_dir), steps=steps, checkpoint_every=checkpoint_every, batch_size=batch_size, seed=seed),
           backend="gloo", timeout=timeout, echo=False)
    return ElasticRun(name, run_dir, 0, time.perf_counter() - start, _read_events(run_dir), "",
                      [f"helpers.core.workers.launch({getattr(train, '__qualname__', 'helpers.distributed.elastic_train.train')}, {nproc})"])


# ---------------------------------------------------------------- the demo and its report


@dataclass
class AttemptRow:
    run: str = column("run")
    attempt: int = column("attempt")
    workers: int = column("workers")
    checkpoint: str = column("checkpoint loaded")
    first_step: int = column("from step")
    last_step: int = column("to step")
    steps_run: int = column("steps run")
    steps_redone: int = column("steps redone")
    ended: str = column("ended")


class ElasticReport(Report):
    """One row per torchrun attempt of each run; the two runs' final weights and losses compared."""

    title = "Elastic training: the same job uninterrupted, and with a worker killed on the first attempt"

    def __init__(self, runs: Sequence[ElasticRun], kill_at_step: int, kill_rank: int, checkpoint_every: int, data: str):
        self.runs = {run.name: run for run in runs}
        self.reference, self.interrupted = runs
        rows = [row for run in runs for row in _attempt_rows(run)]
        self.restarts = len(self.interrupted.attempts()) - 1
        self.steps_redone = sum(r.steps_redone for r in rows)
        self.resumed_from = [r.first_step for r in rows if r.run == self.interrupted.name and r.attempt > 0]
        expected, got = self.reference.final_weights(), self.interrupted.final_weights()
        if expected is None or got is None:
            self.weights_equal, self.max_abs_difference = False, None
        else:
            self.weights_equal = expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
            self.max_abs_difference = max((expected[k] - got[k]).abs().max().item() for k in expected) if expected.keys() == got.keys() else None
        reference_losses, interrupted_losses = self.reference.losses(), self.interrupted.losses()
        self.final_losses = {run.name: (run.losses()[max(run.losses())] if run.losses() else None) for run in runs}
        self.losses_equal = bool(reference_losses) and reference_losses == interrupted_losses
        times = sorted(e["time"] for e in self.reference.events if e["event"] == "step" and e["rank"] == 0)
        self.seconds_per_step = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        kills = [e["time"] for e in self.interrupted.events if e["event"] == "killed"]
        restarts = [e["time"] for e in self.interrupted.events if e["event"] == "start" and e["attempt"] > 0]
        # from the kill to the first worker of the next attempt back at work: detection, teardown, rendezvous, start-up, loading
        self.recovery_seconds = min(restarts) - min(kills) if kills and restarts else None
        notes = [f"data: {data}; {checkpoint_every}-step checkpoints; rank {kill_rank} SIGKILLs itself before step {kill_at_step} on attempt 0.",
                 "exit codes: " + ", ".join(f"{run.name} {run.returncode} ({format_seconds(run.seconds)})" for run in runs) + "."]
        super().__init__(rows, notes)

    def plot(self, ax=None):
        series = {self.reference.name: _curve(self.reference.losses())}
        for attempt in self.interrupted.attempts():
            steps = {e["step"]: e["loss"] for e in self.interrupted.of(attempt, "step") if e["rank"] == 0}
            series[f"{self.interrupted.name}, attempt {attempt}"] = _curve(steps)
        title = "Loss per step: the resumed run retraces the uninterrupted one" if self.losses_equal else "Loss per step: resumed against uninterrupted"
        ax = plots.line_chart(series, ax, title=title, xlabel="step", ylabel="training loss (mean of the ranks)")
        ax.lines[0].set(linewidth=7, alpha=0.3, marker="")  # the reference as a wide band under the attempts
        ax.legend()
        for step in self.resumed_from:
            plots.vertical_line(ax, step, f"resumed at step {step}")
        return ax


def _curve(losses: dict[int, float]) -> tuple[list[int], list[float]]:
    steps = sorted(losses)
    return steps, [losses[s] for s in steps]


def _attempt_rows(run: ElasticRun) -> list[AttemptRow]:
    rows = []
    for attempt in run.attempts():
        starts = run.of(attempt, "start")
        steps = sorted({e["step"] for e in run.of(attempt, "step")})
        later = [min(e["from_step"] for e in run.of(a, "start")) for a in run.attempts() if a > attempt and run.of(a, "start")]
        redone = len([s for s in steps if later and s >= later[0]])
        kills = run.of(attempt, "killed")
        if kills:
            ended = f"rank {kills[0]['rank']} killed itself (SIGKILL) before step {kills[0]['step']}"
        elif len(run.of(attempt, "done")) == len(starts) and starts:
            ended = "finished"
        else:
            ended = "stopped by torchrun" if later else f"failed (torchrun exit code {run.returncode})"
        loaded = {e["checkpoint"] for e in starts}
        checkpoint = "none" if loaded == {None} else ", ".join(f"step {c}" for c in sorted(c for c in loaded if c is not None))
        rows.append(AttemptRow(run.name, attempt, len(starts), checkpoint, min(e["from_step"] for e in starts) if starts else -1,
                               steps[-1] if steps else -1, len(steps), redone, ended))
    return rows


def elastic_demo(digits: Digits, *, steps: int = 40, checkpoint_every: int = 5, kill_at_step: int = 17, kill_rank: int = 1,
                 max_restarts: int = 1, batch_size: int = 32, seed: int = 0, folder: str | Path | None = None,
                 reference: str = "launch", timeout: float = 180.0, train: Callable | None = None) -> ElasticReport:
    """The same 2-worker job twice: uninterrupted, then under torchrun with rank ``kill_rank`` killed before ``kill_at_step``.

    ``reference="launch"`` runs the uninterrupted job on the kit's launcher (quick to start), with ``train``
    (Lecture 3b's cell) where given; ``"torchrun"`` runs it under torchrun as well. torchrun always runs the
    script's file, ``helpers.distributed.elastic_train``, which a test keeps identical to the lecture's cell.
    """
    if reference not in ("launch", "torchrun"):
        raise ValueError(f"reference={reference!r}: run the uninterrupted job on 'launch' or on 'torchrun'.")
    if kill_at_step is None:
        raise ValueError("kill_at_step=None: the demo needs a failure to recover from; use run_elastic() for a plain run.")
    folder = Path(folder) if folder is not None else build_dir("elastic")
    common = dict(steps=steps, checkpoint_every=checkpoint_every, batch_size=batch_size, seed=seed, timeout=timeout)
    if reference == "torchrun":
        reference_run = run_elastic("uninterrupted", folder / "uninterrupted", digits, max_restarts=max_restarts, **common)
    else:
        reference_run = run_launched("uninterrupted", folder / "uninterrupted", digits, train=train, **common)
    interrupted = run_elastic("killed once", folder / "killed-once", digits, kill_at_step=kill_at_step, kill_rank=kill_rank,
                              max_restarts=max_restarts, **common)
    return ElasticReport([reference_run, interrupted], kill_at_step, kill_rank, checkpoint_every, digits.description)
