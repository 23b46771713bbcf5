"""The training script behind the elastic-training demo: checkpoints every k steps, resumes from the last one.

torchrun starts it on every worker (``helpers.distributed.elastic`` builds the command):

    torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=1 --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:29400 \\
        -m helpers.distributed.elastic_train --run-dir build/elastic/run --steps 40 --checkpoint-every 5

Whatever attempt it is (torchrun sets TORCHELASTIC_RESTART_COUNT), a worker loads the run's checkpoint if there
is one and goes on from the step stored in it. Everything a step does is decided by the step number (the batch
is a slice of a permutation seeded by the epoch), so a resumed run computes exactly what an uninterrupted one
does. Rank 0 writes the checkpoint atomically (a temporary file, then a rename), so a worker killed mid-write
leaves the previous checkpoint intact. ``--kill-at-step S --kill-rank R`` makes rank R SIGKILL itself before
step S on the first attempt only: the failure the demo recovers from. Each worker appends its events (start,
steps, checkpoints, the kill, the end) as JSON lines to ``<run-dir>/events/attempt<A>-rank<R>.jsonl``.

Lecture 3b writes ``tiny_model``, ``batch_indices``, ``save_atomically`` and ``train`` in a cell and runs them there;
torchrun needs a file, so they are here too, the same text (tests/test_hardware_lecture_code.py keeps the two
identical: edit the cell, then copy it here). ``main`` is what torchrun calls: it joins the group and calls ``train``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from helpers.core.procs import die_with_parent
from helpers.core.workers import loopback_store

CHECKPOINT = "checkpoint.pt"
FINAL = "final.pt"
DATA = "data.pt"


def attempt_number() -> int:
    """Which attempt this is: 0 the first time, 1 after torchrun's first restart, and so on."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def tiny_model(hidden=32):
    """784 -> `hidden` -> 10: small enough that the demo's time goes to starting processes, not to training."""
    return nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def batch_indices(step, batch_size, world_size, rank, samples, seed):
    """The sample indices rank `rank` trains on at `step`: a function of the step alone, so a resumed run replays it."""
    global_batch = batch_size * world_size
    per_epoch = samples // global_batch
    if per_epoch == 0:
        raise ValueError(f"{samples} samples do not fill one global batch of {global_batch}: use fewer ranks or a smaller batch.")
    epoch, within = divmod(step, per_epoch)
    order = torch.randperm(samples, generator=torch.Generator().manual_seed(seed + epoch))  # the epoch's order, the same on every rank
    start = within * global_batch + rank * batch_size
    return order[start:start + batch_size]


def agent_alive() -> bool:
    """True while this worker's parent is a torchrun agent (a worker whose agent died has been handed to another parent)."""
    try:
        command = " ".join(psutil.Process(os.getppid()).cmdline())
    except psutil.Error:
        return False
    return "torch.distributed.run" in command or "torchrun" in command


