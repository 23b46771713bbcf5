"""helpers.training.syncs: host reads of tensors are counted where the user's code makes them, not inside torch."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from helpers.training.syncs import count_host_syncs


def test_every_kind_of_host_read_is_counted():
    x = torch.arange(4.0)
    with count_host_syncs() as syncs:
        x.sum().item()
        x.tolist()
        float(x[0])
        bool(x[1] > 0)
        f"{x.sum():.1f}"
        repr(x)
    assert syncs.counts == {"item": 1, "tolist": 1, "__float__": 1, "__bool__": 1, "__format__": 1, "__repr__": 1}
    assert syncs.total == 6


def test_a_loop_that_reads_the_loss_every_step_makes_one_read_per_step():
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.Adam(model.parameters())  # Adam reads its step counts inside torch: not counted
    data = DataLoader(TensorDataset(torch.randn(40, 8), torch.randint(0, 2, (40,))), batch_size=8)  # nor the loader's seed
    with count_host_syncs() as per_step:
        for x, y in data:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            loss.item()
    with count_host_syncs() as on_device:
        total = torch.zeros(())
        for x, y in data:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.detach()
    assert per_step.total == 5 and on_device.total == 0


def test_cpu_tensors_moved_to_the_cpu_are_not_host_reads():
    with count_host_syncs() as syncs:
        torch.ones(3).cpu()
        torch.ones(3).to("cpu")
    assert syncs.total == 0
