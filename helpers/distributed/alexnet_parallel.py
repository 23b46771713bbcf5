"""AlexNet's two-GPU split (2012) run as model parallelism: one tower per process, or per GPU, checked against the whole network.

Each rank holds one tower of ``alexnet_2012(split=True)`` (loaded from the same whole network)
and the towers swap activations where the paper's GPUs did: before conv3, fc6, fc7 and fc8,
through ``helpers.distributed.tensor_parallel.exchange`` (an all-gather whose backward sums both towers'
gradients). Outputs and every weight's gradient are compared with the whole network's. Lecture 4 writes
``tower_forward`` in a cell and passes it in; the function here is the same text (tests/test_hardware_lecture_code.py).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from helpers.core.device import gpu_notice, pick_device
from helpers.core.fake import tensor_bytes
from helpers.core.models import ALEXNET_INPUT, AlexNet2012, alexnet_2012
from helpers.core.report import Report, column, format_bytes
from helpers.core.workers import launch
from helpers.distributed.tensor_parallel import communication_log, exchange, gather_from_parallel


def _whole(num_classes: int, seed: int = 0) -> AlexNet2012:
    torch.manual_seed(seed)
    return alexnet_2012(num_classes=num_classes).eval()  # eval: dropout off, so both sides compute the same function


def _batch(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, *ALEXNET_INPUT, generator=torch.Generator().manual_seed(seed))


def tower_forward(tower, x):
    """This rank's tower on the whole input; activations exchanged with the other tower where the paper's GPUs talked."""
    h = tower.upper(exchange(tower.lower(x), 1))  # before conv3: each tower's conv3 sees both towers' conv2 maps
    h = tower.fc6(exchange(torch.flatten(h, 1), 1))  # before fc6, fc7 and fc8: each fully connected half sees every input
    h = tower.fc7(exchange(h, 1))
    return gather_from_parallel(tower.fc8(exchange(h, 1)), 1)  # both ranks then hold all logits and compute the same loss


def _tower_worker(forward: Callable, batch: int, num_classes: int) -> dict:
    rank = dist.get_rank()
    whole = _whole(num_classes)
    tower = alexnet_2012(split=True, num_classes=num_classes).load_from(whole).towers[rank].eval()
    del whole
    x = _batch(batch)
    with communication_log() as log:
        logits = forward(tower, x)
        logits.pow(2).mean().backward()
    return dict(logits=logits.detach(), grads={n: p.grad for n, p in tower.named_parameters()}, tower_bytes=sum(map(tensor_bytes, tower.parameters())),
                forward=log.describe("forward"), backward=log.describe("backward"),
                exchanged=sum(n for _, n in log.of("forward")) + sum(n for _, n in log.of("backward")))


@dataclass
class TowerRow:
    where: str = column("where")
    rank: int = column("tower")
    parameters: int = column("weights held", format_bytes)
    share_of_whole: float = column("of the whole", ".1%")
    max_output_difference: float = column("max |logits - whole|", ".1e")
    same_gradients: bool = column("same gradients")
    forward: str = column("forward: exchanges")
    backward: str = column("backward: exchanges")


class AlexNetParallel(Report):
    """Each tower on its own process (or GPU): weights held, output and gradients against the whole network, traffic."""

    def __init__(self, rows: list[TowerRow], notes: list[str], batch: int):
        self.title = f"AlexNet (2012) as two towers on two processes, batch {batch}, against the whole network"
        super().__init__(rows, notes)


def _gradients_as_split(whole: AlexNet2012, num_classes: int) -> nn.Module:
    """The whole network's gradients, cut the way ``load_from`` cuts its weights: tower i's share of every layer's gradient."""
    grads = copy.deepcopy(whole)
    with torch.no_grad():
        for g, p in zip(grads.parameters(), whole.parameters()):
            g.copy_(p.grad)
    return alexnet_2012(split=True, num_classes=num_classes).load_from(grads)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-3, atol=1e-6)


def alexnet_model_parallel(forward: Callable = tower_forward, batch: int = 2, num_classes: int = 1000, device: str | torch.device | None = None,
                           timeout: float = 180) -> AlexNetParallel:
    """Run AlexNet's towers on two gloo processes (and on two GPUs when there are two), checked against the whole network.

    ``forward(tower, x)`` runs one rank's tower (the lecture passes its cell's ``tower_forward``). The loss is
    the mean of the squared logits, the same on both ranks; every tower weight's gradient is compared with the
    matching slice of the whole network's gradient.
    """
    per_rank = launch(_tower_worker, 2, args=(forward, batch, num_classes), timeout=timeout, echo=False, threads=1)
    whole = _whole(num_classes)
    x = _batch(batch)
    expected = whole(x)
    expected.pow(2).mean().backward()
    grad_towers = _gradients_as_split(whole, num_classes).towers
    whole_bytes = sum(map(tensor_bytes, whole.parameters()))
    rows = []
    for rank, r in enumerate(per_rank):
        reference = dict(grad_towers[rank].named_parameters())
        same = all(_close(g, reference[n]) for n, g in r["grads"].items())
        rows.append(TowerRow("process (gloo)", rank, r["tower_bytes"], r["tower_bytes"] / whole_bytes,
                             (r["logits"] - expected.detach()).abs().max().item(), same, r["forward"], r["backward"]))
    if torch.cuda.device_count() >= 2:
        rows += towers_on_two_devices(whole, x, ("cuda:0", "cuda:1"))
    elif gpu_notice("the towers on two GPUs", pick_device(device)) is None:
        print(f"One GPU here ({torch.cuda.get_device_name()}): the towers on two GPUs need two, so only the processes ran.")
    notes = [f"Whole network: {format_bytes(whole_bytes)} of weights; each tower holds half of every layer, and with it half of "
             "the layer's gradients, momentum and (mostly) activations: what let each of the paper's cards hold its share.",
             f"Activations exchanged per step and rank: {format_bytes(per_rank[0]['exchanged'])} (full messages, forward and backward) "
             f"at batch {batch}; the weights never move. The backward exchanges are reduce-scatters: each tower's input slice "
             "feeds both towers, so its gradient is the sum of both."]
    return AlexNetParallel(rows, notes, batch)


def towers_on_two_devices(whole: AlexNet2012, x: torch.Tensor, devices: tuple[str, str]) -> list[TowerRow]:
    """Both towers in this process, one per device (``place``), as in the paper's two GPUs: output against the whole network."""
    split = alexnet_2012(split=True, num_classes=whole.classifier.fc8.out_features).load_from(whole).place(*devices).eval()
    with torch.no_grad():
        logits = split(x.to(devices[0])).cpu()
        expected = whole(x)
    whole_bytes = sum(map(tensor_bytes, whole.parameters()))
    tower_bytes = [sum(map(tensor_bytes, t.parameters())) for t in split.towers]
    return [TowerRow(device, i, tower_bytes[i], tower_bytes[i] / whole_bytes, (logits - expected).abs().max().item(),
                     None, "copies between the devices", "n/a (forward only)") for i, device in enumerate(devices)]