def join_group(attempt: int, timeout_s: float = 60.0) -> None:
    """Join the gloo group torchrun describes in the environment, in a part of the store private to this attempt.

    torchrun's agent keeps one key-value store for the whole job (TORCHELASTIC_USE_AGENT_STORE) and hands every
    attempt the same address. Gloo publishes each rank's address in that store; a restarted worker that read
    the dead attempt's entry would wait for a peer that is gone. Prefixing every key with the attempt number
    keeps the attempts apart (all workers of one node share the restart count).
    """
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":  # this rank hosts it: on 127.0.0.1 only
        store = loopback_store(timeout_s, port)
    else:
        store = dist.TCPStore(address, port, world, False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def save_atomically(state, path):
    """torch.save to a temporary file next to `path`, flushed to disk, then renamed over it: never half a file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())  # on the disk, not only in the page cache, before the rename makes it the checkpoint
    os.replace(temporary, path)  # one step: whoever opens `path` finds the old file or the new one, whole


class EventLog:
    """JSON lines for one (attempt, rank), flushed line by line so that a SIGKILL loses nothing already written."""

    def __init__(self, run_dir: Path, attempt: int, rank: int):
        folder = run_dir / "events"
        folder.mkdir(parents=True, exist_ok=True)
        self.attempt, self.rank = attempt, rank
        self.handle = open(folder / f"attempt{attempt}-rank{rank}.jsonl", "a", buffering=1)

    def write(self, event: str, **fields) -> None:
        record = {"event": event, "attempt": self.attempt, "rank": self.rank, "time": time.time(), **fields}
        self.handle.write(json.dumps(record) + "\n")
        self.handle.flush()


def load_data(run_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """The images (float, N x 1 x 28 x 28) and labels the launcher saved in ``run_dir``, the same for every attempt."""
    path = run_dir / DATA
    if not path.exists():
        raise SystemExit(f"{path} is missing: the launcher (helpers.distributed.elastic) writes the training data there first.")
    data = torch.load(path)
    return data["inputs"], data["labels"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="torchrun ... -m helpers.distributed.elastic_train", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="holds data.pt; gets the checkpoint, the events and final.pt")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-at-step", type=int, default=None, help="on the first attempt, rank --kill-rank SIGKILLs itself before this step")
    parser.add_argument("--kill-rank", type=int, default=1)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.checkpoint_every < 1 or args.batch_size < 1:
        parser.error("--steps, --checkpoint-every and --batch-size must be positive")
    if args.kill_at_step is not None and not 0 <= args.kill_at_step < args.steps:
        parser.error(f"--kill-at-step {args.kill_at_step} is outside the run's steps 0..{args.steps - 1}")
    return args


def train(run_dir, steps, checkpoint_every=5, batch_size=32, lr=0.05, seed=0, kill_at_step=None, kill_rank=1, attempt=0):
    """Train in the process group this worker has joined, from the run's checkpoint if there is one; the final loss."""
    run_dir = Path(run_dir)
    torch.set_num_threads(1)  # one thread: the same arithmetic, in the same order, in every run
    rank, world = dist.get_rank(), dist.get_world_size()
    log = EventLog(run_dir, attempt, rank)
    inputs, labels = load_data(run_dir)

    torch.manual_seed(seed)
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    checkpoint_path = run_dir / CHECKPOINT
    start, loaded = 0, None
    if checkpoint_path.exists():  # a restarted attempt: everything it needs is in the checkpoint
        state = torch.load(checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])  # the momentum buffers too
        start = loaded = state["next_step"]
    log.write("start", from_step=start, checkpoint=loaded, world_size=world, pid=os.getpid())
    if rank == 0:
        print(f"attempt {attempt}: {world} workers start at step {start}" + (f" (checkpoint of step {loaded})" if loaded is not None else " (no checkpoint)"), flush=True)
    ddp = DistributedDataParallel(model)
    loss_fn = nn.CrossEntropyLoss()

    loss = torch.zeros(())
    for step in range(start, steps):
        if attempt == 0 and step == kill_at_step and rank == kill_rank:  # the failure, on the first attempt only
            log.write("killed", step=step)
            os.kill(os.getpid(), signal.SIGKILL)
        rows = batch_indices(step, batch_size, world, rank, len(labels), seed)
        optimizer.zero_grad()
        local = loss_fn(ddp(inputs[rows]), labels[rows])
        local.backward()
        optimizer.step()
        loss = local.detach().clone()
        dist.all_reduce(loss)
        loss /= world
        log.write("step", step=step, loss=loss.item())
        if (step + 1) % checkpoint_every == 0 and rank == 0:  # weights, optimizer state and the step to run next
            save_atomically({"next_step": step + 1, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_path)
            log.write("checkpoint", step=step + 1)
    if rank == 0:
        save_atomically({name: t.clone() for name, t in model.state_dict().items()}, run_dir / FINAL)
        print(f"attempt {attempt}: finished {steps} steps, loss {loss.item():.4f}", flush=True)
    log.write("done", loss=loss.item())
    return loss.item()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "RANK" not in os.environ:
        sys.exit("run me under torchrun (see `python -m helpers.distributed.elastic_train --help` and helpers.distributed.elastic)")
    die_with_parent()  # if the torchrun agent dies, so do we
    if not agent_alive():  # ... and if it died before we asked, we go now
        sys.exit("the torchrun agent that started this worker is gone; nothing to do")
    attempt = attempt_number()
    join_group(attempt)
    train(args.run_dir, args.steps, args.checkpoint_every, args.batch_size, args.lr, args.seed, args.kill_at_step, args.kill_rank, attempt)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
