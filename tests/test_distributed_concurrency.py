"""helpers.distributed.concurrency: the GIL demo, shared memory between processes and loaders run and report what they claim."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from torch.utils.data import Dataset

from helpers.distributed.concurrency import dataloader_demo, gil_demo, shared_memory_demo, start_costs

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the work and the data set below run in worker processes


def python_work(iterations):
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


def torch_work(size, repeats):
    a = torch.randn(size, size)
    for _ in range(repeats):
        a = torch.tanh(a @ a / size)
    return float(a[0, 0])


class Numbered(Dataset):
    """Item i is a tensor of i's, made after some Python work; defined here, so the workers get it by value."""

    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        python_work(100)
        return torch.full((2,), float(index))


def test_shared_memory_passes_a_handle_and_the_child_writes_through():
    demo = shared_memory_demo(mib=4)
    copy, shared = demo.rows
    assert copy.pickled_bytes >= 4 * 2**20 and not copy.parent_sees_change
    assert shared.pickled_bytes < 4096 and shared.parent_sees_change


def test_gil_demo_runs_every_method_on_both_workloads_and_threads_do_not_speed_up_python():
    demo = gil_demo({"pure Python": (python_work, (200_000,)), "torch matmul": (torch_work, (32, 2))}, tasks=2)
    assert len(demo.rows) == 6 and all(0 < r.seconds <= r.slowest for r in demo.rows)
    threads = demo.find(work="pure Python", method="2 threads")
    assert threads.speedup < 1.5, demo  # the GIL lets one thread run Python at a time: two take about as long as one after another
    demo.plot()


def test_loaders_return_every_item():
    demo = dataloader_demo(Numbered(18), batch_size=4, workers=2)
    assert [r.loader.split(",")[0] for r in demo.rows] == ["DataLoader", "2 threads", "DataLoader"]
    assert all(r.items == 18 for r in demo.rows), demo  # counted in the batches, the last one short
    assert all(r.items_per_s == pytest.approx(r.items / r.seconds) for r in demo.rows)


def test_start_costs_list_threads_and_processes():
    costs = start_costs(include_spawn=False)
    assert costs.rows[0].what == "thread" and len(costs.rows) == 3 and all(r.seconds > 0 for r in costs.rows)
