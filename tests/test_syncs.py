"""helpers.training.syncs: host reads of tensors are counted where they happen, whoever makes them."""
from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F

from helpers.training.syncs import count_host_syncs


def test_every_kind_of_host_read_is_counted_once():
    x = torch.arange(4.0)
    with count_host_syncs() as syncs:
        x.sum().item()
        x.tolist()
        float(x[0])
        bool(x[1] > 0)
        f"{x.sum():.1f}"
        repr(x)
        x.numpy()
    assert syncs.counts == {"_local_scalar_dense": 4, "tolist": 1, "__repr__": 1, "numpy": 1}
    assert syncs.total == 7


def _loop(read, steps=5):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(steps * 8, 8), torch.randint(0, 2, (steps * 8,))
    total = torch.zeros(())
    for start in range(0, len(x), 8):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[start:start + 8]), y[start:start + 8])
        loss.backward()
        optimizer.step()
        read(loss, total)


def test_a_loop_that_reads_the_loss_every_step_makes_one_read_per_step():
    with count_host_syncs() as per_step:
        _loop(lambda loss, total: loss.item())
    with count_host_syncs() as on_device:
        _loop(lambda loss, total: total.add_(loss.detach()))
    assert per_step.total == 5 and on_device.total == 0


@pytest.mark.parametrize("module_name", ["torch", "torch.optim.sgd", "torch._tensor"])
def test_a_read_from_code_that_claims_to_be_torch_is_still_counted(module_name):
    """The counter sees the op, not the caller's name: a module named like torch's gains nothing."""
    disguised = types.ModuleType(module_name)
    exec("def read(loss, total):\n    loss.item()\n    loss.detach().tolist()", disguised.__dict__)
    with count_host_syncs() as syncs:
        _loop(disguised.read)
    assert syncs.counts == {"_local_scalar_dense": 5, "tolist": 5}


def test_torchs_own_reads_count_too():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters())  # on a CPU, Adam reads its step counters with .item()
    model(torch.randn(2, 4)).sum().backward()
    with count_host_syncs() as syncs:
        optimizer.step()
    assert syncs.total >= 1


def test_reads_on_other_threads_count_too_even_from_a_pool_started_before_the_counter():
    import concurrent.futures
    pool = concurrent.futures.ThreadPoolExecutor(2)
    pool.submit(lambda: None).result()  # its thread exists before the counter opens
    x = torch.arange(3.0)
    with count_host_syncs() as syncs:
        pool.submit(lambda: x.sum().item()).result()
        pool.submit(lambda: x.tolist()).result()
        with torch.inference_mode():
            pool.submit(lambda: float(x[0])).result()
    pool.shutdown()
    assert syncs.counts == {"_local_scalar_dense": 2, "tolist": 1}


def test_counters_nest_and_leave_torch_as_they_found_it():
    methods = {name: torch.Tensor.__dict__.get(name) for name in ("tolist", "numpy", "__array__", "__repr__")}
    x = torch.ones(2)
    with count_host_syncs() as outer:
        x.sum().item()
        with count_host_syncs() as inner:
            x.tolist()
        x.sum().item()
    assert outer.counts == {"_local_scalar_dense": 2, "tolist": 1} and inner.counts == {"tolist": 1}
    assert {name: torch.Tensor.__dict__.get(name) for name in methods} == methods
    with count_host_syncs() as after:
        pass
    x.sum().item()
    assert after.total == 0 and x.sum().item() == 2.0


def test_cpu_tensors_moved_to_the_cpu_are_not_host_reads():
    with count_host_syncs() as syncs:
        torch.ones(3).cpu()
        torch.ones(3).to("cpu")
        torch.ones(3).clone().copy_(torch.zeros(3))
    assert syncs.total == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="copies from a GPU need one; the CPU reads are tested above")
def test_copies_from_the_gpu_are_host_reads():
    x = torch.arange(4.0, device="cuda")
    with count_host_syncs() as syncs:
        x.cpu()
        x.tolist()
        x.sum().item()
    assert syncs.counts["_to_copy"] == 1 and syncs.counts["tolist"] == 1 and syncs.counts["_local_scalar_dense"] == 1
